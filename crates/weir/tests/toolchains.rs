//! Guests from the Python and JavaScript toolchains, built the way their
//! users build them (`guests/toolchains.sh`: componentize-py and
//! componentize-js at pinned versions), served by a real `weir serve` and
//! checked byte for byte against what each guest means to send. Also: the
//! fetch-event style that cannot serve a second request on one instance,
//! declared or found out, and a WASI 0.3 component refused with a message
//! a user can act on.

mod common;

use bytes::Bytes;
use common::toolchains::toolchain_guest;
use common::{Resp, Weir, guest, pattern, root, run_weir};
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// `GET /` answers exactly the guest's greeting as `text/plain`.
async fn assert_hello(weir: &Weir, greeting: &str) {
    let resp = weir.get("/").await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.headers["content-type"], "text/plain");
    assert_eq!(resp.headers.get_all("set-cookie").iter().count(), 0);
    assert_eq!(resp.body.as_deref(), Ok(greeting.as_bytes()));
    assert_only_headers(&resp, &["content-type"]);
}

/// `POST /echo` answers the body it was sent, byte for byte, with two
/// `set-cookie` lines that stay two lines, in the guest's order.
async fn assert_echo(weir: &Weir) {
    let body = pattern(300_000);
    let resp = common::actors::post(weir, "/echo", body.clone()).await;
    assert_eq!(resp.status, 200, "{:?}", resp.body);
    assert_eq!(resp.headers["content-type"], "application/octet-stream");
    let cookies: Vec<_> = resp.headers.get_all("set-cookie").iter().collect();
    assert_eq!(cookies, ["a=1; Path=/", "b=2; Path=/"]);
    assert_eq!(resp.body.as_deref(), Ok(&body[..]));
    assert_only_headers(&resp, &["content-type", "set-cookie"]);
}

/// The response carries the guest's headers and, besides them, only the
/// framing and date the transport adds.
fn assert_only_headers(resp: &Resp, guest: &[&str]) {
    let framing = ["content-length", "transfer-encoding", "date"];
    for name in resp.headers.keys() {
        assert!(
            guest.contains(&name.as_str()) || framing.contains(&name.as_str()),
            "unexpected header {name}: {:?}",
            resp.headers
        );
    }
}

/// `clients` keep-alive connections, each sending `per_client` requests
/// for `/` one after the other: every (status, body) seen.
async fn load(weir: &Weir, clients: usize, per_client: usize) -> Vec<(u16, Bytes)> {
    let addr = weir.addr;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            tokio::spawn(async move {
                let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream))
                        .await
                        .unwrap();
                tokio::spawn(conn);
                let mut seen = Vec::new();
                for _ in 0..per_client {
                    sender.ready().await.expect("the connection stays open");
                    let req = Request::get("/")
                        .header("host", addr.to_string())
                        .body(Full::new(Bytes::new()))
                        .unwrap();
                    let resp = sender.send_request(req).await.expect("a response");
                    let status = resp.status().as_u16();
                    let body = resp.into_body().collect().await.unwrap().to_bytes();
                    seen.push((status, body));
                }
                seen
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all
}

/// Serves `app` on one lane: its hello and echo are exact, and it serves
/// them all on one instance.
async fn assert_serves_on_one_instance(app: &std::path::Path, greeting: &str) {
    let weir = Weir::start(app, &["--limit", "max_concurrent=1"]);
    assert_hello(&weir, greeting).await;
    assert_echo(&weir).await;
    for _ in 0..5 {
        assert_hello(&weir, greeting).await;
    }
    weir.count_receipts_where(7, |_| true).await;
    let receipts = weir.receipts();
    assert!(
        receipts.iter().all(|r| r["generation"] == 1),
        "{receipts:?}"
    );
}

#[tokio::test]
async fn a_python_component_answers_byte_for_byte_and_reuses_its_instance() {
    let app = toolchain_guest("py-hello");
    assert_serves_on_one_instance(&app, "hello from python\n").await;
}

#[tokio::test]
async fn a_javascript_component_with_an_incoming_handler_answers_byte_for_byte() {
    let app = toolchain_guest("js-hello");
    assert_serves_on_one_instance(&app, "hello from javascript\n").await;
}

const FETCH_GREETING: &[u8] = b"hello from a fetch event\n";

