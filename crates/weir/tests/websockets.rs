//! Worker WebSockets from outside: a real `weir serve`, the `sockets`
//! guest, a real WebSocket client (tokio-tungstenite) and raw handshakes.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::Weir;
use futures::{SinkExt, StreamExt};
use http::Request;
use http_body_util::Full;
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use common::websocket::{Client, close_of};

fn start(extra: &[&str]) -> Weir {
    Weir::start(&common::guest("sockets"), extra)
}

async fn connect(weir: &Weir, path: &str) -> Client {
    let url = format!("ws://{}{}", weir.addr, path);
    let (ws, response) = tokio_tungstenite::connect_async(url)
        .await
        .expect("upgraded");
    assert_eq!(response.status(), 101);
    ws
}

async fn socket_receipt(weir: &Weir, f: impl Fn(&Value) -> bool) -> Value {
    weir.first_logged("weir::socket", f).await
}

/// A handshake as raw bytes, with `edit` applied to its header lines.
fn handshake(path: &str, method: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut req = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(Full::new(Bytes::new())).unwrap()
}

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

#[tokio::test]
async fn an_echo_carries_text_and_binary_and_the_clients_close_is_answered() {
    let weir = start(&[]);
    let mut ws = connect(&weir, "/echo").await;
    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hello"));
    let blob: Vec<u8> = (0..=255).collect();
    ws.send(Message::binary(blob.clone())).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::binary(blob));
    // A message in many fragments arrives whole.
    let big = "ab".repeat(100_000);
    ws.send(Message::text(big.clone())).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text(big));
    ws.close(None).await.unwrap();
    assert!(matches!(
        ws.next().await,
        Some(Ok(Message::Close(_))) | None
    ));

    let socket = socket_receipt(&weir, |r| r["closed_by"] == "client").await;
    assert_eq!(socket["close_code"], 1005, "{socket}");
    assert_eq!(socket["messages_in"], 3);
    assert_eq!(socket["messages_out"], 3);
    assert_eq!(socket["bytes_in"], 5 + 256 + 200_000);
    let event = weir
        .receipt_where(|r| r["status"] == 101 && r["outcome"] == "ok")
        .await;
    assert!(event["lane"].is_number(), "{event}");
}

#[tokio::test]
async fn an_invalid_upgrade_is_a_json_400_and_the_guest_never_sees_it() {
    let weir = start(&[]);
    let base = [("upgrade", "websocket"), ("connection", "upgrade")];
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "POST",
            vec![("sec-websocket-version", "13"), ("sec-websocket-key", KEY)],
        ),
        (
            "GET",
            vec![("sec-websocket-version", "8"), ("sec-websocket-key", KEY)],
        ),
        ("GET", vec![("sec-websocket-version", "13")]),
        (
            "GET",
            vec![
                ("sec-websocket-version", "13"),
                ("sec-websocket-key", "c2hvcnQ="),
            ],
        ),
    ];
    for (method, extra) in cases {
        let mut headers = base.to_vec();
        headers.extend(extra.iter().copied());
        let resp = weir.send(handshake("/echo", method, &headers)).await;
        resp.assert_weir_error(400, "invalid_upgrade");
        assert_eq!(resp.headers["sec-websocket-version"], "13");
    }
    weir.count_receipts_where(4, |r| r["status"] == 400).await;
    for r in &weir.receipts() {
        assert_eq!(r["status"], 400);
        assert!(r["lane"].is_null(), "never admitted: {r}");
        assert!(
            r["detail"]
                .as_str()
                .unwrap()
                .starts_with("invalid_upgrade: "),
            "{r}"
        );
    }
}

