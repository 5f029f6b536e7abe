//! Helpers of the programs' tests: a server whose app and actor class
//! `runner` are the runner guest (actor NAME at /r/NAME/…), images pushed
//! through its admin address, and plain calls.

use std::path::Path;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use super::{Resp, Weir, guest, send_to};

/// `weir serve runner.wasm --actor runner=runner.wasm --actor-route
/// runner=/r` on `data`, with `limits` (`NAME=VALUE`).
pub fn serve_runner(data: &Path, limits: &[&str]) -> Weir {
    let runner = guest("runner");
    let actor = format!("runner={}", runner.display());
    let mut args = vec![
        "--data-dir",
        data.to_str().unwrap(),
        "--actor",
        &actor,
        "--actor-route",
        "runner=/r",
    ];
    for limit in limits {
        args.extend(["--limit", limit]);
    }
    Weir::start(&runner, &args)
}

/// Pushes `component` through the admin address; its digest.
pub async fn push_image(weir: &Weir, component: &Path) -> String {
    let addr = weir.admin.unwrap();
    let req = Request::put("/images")
        .header("host", addr.to_string())
        .header(
            "authorization",
            format!("Bearer {}", weir.token.as_ref().unwrap()),
        )
        .body(Full::new(Bytes::from(std::fs::read(component).unwrap())))
        .unwrap();
    send_to(addr, req).await.json()["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

/// One request with `body` to the server's listen address.
pub async fn call(weir: &Weir, method: &str, path: &str, body: &[u8]) -> Resp {
    weir.send(
        Request::builder()
            .method(method)
            .uri(path)
            .body(Full::new(Bytes::copy_from_slice(body)))
            .unwrap(),
    )
    .await
}
