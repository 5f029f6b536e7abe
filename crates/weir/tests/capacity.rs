//! Admission and the wait queue under overload.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Weir, probe, send_to};
use http::Request;
use http_body_util::Full;

fn spawn_get(weir: &Weir, path: &str) -> tokio::task::JoinHandle<common::Resp> {
    let addr = weir.addr;
    let req = Request::get(path)
        .header("host", "x")
        .body(Full::new(Bytes::new()))
        .unwrap();
    tokio::spawn(send_to(addr, req))
}

#[tokio::test]
async fn queue_waits_then_refuses_at_once_without_reading_the_body() {
    let weir = Weir::start(
        &probe(),
        &[
            "--limit",
            "max_concurrent=2",
            "--limit",
            "max_queued=1",
            "--limit",
            "event_limit_ms=5000",
        ],
    );
    let busy: Vec<_> = (0..2).map(|_| spawn_get(&weir, "/sleep?ms=1500")).collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let queued_at = Instant::now();
    let waiter = spawn_get(&weir, "/hello");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(weir.status().await["apps"][0]["queue_depth"], 1);

    // The fourth declares a body it never sends: an answer proves Weir did
    // not wait to read it.
    let mut s = TcpStream::connect(weir.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let refused_at = Instant::now();
    s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    let raw = String::from_utf8_lossy(&buf[..n]);
    assert!(raw.starts_with("HTTP/1.1 503"), "{raw}");
    assert!(raw.contains("{\"error\":\"event_capacity_exceeded\"}"));
    // Queued, it would have waited for a lane (over a second): at once
    // means well before that.
    assert!(
        refused_at.elapsed() < Duration::from_millis(800),
        "refused at once"
    );

    let waited = waiter.await.unwrap();
    assert_eq!(waited.status, 200, "the waiter entered when a lane freed");
    assert!(queued_at.elapsed() >= Duration::from_millis(1000));
    for b in busy {
        assert_eq!(b.await.unwrap().status, 200);
    }
    let capacity = weir.receipt_where(|r| r["outcome"] == "capacity").await;
    assert!(
        capacity["generation"].is_null(),
        "refused requests never enter Wasm"
    );
    assert_eq!(capacity["bytes_in"], 0);

    // Service recovers fully.
    for _ in 0..20 {
        assert_eq!(weir.get("/hello").await.status, 200);
    }
    assert_eq!(weir.admin_get("/healthz").await.status, 200);
    assert_eq!(weir.status().await["apps"][0]["queue_depth"], 0);
}

#[tokio::test]
async fn waiter_whose_client_left_never_enters_wasm() {
    let weir = Weir::start(
        &probe(),
        &["--limit", "max_concurrent=1", "--limit", "max_queued=4"],
    );
    let busy = spawn_get(&weir, "/sleep?ms=400");
    tokio::time::sleep(Duration::from_millis(100)).await;
    {
        let mut s = TcpStream::connect(weir.addr).unwrap();
        s.write_all(b"GET /counter HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // The client leaves while queued.
    }
    assert_eq!(busy.await.unwrap().status, 200);
    let counter = weir.get("/counter").await;
    assert_eq!(
        counter.text(),
        "1",
        "the departed waiter never ran /counter"
    );
    assert_eq!(weir.status().await["apps"][0]["queue_depth"], 0);
}

#[tokio::test]
async fn waiter_whose_deadline_passed_never_enters_wasm() {
    let weir = Weir::start(
        &probe(),
        &[
            "--limit",
            "max_concurrent=1",
            "--limit",
            "max_queued=4",
            "--limit",
            "event_limit_ms=300",
        ],
    );
    // A streaming response holds the lane past the event deadline: after
    // headers only the session limit applies.
    let busy = spawn_get(&weir, "/stream?chunks=5&size=10&delay_ms=200");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let waiter = weir.get("/counter").await;
    waiter.assert_weir_error(503, "admission_deadline_exceeded");
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(busy.await.unwrap().status, 200);
    assert_eq!(weir.get("/counter").await.text(), "1");
}

#[tokio::test]
async fn burst_of_overload_then_full_recovery() {
    let weir = Weir::start(
        &probe(),
        &["--limit", "max_concurrent=2", "--limit", "max_queued=2"],
    );
    let burst: Vec<_> = (0..40).map(|_| spawn_get(&weir, "/sleep?ms=50")).collect();
    let mut ok = 0;
    let mut refused = 0;
    for b in burst {
        let resp = b.await.unwrap();
        match resp.status.as_u16() {
            200 => ok += 1,
            503 => {
                let code = resp.json()["error"].as_str().unwrap().to_string();
                assert!(
                    code == "event_capacity_exceeded" || code == "admission_deadline_exceeded",
                    "{code}"
                );
                refused += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert!(ok >= 4, "lanes and queue served some: {ok}");
    assert!(refused > 0, "overload was refused");
    for _ in 0..10 {
        assert_eq!(weir.get("/hello").await.status, 200);
    }
    let status = weir.status().await;
    assert_eq!(status["apps"][0]["queue_depth"], 0);
    assert!(
        status["apps"][0]["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["state"] == "idle")
    );
}