#[tokio::test]
async fn a_guest_that_does_not_accept_answers_itself_and_plain_requests_see_no_offer() {
    let weir = start(&[]);
    let headers = [
        ("upgrade", "websocket"),
        ("connection", "upgrade"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", KEY),
    ];
    let refused = weir.send(handshake("/refuse", "GET", &headers)).await;
    assert_eq!(refused.status, 403);
    assert_eq!(refused.text(), "not you\n");
    let plain = weir.get("/echo").await;
    assert_eq!(plain.status, 200);
    assert_eq!(plain.text(), "upgrade offered: false\n");
    // A guest cannot answer 101 on its own: the transport's 101 is the
    // only one (the probe sets whatever status it is told).
    // SECURITY.md: an informational status from a guest is
    // invalid_response, to a plain request and to a handshake alike.
    let probe = Weir::start(&common::probe(), &[]);
    let faked = probe.get("/status?code=101").await;
    assert_eq!(faked.status, 502, "{faked:?}");
    assert_eq!(faked.json()["error"], "invalid_response", "{faked:?}");
    let faked = probe
        .send(handshake("/status?code=101", "GET", &headers))
        .await;
    assert_eq!(faked.status, 502, "{faked:?}");
    assert_eq!(faked.json()["error"], "invalid_response", "{faked:?}");
}

#[tokio::test]
async fn a_subprotocol_is_agreed_only_if_the_client_offered_it() {
    let weir = start(&[]);
    let mut req = format!("ws://{}/echo?protocol=chat", weir.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", "superchat, chat".parse().unwrap());
    let (mut ws, response) = tokio_tungstenite::connect_async(req).await.unwrap();
    assert_eq!(response.headers()["sec-websocket-protocol"], "chat");
    ws.send(Message::text("x")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("x"));

    let headers = [
        ("upgrade", "websocket"),
        ("connection", "upgrade"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", KEY),
        ("sec-websocket-protocol", "chat"),
    ];
    let wrong = weir
        .send(handshake("/echo?protocol=bogus", "GET", &headers))
        .await;
    assert_eq!(wrong.status, 400, "the guest's own answer");
    assert!(wrong.text().contains("did not offer"), "{}", wrong.text());
}

#[tokio::test]
async fn each_way_a_worker_ends_closes_its_socket_with_its_own_code() {
    let weir = start(&["--limit", "session_limit_ms=1000"]);
    // The guest closes with its code and reason.
    let mut ws = connect(&weir, "/close?code=4001&reason=bye").await;
    assert_eq!(close_of(&mut ws).await, Ok((4001, "bye".into())));
    // The handler returns with the socket open.
    let mut ws = connect(&weir, "/return-after?n=1").await;
    ws.send(Message::text("one")).await.unwrap();
    assert_eq!(
        close_of(&mut ws).await,
        Ok((1000, "the handler returned".into()))
    );
    // A trap mid-socket.
    let mut ws = connect(&weir, "/trap-after?n=1").await;
    ws.send(Message::text("one")).await.unwrap();
    assert_eq!(
        close_of(&mut ws).await,
        Ok((1011, "the guest failed (trap)".into()))
    );
    // A guest that spins is stopped at the session deadline.
    let mut ws = connect(&weir, "/spin-after?n=0").await;
    assert_eq!(
        close_of(&mut ws).await,
        Ok((1001, "session_limit_ms passed".into()))
    );
    // A guest that waits on its socket, too.
    let mut ws = connect(&weir, "/hold").await;
    assert_eq!(
        close_of(&mut ws).await,
        Ok((1001, "session_limit_ms passed".into()))
    );

    let trap = weir.receipt_where(|r| r["outcome"] == "trap").await;
    assert_eq!(trap["status"], 101);
    assert_eq!(trap["error"], "instance_abandoned");
    weir.count_receipts_where(2, |r| r["outcome"] == "deadline" && r["status"] == 101)
        .await;
    // Every lane came back: a new socket echoes.
    let mut ws = connect(&weir, "/echo").await;
    ws.send(Message::text("after")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("after"));
    let closes: Vec<(u64, String)> = weir
        .logged("weir::socket")
        .iter()
        .map(|r| {
            (
                r["close_code"].as_u64().unwrap(),
                r["closed_by"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        closes,
        [
            (4001, "guest".to_string()),
            (1000, "guest".to_string()),
            (1011, "weir".to_string()),
            (1001, "weir".to_string()),
            (1001, "weir".to_string()),
        ]
    );
}

#[tokio::test]
async fn close_codes_that_may_not_be_sent_are_refused_to_the_guest() {
    let weir = start(&[]);
    let mut ws = connect(&weir, "/bad-close").await;
    let Some(Ok(Message::Text(said))) = ws.next().await else {
        panic!("a report")
    };
    for line in said.lines() {
        assert!(line.contains("Invalid("), "{line}");
    }
    assert_eq!(said.lines().count(), 6);
    assert_eq!(close_of(&mut ws).await, Ok((1000, "done".into())));
}

#[tokio::test]
async fn a_message_over_the_limit_closes_with_1009_and_a_send_over_it_is_refused() {
    let weir = start(&["--limit", "max_socket_message_bytes=1024"]);
    let mut ws = connect(&weir, "/echo").await;
    ws.send(Message::binary(vec![1; 1024])).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap().len(), 1024);
    ws.send(Message::binary(vec![1; 1025])).await.unwrap();
    let (code, reason) = close_of(&mut ws).await.unwrap();
    assert_eq!(code, 1009);
    assert!(reason.contains("max_socket_message_bytes"), "{reason}");
    let r = socket_receipt(&weir, |r| r["close_code"] == 1009).await;
    assert_eq!(r["closed_by"], "weir");
    assert_eq!(r["outcome"], "limit");
    // The guest's side: a send one byte over the limit is refused, naming
    // it, and neither reaches the client nor ends the socket; one at the
    // limit goes.
    let mut ws = connect(&weir, "/send-over?bytes=1025").await;
    let at_limit = ws.next().await.unwrap().unwrap();
    assert_eq!(at_limit, Message::binary(vec![2; 1024]));
    let said = ws.next().await.unwrap().unwrap();
    let said = said.to_text().unwrap();
    let (over, under) = said.split_once('\n').unwrap();
    assert!(
        over.starts_with("Err(")
            && over.contains(
                "TooLarge(\"a message of 1025 bytes is over max_socket_message_bytes (1024)\")"
            ),
        "{said}"
    );
    assert_eq!(under, "Ok(())", "{said}");
    ws.send(Message::text("still open")).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text("still open")
    );
}

#[tokio::test]
async fn a_client_that_stops_reading_holds_the_guest_at_the_send_queue_and_is_dropped() {
    let weir = start(&[
        "--limit",
        "socket_idle_timeout_ms=3000",
        "--limit",
        "session_limit_ms=60000",
    ]);
    // Connect, then never read: the guest floods 64 KiB messages.
    let ws = connect(&weir, "/flood?kb=64").await;
    let r = socket_receipt(&weir, |r| r["close_code"] == 1001).await;
    // The queue held at most max_socket_send_queue_bytes (1 MiB), and was
    // full: the server did not grow with what the client did not take.
    let peak = r["queue_peak_bytes"].as_u64().expect("the queue's peak");
    let message = 64 * 1024 + 64;
    assert!((1024 * 1024 - message..=1024 * 1024).contains(&peak), "{r}");
    assert_eq!(r["closed_by"], "weir");
    assert!(
        r["detail"].as_str().unwrap().contains("taking nothing"),
        "{r}"
    );
    // The guest's send failed and its event ended cleanly, well before its
    // session deadline.
    let event = weir.receipt_where(|r| r["status"] == 101).await;
    assert_eq!(event["outcome"], "ok", "{event}");
    drop(ws);
}

#[tokio::test]
async fn weir_pings_a_quiet_client_and_drops_one_that_never_answers() {
    let weir = start(&[
        "--limit",
        "socket_ping_interval_ms=200",
        "--limit",
        "socket_idle_timeout_ms=1000",
    ]);
    // A live client answers pings (tungstenite pongs as it reads) and
    // outlives the idle timeout.
    let mut live = connect(&weir, "/echo").await;
    let until = Instant::now() + Duration::from_millis(2500);
    let mut pings = 0;
    while let Ok(frame) = tokio::time::timeout_at(until.into(), live.next()).await {
        match frame {
            Some(Ok(Message::Ping(_))) => pings += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(pings >= 2, "{pings} pings");
    live.send(Message::text("still here")).await.unwrap();
    assert_eq!(
        live.next().await.unwrap().unwrap(),
        Message::text("still here")
    );
    // A client that reads nothing (so answers no ping) is dropped.
    let silent = connect(&weir, "/hold").await;
    let r = socket_receipt(&weir, |r| r["close_code"] == 1001).await;
    assert!(
        r["detail"].as_str().unwrap().contains("without a word"),
        "{r}"
    );
    drop(silent);
}

#[tokio::test]
async fn past_max_sockets_an_upgrade_gets_503_and_a_closed_socket_frees_its_place() {
    let weir = start(&["--limit", "max_sockets=2"]);
    let mut a = connect(&weir, "/echo").await;
    let _b = connect(&weir, "/echo").await;
    let err = tokio_tungstenite::connect_async(format!("ws://{}/echo", weir.addr))
        .await
        .expect_err("refused");
    let WsError::Http(response) = err else {
        panic!("{err:?}")
    };
    assert_eq!(response.status(), 503);
    let body: Value = serde_json::from_slice(response.body().as_ref().unwrap()).unwrap();
    assert_eq!(body["error"], "socket_capacity_exceeded");
    a.close(None).await.unwrap();
    while a.next().await.is_some() {}
    let closed = socket_receipt(&weir, |r| r["closed_by"] == "client").await;
    // It names the version of the code that accepted it.
    assert!(
        closed["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("sha256:")),
        "{closed}"
    );
    let mut c = connect(&weir, "/echo").await;
    c.send(Message::text("in")).await.unwrap();
    assert_eq!(c.next().await.unwrap().unwrap(), Message::text("in"));
}

#[tokio::test]
async fn a_shutdown_closes_open_sockets_with_1001_and_a_kill_drops_them_without_a_close() {
    let mut weir = start(&[]);
    let mut ws = connect(&weir, "/hold").await;
    weir.signal("TERM");
    assert_eq!(
        close_of(&mut ws).await,
        Ok((1001, "the server is shutting down".into()))
    );
    assert!(weir.wait_exit(Duration::from_secs(30)).is_some(), "exited");

    let weir = start(&[]);
    let mut ws = connect(&weir, "/echo").await;
    ws.send(Message::text("x")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("x"));
    weir.signal("KILL");
    let ended = close_of(&mut ws).await;
    assert!(
        ended.is_err(),
        "a killed server sends no close frame: {ended:?}"
    );
}

#[test]
fn the_autobahn_fuzzing_client_passes_every_case_but_compression_against_a_worker_echo() {
    let kosoku = common::autobahn::kosoku();
    let weir = start(&[
        "--limit",
        "max_socket_message_bytes=20000000",
        "--limit",
        "max_socket_send_queue_bytes=20000000",
    ]);
    let report = common::autobahn::run(&kosoku, &format!("ws://{}/echo", weir.addr));
    assert!(report.passed > 300, "{report:?}");
    assert_eq!(report.failed, Vec::<String>::new(), "{report:?}");
}
