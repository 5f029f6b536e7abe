//! Helpers of the hostile-guest tests: a server with the `hostile` guest
//! as the app and as an actor class, and the calls that drive it.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::{Value, json};

use super::*;

pub fn data_dir(name: &str) -> PathBuf {
    weir_scratch::dir(&format!("hostile-{name}"))
}

/// The hostile guest as the app and as actor class `hostile` (route `/h`),
/// next to the `probe` class (route `/p`): the victim.
pub fn start(dir: &Path, extra: &[&str]) -> Weir {
    start_with_env(dir, extra, &[])
}

/// [`start`], with more environment variables for the server.
pub fn start_with_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Weir {
    let hostile = guest("hostile");
    let probe = format!("probe={}", guest("actor_probe").display());
    let hostile_class = format!("hostile={}", hostile.display());
    let mut args = vec![
        hostile.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
        "--sql-database",
        "app",
        "--kv-store",
        "main",
        "--actor",
        &probe,
        "--actor",
        &hostile_class,
        "--actor-route",
        "probe=/p",
        "--actor-route",
        "hostile=/h",
    ];
    args.extend_from_slice(extra);
    Weir::start_with_env(&args, env)
}

pub async fn post_json(weir: &Weir, path: &str, body: Value) -> Resp {
    weir.send(
        Request::post(path)
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap(),
    )
    .await
}

/// One `weir:sql` batch through the hostile worker: the guest's view.
pub async fn sql(weir: &Weir, statements: &[&str]) -> Value {
    let r = post_json(
        weir,
        "/sql",
        json!({ "db": "app", "statements": statements }),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.json()
}

/// Statements through `storage.exec` of hostile actor `name`, one per turn
/// call: the guest's view of each.
pub async fn exec(weir: &Weir, name: &str, statements: &[&str]) -> Vec<Value> {
    let r = post_json(weir, &format!("/h/{name}/exec"), json!(statements)).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.json().as_array().unwrap().clone()
}

/// The compile bomb with `functions` chains of `additions` each, as a
/// component file.
pub fn compile_bomb(functions: usize, additions: usize) -> PathBuf {
    let chain = "local.get 0 i32.const 1 i32.add local.set 0\n".repeat(additions);
    let bodies: String = (0..functions)
        .map(|i| format!("(func (export \"f{i}\") (param i32)\n{chain})\n"))
        .collect();
    let wat = std::fs::read_to_string(root().join("guests/wat/compile-bomb.wat"))
        .unwrap()
        .replace("FUNCTIONS", &bodies);
    // Tests of one binary build the same bomb at once: each writes its own
    // file and renames it into place, so no test clears or reads another's
    // half-written one (clearing the shared name made a reader miss it).
    let name = format!("compile-bomb-{functions}x{additions}.wasm");
    let path = weir_scratch::path(&name);
    let own = weir_scratch::dir(
        &format!("{name}.{:?}", std::thread::current().id()).replace(['(', ')'], ""),
    );
    std::fs::write(&own, wat::parse_str(&wat).unwrap()).unwrap();
    std::fs::rename(&own, &path).unwrap();
    path
}

/// The compiler's memory limit the tests set: 256 MiB, where the hello
/// guests compile in about 30 MB and the bomb needs over 1 GB.
pub const COMPILER_LIMIT: &str = "compile_memory_limit_bytes=268435456";
pub const COMPILER_REFUSAL: &str =
    "compiling needed more than 256 MiB of memory (compile_memory_limit_bytes)";

/// What a chain of `/relay` calls came to: the status of the innermost
/// call that did not answer 200 (or 200), its body, and how many hops
/// answered on the way.
pub fn innermost(mut answer: Value) -> (u64, Value, usize) {
    let mut hops = 0;
    loop {
        let Some(status) = answer.get("status").and_then(Value::as_u64) else {
            return (200, answer, hops);
        };
        let text = answer["body"].as_str().unwrap_or_default();
        let body = serde_json::from_str(text).unwrap_or(Value::String(text.into()));
        if status != 200 {
            return (status, body, hops);
        }
        hops += 1;
        answer = body;
    }
}

/// Opens `/h/<actor>/ws?<query>` on the hostile actor class: the socket,
/// or the status and body of the answer that refused it.
pub async fn hostile_socket(
    weir: &Weir,
    actor: &str,
    query: &str,
) -> Result<HostileSocket, (u16, String)> {
    use tokio_tungstenite::tungstenite::Error;
    let url = format!("ws://{}/h/{actor}/ws?{query}", weir.addr);
    match tokio_tungstenite::connect_async(url).await {
        Ok((ws, response)) => {
            assert_eq!(response.status(), 101);
            Ok(ws)
        }
        Err(Error::Http(response)) => Err((
            response.status().as_u16(),
            String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into(),
        )),
        Err(e) => panic!("{query}: {e}"),
    }
}

pub type HostileSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Sends `text` (if any) and returns the next text message.
pub async fn exchange(ws: &mut HostileSocket, text: Option<String>) -> String {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    if let Some(text) = text {
        ws.send(Message::text(text)).await.unwrap();
    }
    loop {
        match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => return t.to_string(),
            Ok(Some(Ok(_))) => {}
            other => panic!("no message: {other:?}"),
        }
    }
}