#[tokio::test]
async fn a_fetch_event_app_declared_one_event_per_generation_answers_every_request_under_load() {
    let app = toolchain_guest("js-fetch");
    let weir = Weir::start(
        &app,
        &[
            "--limit",
            "retirement_admission_limit=1",
            "--limit",
            "max_concurrent=4",
        ],
    );
    assert_hello(&weir, "hello from a fetch event\n").await;
    assert_echo(&weir).await;
    let seen = load(&weir, 8, 40).await;
    assert_eq!(seen.len(), 320);
    let bad: Vec<_> = seen
        .iter()
        .filter(|(status, body)| *status != 200 || body != FETCH_GREETING)
        .collect();
    assert!(
        bad.is_empty(),
        "{} of 320 failed: {:?}",
        bad.len(),
        bad.first()
    );
    let status = weir.status().await;
    let retirement = &status["apps"][0]["retirement"];
    assert_eq!(retirement["events_per_generation"], 1, "{status}");
    assert_eq!(retirement["fallback"], false, "{status}");
    // Every event ran on a generation of its own.
    weir.count_receipts_where(322, |_| true).await;
    let mut generations: Vec<_> = weir
        .receipts()
        .iter()
        .map(|r| r["generation"].as_u64().unwrap())
        .collect();
    generations.sort();
    generations.dedup();
    assert_eq!(generations.len(), 322);
}

#[tokio::test]
async fn a_fetch_event_app_is_found_out_and_then_served_one_event_per_generation() {
    let app = toolchain_guest("js-fetch");
    let weir = Weir::start(&app, &["--limit", "max_concurrent=1"]);
    // Each generation's first request works and its second cannot:
    // StarlingMonkey refuses a second fetch event on one instance.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let resp = weir.get("/").await;
        if resp.status == 502 {
            resp.assert_weir_error(502, "invalid_response");
        } else {
            assert_eq!(resp.body.as_deref(), Ok(FETCH_GREETING));
        }
        statuses.push(resp.status.as_u16());
    }
    assert_eq!(statuses, [200, 502, 200, 502]);
    // Two generations in a row failed their second event: the app now
    // serves one event per generation, and says so.
    let status = weir.status().await;
    let retirement = &status["apps"][0]["retirement"];
    assert_eq!(retirement["admission_limit"], 64, "{status}");
    assert_eq!(retirement["events_per_generation"], 1, "{status}");
    assert_eq!(retirement["fallback"], true, "{status}");
    // The warning was logged before the fourth receipt.
    weir.count_receipts_where(4, |_| true).await;
    let warned: Vec<serde_json::Value> = weir
        .log()
        .lines()
        .filter(|l| l.contains("cannot serve a second event"))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(warned.len(), 1, "{}", weir.log());
    assert_eq!(warned[0]["level"], "WARN");
    assert_eq!(warned[0]["fields"]["app"], "js-fetch");
    let receipts = weir.receipts();
    let failed: Vec<_> = receipts
        .iter()
        .filter(|r| r["error"] == "invalid_response")
        .collect();
    assert_eq!(failed.len(), 2, "{receipts:?}");
    assert!(failed.iter().all(|r| r["retired"] == "invalid_response"));
    assert_eq!(
        failed
            .iter()
            .map(|r| r["generation"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2]
    );
    // From now on every request is answered, under load too.
    assert_echo(&weir).await;
    let seen = load(&weir, 8, 25).await;
    let bad = seen
        .iter()
        .filter(|(status, body)| *status != 200 || body != FETCH_GREETING)
        .count();
    assert_eq!(bad, 0, "{bad} of {} failed after the fall-back", seen.len());
}

#[tokio::test]
async fn a_wasi_03_component_is_refused_at_start_naming_its_interface() {
    let app = guest("http03");
    let refused = run_weir(&["serve", app.to_str().unwrap()]);
    assert_eq!(refused.code, Some(1), "{}", refused.stderr);
    let message = refused.stderr;
    assert!(
        message.contains("exports wasi:http/handler@0.3.0, a WASI 0.3 handler"),
        "{message}"
    );
    assert!(
        message.contains("this build of Weir serves WASI 0.2 components"),
        "{message}"
    );
    assert!(!message.contains("async feature"), "{message}");
    // `weir build` judges the component the same way.
    let built = run_weir(&[
        "build",
        "--manifest",
        root().join("guests/http03/Cargo.toml").to_str().unwrap(),
        "--out-dir",
        common::fresh_data_dir().to_str().unwrap(),
    ]);
    assert_eq!(built.code, Some(1), "{}", built.stderr);
    assert!(
        built
            .stderr
            .contains("exports wasi:http/handler@0.3.0, a WASI 0.3 handler"),
        "{}",
        built.stderr
    );
}
