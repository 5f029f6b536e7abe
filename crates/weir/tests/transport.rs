//! Transport contract: bodies and headers round-trip, bodyless statuses,
//! head and body limits, response limits. Each test provokes its case from
//! outside against a real `weir serve`.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Weir, pattern, probe};
use http::Request;
use http_body_util::Full;

/// Splits a raw HTTP/1.1 response into its head and the rest.
fn split_head(raw: &str) -> (&str, &str) {
    raw.split_once("\r\n\r\n").expect("a response head")
}

/// Parses chunked framing: the chunk sizes seen and whether the terminating
/// zero-size chunk arrived.
fn chunks(body: &[u8]) -> (Vec<usize>, bool) {
    let mut sizes = Vec::new();
    let mut rest = body;
    loop {
        let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return (sizes, false);
        };
        let line = std::str::from_utf8(&rest[..line_end]).unwrap();
        let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16).unwrap();
        rest = &rest[line_end + 2..];
        if size == 0 {
            return (sizes, true);
        }
        if rest.len() < size + 2 {
            sizes.push(rest.len().min(size));
            return (sizes, false);
        }
        sizes.push(size);
        rest = &rest[size + 2..];
    }
}

#[tokio::test]
async fn binary_bodies_round_trip_exactly() {
    let weir = Weir::start(&probe(), &["--limit", "max_request_body_bytes=4000000"]);
    let mut sizes = vec![
        0, 1, 2, 3, 256, 12_287, 12_288, 12_289, 65_534, 65_535, 65_536,
    ];
    sizes.push(3_400_000);
    for n in sizes {
        let body = pattern(n);
        let resp = weir
            .send(
                Request::post("/echo")
                    .body(Full::new(Bytes::from(body.clone())))
                    .unwrap(),
            )
            .await;
        assert_eq!(resp.status, 200, "size {n}");
        let got = resp.body.expect("complete body");
        assert_eq!(got.len(), n, "size {n}");
        assert!(got == body, "bytes differ at size {n}");
    }
}

