//! Admission and the wait queue under overload. Lanes are held busy by
//! requests that wait at a hold server until the test lets them go, so
//! each step waits for the state it needs instead of guessing a schedule.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{HoldServer, Weir, probe, send_to, wait_for};
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

/// Starts `n` requests that hold a lane each until `hold` is released.
async fn hold_lanes(
    weir: &Weir,
    hold: &HoldServer,
    n: usize,
) -> Vec<tokio::task::JoinHandle<common::Resp>> {
    let busy: Vec<_> = (0..n)
        .map(|_| spawn_get(weir, &format!("/fetch?url={}", hold.url())))
        .collect();
    hold.wait_arrived(n).await;
    busy
}

async fn wait_queue_depth(weir: &Weir, n: u64) {
    wait_for(&format!("queue depth {n}"), || async {
        let depth = weir.status().await["apps"][0]["queue_depth"].clone();
        if depth == n {
            Ok(())
        } else {
            Err(depth.to_string())
        }
    })
    .await
}

async fn assert_held_ok(busy: Vec<tokio::task::JoinHandle<common::Resp>>) {
    for b in busy {
        let r = b.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "released");
    }
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
            "event_limit_ms=30000",
            "--allow-outbound",
            "http://127.0.0.1:*",
        ],
    );
    let hold = HoldServer::start(None);
    let busy = hold_lanes(&weir, &hold, 2).await;
    let waiter = spawn_get(&weir, "/hello");
    wait_queue_depth(&weir, 1).await;

    // The fourth declares a body it never sends: an answer proves Weir did
    // not wait to read it, and it comes while both lanes are still held,
    // so it did not wait for a lane either.
    let mut s = TcpStream::connect(weir.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    let raw = String::from_utf8_lossy(&buf[..n]);
    assert!(raw.starts_with("HTTP/1.1 503"), "{raw}");
    assert!(raw.contains("{\"error\":\"event_capacity_exceeded\"}"));
    assert!(!waiter.is_finished(), "the waiter still waits for a lane");
    assert_eq!(weir.status().await["apps"][0]["queue_depth"], 1);

    hold.release();
    let waited = waiter.await.unwrap();
    assert_eq!(waited.status, 200, "the waiter entered when a lane freed");
    assert_held_ok(busy).await;
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
        &[
            "--limit",
            "max_concurrent=1",
            "--limit",
            "max_queued=4",
            "--limit",
            "event_limit_ms=30000",
            "--allow-outbound",
            "http://127.0.0.1:*",
        ],
    );
    let hold = HoldServer::start(None);
    let busy = hold_lanes(&weir, &hold, 1).await;
    {
        let mut s = TcpStream::connect(weir.addr).unwrap();
        s.write_all(b"GET /counter HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        wait_queue_depth(&weir, 1).await;
        // The client leaves while queued.
    }
    wait_queue_depth(&weir, 0).await;
    hold.release();
    assert_held_ok(busy).await;
    let counter = weir.get("/counter").await;
    assert_eq!(
        counter.text(),
        "1",
        "the departed waiter never ran /counter"
    );
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
            "--limit",
            "session_limit_ms=60000",
        ],
    );
    // A streaming response holds the lane past the event deadline: after
    // headers only the session limit applies.
    let busy = spawn_get(&weir, "/stream?chunks=50&size=10&delay_ms=200");
    weir.wait_busy(1).await;
    let waiter = weir.get("/counter").await;
    waiter.assert_weir_error(503, "admission_deadline_exceeded");
    assert!(!busy.is_finished(), "the lane was held all along");
    assert_eq!(busy.await.unwrap().status, 200);
    assert_eq!(weir.get("/counter").await.text(), "1");
}

#[tokio::test]
async fn burst_of_overload_then_full_recovery() {
    let weir = Weir::start(
        &probe(),
        &[
            "--limit",
            "max_concurrent=2",
            "--limit",
            "max_queued=2",
            "--limit",
            "event_limit_ms=30000",
            "--allow-outbound",
            "http://127.0.0.1:*",
        ],
    );
    let hold = HoldServer::start(None);
    let busy = hold_lanes(&weir, &hold, 2).await;
    // 40 more at once: two wait in the queue, the rest are refused at once.
    let refused = Arc::new(Mutex::new(Vec::new()));
    let burst: Vec<_> = (0..40)
        .map(|_| {
            let (addr, refused) = (weir.addr, refused.clone());
            tokio::spawn(async move {
                let req = Request::get("/hello")
                    .header("host", "x")
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let r = send_to(addr, req).await;
                if r.status == 503 {
                    refused
                        .lock()
                        .unwrap()
                        .push(r.json()["error"].as_str().unwrap().to_string());
                }
                r.status.as_u16()
            })
        })
        .collect();
    wait_for("38 refusals", || async {
        let n = refused.lock().unwrap().len();
        if n >= 38 {
            Ok(())
        } else {
            Err(format!("{n} refused"))
        }
    })
    .await;
    assert!(
        refused
            .lock()
            .unwrap()
            .iter()
            .all(|code| code == "event_capacity_exceeded")
    );
    assert_eq!(weir.status().await["apps"][0]["queue_depth"], 2);
    hold.release();
    assert_held_ok(busy).await;
    let mut statuses: Vec<u16> = Vec::new();
    for b in burst {
        statuses.push(b.await.unwrap());
    }
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 2);
    assert_eq!(statuses.iter().filter(|s| **s == 503).count(), 38);
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