#[tokio::test]
async fn repeated_headers_and_cookies_stay_separate() {
    let weir = Weir::start(&probe(), &[]);
    let resp = weir
        .send(
            Request::get("/echo")
                .header("x-multi", "one")
                .header("x-multi", "two")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    let values: Vec<_> = resp.headers.get_all("x-multi").iter().collect();
    assert_eq!(values, ["one", "two"]);

    let resp = weir.get("/cookies").await;
    let cookies: Vec<_> = resp.headers.get_all("set-cookie").iter().collect();
    assert_eq!(cookies, ["a=1; Path=/", "b=2; Path=/"]);
}

#[tokio::test]
async fn trailing_question_mark_reaches_the_guest() {
    let weir = Weir::start(&probe(), &[]);
    let raw = weir.raw(
        b"GET /echo? HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    let (head, _) = split_head(&raw);
    assert!(head.contains("x-uri: /echo?\r\n"), "{head}");
}

#[tokio::test]
async fn bodyless_responses_carry_no_body() {
    let weir = Weir::start(&probe(), &[]);
    for code in [204, 205, 304] {
        let raw = weir.raw_bytes(
            format!("GET /status?code={code} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .as_bytes(),
            Duration::from_secs(5),
        );
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = split_head(&text);
        assert!(head.starts_with(&format!("HTTP/1.1 {code}")), "{head}");
        assert_eq!(body, "", "status {code} must carry no body");
        assert!(!head.contains("transfer-encoding"), "{head}");
    }
    let raw = weir.raw_bytes(
        b"HEAD /hello HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = split_head(&text);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, "");
    // The guest's writes were drained: its event ended cleanly.
    weir.receipt_where(|r| r["status"] == 200 && r["outcome"] == "ok")
        .await;
    assert_eq!(weir.get("/hello").await.status, 200);
}

/// Builds a raw GET whose head is exactly `target` bytes by Weir's count.
fn head_of_size(target: usize) -> Vec<u8> {
    // "GET /hello" (10) + "host: x\r\n" (9) + "x-pad: " (7) + value + "\r\n" (2)
    let fixed = 10 + 9 + 7 + 2;
    let pad = "a".repeat(target - fixed);
    format!("GET /hello HTTP/1.1\r\nhost: x\r\nx-pad: {pad}\r\n\r\n").into_bytes()
}

#[tokio::test]
async fn head_over_the_limit_is_431_and_at_the_limit_passes() {
    let weir = Weir::start(&probe(), &["--limit", "max_request_head_bytes=2048"]);
    let ok =
        String::from_utf8_lossy(&weir.raw_bytes(&head_of_size(2048), Duration::from_millis(500)))
            .into_owned();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let over =
        String::from_utf8_lossy(&weir.raw_bytes(&head_of_size(2049), Duration::from_millis(500)))
            .into_owned();
    assert!(over.starts_with("HTTP/1.1 431"), "{over}");
    assert!(
        over.ends_with("{\"error\":\"request_header_fields_too_large\"}"),
        "{over}"
    );
    assert!(over.contains("cache-control: no-store"));
    assert!(over.contains("x-content-type-options: nosniff"));

    // Multi-byte UTF-8 counts as bytes: 1020 'é' are 2040 bytes, under
    // 2048 as characters but over it as bytes with the rest of the head.
    let resp = weir
        .send(
            Request::get("/hello")
                .header("x-utf8", "é".repeat(1020))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    resp.assert_weir_error(431, "request_header_fields_too_large");
}

#[tokio::test]
async fn declared_body_over_limit_is_413_before_admission() {
    let weir = Weir::start(
        &probe(),
        &[
            "--limit",
            "max_request_body_bytes=1024",
            "--limit",
            "max_concurrent=1",
        ],
    );
    // No body bytes are sent: the answer must come from the declared length.
    let raw = weir.raw(
        b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 1025\r\n\r\n",
        Duration::from_secs(2),
    );
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
    assert!(raw.contains("{\"error\":\"payload_too_large\"}"));
    let receipt = weir
        .receipt_where(|r| r["error"] == "payload_too_large")
        .await;
    assert!(receipt["lane"].is_null(), "no lane was used: {receipt}");
    assert!(
        receipt["generation"].is_null(),
        "the guest was never entered"
    );
    let status = weir.status().await;
    assert_eq!(status["apps"][0]["generations"]["created"], 1);
    assert_eq!(status["apps"][0]["lanes"][0]["state"], "idle");
}

#[tokio::test]
async fn chunked_body_growing_past_limit_is_413() {
    let weir = Weir::start(&probe(), &["--limit", "max_request_body_bytes=1024"]);
    let chunk = "a".repeat(800);
    let req = format!(
        "POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n320\r\n{chunk}\r\n320\r\n{chunk}\r\n0\r\n\r\n"
    );
    let raw = weir.raw(req.as_bytes(), Duration::from_secs(2));
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
    assert!(raw.contains("{\"error\":\"payload_too_large\"}"));
    // At the limit it passes.
    let resp = weir
        .send(
            Request::post("/echo")
                .body(Full::new(Bytes::from(pattern(1024))))
                .unwrap(),
        )
        .await;
    assert_eq!(resp.body.unwrap().len(), 1024);
}

#[tokio::test]
async fn stalled_body_is_408_and_holds_its_lane_past_the_event_deadline() {
    let weir = Weir::start(
        &probe(),
        &[
            "--limit",
            "body_read_timeout_ms=600",
            "--limit",
            "event_limit_ms=100",
            "--limit",
            "max_concurrent=1",
            "--limit",
            "max_queued=0",
        ],
    );
    let addr = weir.addr;
    let started = Instant::now();
    let stalled = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nhalf!")
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The stalled read holds the only lane, past the 100 ms event deadline.
    weir.get("/hello")
        .await
        .assert_weir_error(503, "event_capacity_exceeded");
    let raw = stalled.join().unwrap();
    let waited = started.elapsed();
    assert!(raw.starts_with("HTTP/1.1 408"), "{raw}");
    assert!(raw.contains("{\"error\":\"request_body_timeout\"}"));
    assert!(
        waited >= Duration::from_millis(600),
        "408 came after the body timeout"
    );
    // The lane is free again.
    assert_eq!(weir.get("/hello").await.status, 200);
}

#[tokio::test]
async fn declared_response_length_over_limit_is_502_before_headers() {
    let weir = Weir::start(&probe(), &["--limit", "max_response_body_bytes=4096"]);
    let resp = weir.get("/declared-length?len=4097").await;
    resp.assert_weir_error(502, "response_body_too_large");
    assert_eq!(weir.get("/hello").await.status, 200);
}

#[tokio::test]
async fn a_declared_length_over_the_limit_is_502_even_when_the_guest_then_fails() {
    // The length is judged when the response is set, before anything the
    // guest does after (a `wstd` guest fails finishing its empty body).
    // Whether the guest's trap or its response reaches Weir first depends
    // on scheduling: every try must come out the same.
    let weir = Weir::start(&probe(), &["--limit", "max_response_body_bytes=4096"]);
    for _ in 0..20 {
        let resp = weir.get("/declared-length-then-fail?len=4097").await;
        resp.assert_weir_error(502, "response_body_too_large");
    }
    weir.count_receipts_where(20, |r| {
        r["error"] == "response_body_too_large" && r["outcome"] == "limit"
    })
    .await;
    // Under the limit the trap is what counts: the generation is
    // abandoned (or, had the headers left first, the response fails);
    // never a clean answer.
    let req = http::Request::get("/declared-length-then-fail?len=4096")
        .header("host", "x")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    if let Ok(resp) = common::try_send_to(weir.addr, req).await {
        if resp.status == 503 {
            resp.assert_weir_error(503, "instance_abandoned");
        } else {
            assert!(resp.body.is_err(), "a clean end: {:?}", resp.body);
        }
    }
    assert_eq!(weir.get("/hello").await.status, 200);
}

#[tokio::test]
async fn streamed_response_crossing_the_limit_is_aborted() {
    let weir = Weir::start(&probe(), &["--limit", "max_response_body_bytes=4096"]);
    let raw = weir.raw_bytes(
        // 1000-byte chunks, 20 ms apart: headers and four chunks reach the
        // client before the fifth crosses the limit.
        b"GET /stream?chunks=10&size=1000&delay_ms=20 HTTP/1.1\r\nhost: x\r\n\r\n",
        Duration::from_secs(5),
    );
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let (sizes, complete) = chunks(&raw[at + 4..]);
    assert!(!complete, "a body over the limit must not end cleanly");
    assert_eq!(
        sizes.iter().sum::<usize>(),
        4000,
        "excess was sent: {sizes:?}"
    );
    weir.receipt_where(|r| r["error"] == "response_body_too_large")
        .await;
    // At the limit it passes.
    let resp = weir.get("/large?bytes=4096").await;
    assert_eq!(resp.body.unwrap().len(), 4096);
}

#[tokio::test]
async fn chunks_reaching_the_client_respect_the_chunk_limit() {
    let weir = Weir::start(&probe(), &["--limit", "max_response_chunk_bytes=1024"]);
    let raw = weir.raw_bytes(
        b"GET /large?bytes=10000 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let (sizes, complete) = chunks(&raw[at + 4..]);
    assert!(complete);
    assert_eq!(sizes.iter().sum::<usize>(), 10_000);
    assert!(sizes.iter().all(|s| *s <= 1024), "{sizes:?}");
}
