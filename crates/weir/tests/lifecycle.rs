//! Generation lifecycle: retirement, abandonment on trap, deadlines,
//! failures after headers, cancellation by disconnect, memory limits.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{Weir, probe, rss_kib, thread_count};

#[tokio::test]
async fn retirement_gives_a_fresh_generation_after_64_events() {
    let weir = Weir::start(
        &probe(),
        &["--limit", "max_concurrent=1", "--receipt-headers"],
    );
    let first = weir.get("/counter").await;
    assert_eq!(first.text(), "1");
    let generation = first.generation();
    for expected in 2..=64 {
        let resp = weir.get("/counter").await;
        assert_eq!(resp.text(), expected.to_string());
        assert_eq!(resp.generation(), generation);
    }
    let fresh = weir.get("/counter").await;
    assert_eq!(fresh.text(), "1", "the 65th event sees fresh linear memory");
    assert_eq!(fresh.generation(), generation + 1);
    let status = weir.status().await;
    assert_eq!(status["apps"][0]["generations"]["retired"], 1);
    assert_eq!(status["apps"][0]["generations"]["abandoned"], 0);
}

/// A generation's memory holds nothing of the one before it: not its
/// stack, not its heap (grown pages), however its memory is reset — the
/// next generation of the lane reuses the same pooled slot.
#[tokio::test]
async fn a_retired_generation_leaves_nothing_in_memory_for_the_next() {
    let weir = Weir::start(
        &probe(),
        &["--limit", "max_concurrent=1", "--receipt-headers"],
    );
    let clean = weir.get("/scan").await;
    assert_eq!(clean.text(), "0", "a fresh instance holds no taint");
    let generation = clean.generation();
    assert_eq!(weir.get("/taint?kb=4096").await.status, 200);
    let tainted: usize = weir.get("/scan").await.text().parse().unwrap();
    assert!(
        tainted >= 1024,
        "the scan sees the heap it tainted (4 MiB = 1024 pages): {tainted}"
    );
    for _ in 4..=64 {
        assert_eq!(weir.get("/counter").await.generation(), generation);
    }
    let next = weir.get("/scan").await;
    assert_eq!(next.generation(), generation + 1, "retired after 64 events");
    assert_eq!(
        next.text(),
        "0",
        "nothing of the retired generation is left"
    );
}

#[tokio::test]
async fn retirement_limit_is_configurable() {
    let weir = Weir::start(
        &probe(),
        &[
            "--limit",
            "max_concurrent=1",
            "--limit",
            "retirement_admission_limit=1",
            "--receipt-headers",
        ],
    );
    let a = weir.get("/counter").await;
    let b = weir.get("/counter").await;
    assert_eq!((a.text(), b.text()), ("1".into(), "1".into()));
    assert_eq!(b.generation(), a.generation() + 1);
}

#[tokio::test]
async fn trap_abandons_the_generation_and_other_lanes_finish() {
    let weir = Weir::start(
        &probe(),
        &["--limit", "max_concurrent=3", "--receipt-headers"],
    );
    // Two slow requests occupy two other lanes while the trap happens.
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let url = weir.addr;
            tokio::spawn(async move {
                let req = http::Request::get("/sleep?ms=300")
                    .header("host", "x")
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap();
                common::send_to(url, req).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let trap = weir.get("/trap").await;
    trap.assert_weir_error(503, "instance_abandoned");
    for s in slow {
        let resp = s.await.unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(resp.text(), "slept\n");
    }
    let receipt = weir.receipt_where(|r| r["outcome"] == "trap").await;
    assert_eq!(receipt["error"], "instance_abandoned");
    let status = weir.status().await;
    assert_eq!(status["apps"][0]["generations"]["abandoned"], 1);
    // The trapped lane gets a fresh generation, and the app serves on.
    let trapped = receipt["generation"].as_u64().unwrap();
    let lane = receipt["lane"].as_u64().unwrap() as usize;
    let fresh = common::wait_for("a fresh generation on the trapped lane", || async {
        let status = weir.status().await;
        let l = &status["apps"][0]["lanes"][lane];
        match l["generation"].as_u64() {
            Some(g) if g > trapped && l["state"] == "idle" => Ok(g),
            _ => Err(l.to_string()),
        }
    })
    .await;
    assert!(fresh > trapped);
    let after = weir.get("/counter").await;
    assert_eq!(after.status, 200);
    assert_ne!(after.generation(), trapped);
}

#[tokio::test]
async fn infinite_loop_and_long_sleep_answer_503_near_the_deadline() {
    let weir = Weir::start(&probe(), &["--limit", "event_limit_ms=300"]);
    // The guest would sleep 20 s and loop forever: an answer well before
    // either can only come from the deadline. (How near it comes to 300 ms
    // is printed here and measured in bench/RESULTS.md, not asserted.)
    for path in ["/loop", "/sleep?ms=20000"] {
        let started = Instant::now();
        let resp = weir.get(path).await;
        let took = started.elapsed();
        resp.assert_weir_error(503, "event_deadline_exceeded");
        assert!(
            took >= Duration::from_millis(300),
            "{path} answered early: {took:?}"
        );
        assert!(
            took < Duration::from_secs(10),
            "{path} was not cut at its deadline: {took:?}"
        );
        println!("{path}: 503 after {took:?} (deadline 300 ms)");
        assert_eq!(weir.get("/hello").await.status, 200, "the lane recovers");
    }
    weir.count_receipts_where(2, |r| r["outcome"] == "deadline")
        .await;
}

#[tokio::test]
async fn trap_after_headers_is_a_failed_stream() {
    let weir = Weir::start(&probe(), &[]);
    let resp = weir.get("/trap-after-headers").await;
    assert_eq!(resp.status, 200, "headers were already sent");
    assert!(
        resp.body.is_err(),
        "the body must fail, not end cleanly: {:?}",
        resp.body
    );
    weir.receipt_where(|r| r["outcome"] == "trap").await;
    assert_eq!(weir.get("/hello").await.status, 200);
}

#[tokio::test]
async fn stall_after_headers_past_the_session_limit_is_a_failed_stream() {
    let weir = Weir::start(&probe(), &["--limit", "session_limit_ms=300"]);
    let started = Instant::now();
    let resp = weir.get("/stall-after-headers?ms=10000").await;
    assert_eq!(resp.status, 200);
    assert!(resp.body.is_err(), "{:?}", resp.body);
    assert!(started.elapsed() < Duration::from_secs(5));
    let r = weir.receipt_where(|r| r["outcome"] == "deadline").await;
    assert_eq!(r["status"], 200);
    assert_eq!(weir.get("/hello").await.status, 200);
}

/// Once the head is out, the session limit replaces the event limit,
/// even when it ends later: a body streamed past `event_limit_ms` but
/// within `session_limit_ms` comes out whole.
#[tokio::test]
async fn a_body_streamed_past_the_event_limit_within_the_session_limit_is_whole() {
    let weir = Weir::start(
        &probe(),
        &[
            "--limit",
            "event_limit_ms=300",
            "--limit",
            "session_limit_ms=10000",
        ],
    );
    let started = Instant::now();
    let resp = weir.get("/stream?chunks=10&size=100&delay_ms=100").await;
    assert_eq!(resp.status, 200);
    let body = resp.body.expect("the body ends cleanly");
    assert_eq!(body.len(), 1000);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "the body took its ten delays: {:?}",
        started.elapsed()
    );
    let r = weir.receipt_where(|r| r["status"] == 200).await;
    assert_eq!(r["outcome"], "ok", "{r}");
}

#[tokio::test]
async fn disconnect_cancels_and_abandons_after_the_cancellation_limit() {
    let weir = Weir::start(
        &probe(),
        &[
            "--limit",
            "cancellation_limit_ms=200",
            "--limit",
            "max_concurrent=1",
        ],
    );
    let mut s = std::net::TcpStream::connect(weir.addr).unwrap();
    s.write_all(b"GET /sleep?ms=20000 HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    weir.wait_busy(1).await;
    let left = Instant::now();
    drop(s);
    let receipt = weir.receipt_where(|r| r["outcome"] == "cancelled").await;
    assert_eq!(receipt["error"], "request_cancelled");
    let took = left.elapsed();
    assert!(
        took >= Duration::from_millis(200),
        "abandoned before the limit: {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "the guest was not left to sleep: {took:?}"
    );
    let status = weir.status().await;
    assert_eq!(status["apps"][0]["generations"]["abandoned"], 1);
    assert_eq!(weir.get("/hello").await.status, 200);
}

#[tokio::test]
async fn disconnect_mid_stream_cancels_the_session() {
    let weir = Weir::start(&probe(), &["--limit", "cancellation_limit_ms=200"]);
    let mut s = std::net::TcpStream::connect(weir.addr).unwrap();
    s.write_all(b"GET /stream?chunks=1000&size=1000&delay_ms=10 HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    drop(s);
    let receipt = weir.receipt_where(|r| r["outcome"] == "cancelled").await;
    assert_eq!(receipt["status"], 200);
    assert_eq!(weir.get("/hello").await.status, 200);
}

#[tokio::test]
async fn memory_growth_past_the_limit_fails_and_abandons() {
    let weir = Weir::start(&probe(), &["--limit", "memory_limit_bytes=16777216"]);
    let ok = weir.get("/grow?mb=4").await;
    assert_eq!(ok.status, 200);
    let resp = weir.get("/grow?mb=64").await;
    resp.assert_weir_error(503, "memory_limit_exceeded");
    let receipt = weir.receipt_where(|r| r["outcome"] == "limit").await;
    assert!(receipt["memory_bytes"].as_u64().unwrap() <= 16 << 20);
    let status = weir.status().await;
    assert_eq!(status["apps"][0]["generations"]["abandoned"], 1);
    // Repeated bombs leave the server's own memory bounded.
    let rss_before = rss_kib(weir.pid());
    for _ in 0..20 {
        weir.get("/grow?mb=64")
            .await
            .assert_weir_error(503, "memory_limit_exceeded");
    }
    let rss_after = rss_kib(weir.pid());
    println!("server RSS: {rss_before} KiB before 20 bombs, {rss_after} KiB after");
    assert!(
        rss_after < rss_before + 64 * 1024,
        "server memory grew by {} KiB",
        rss_after - rss_before
    );
    assert_eq!(weir.get("/hello").await.status, 200);
}

#[tokio::test]
async fn spinning_guests_are_stopped_without_a_thread_per_request() {
    let weir = Weir::start(
        &probe(),
        &[
            "--limit",
            "max_concurrent=8",
            "--limit",
            // Long enough that all 8 spin at once even on a loaded
            // machine (with 400 ms a slow start could miss the window).
            "event_limit_ms=2000",
        ],
    );
    assert_eq!(weir.get("/hello").await.status, 200);
    let idle = thread_count(weir.pid());
    let loops: Vec<_> = (0..8)
        .map(|_| get_in_background(weir.addr, "/loop"))
        .collect();
    // Sample while every lane is spinning.
    weir.wait_busy(8).await;
    let busy = thread_count(weir.pid());
    for l in loops {
        l.await
            .unwrap()
            .assert_weir_error(503, "event_deadline_exceeded");
    }
    assert!(
        busy <= idle,
        "8 spinning guests added threads: {idle} idle, {busy} busy"
    );
}

/// A `GET path` to `addr`, sent from a task of its own.
fn get_in_background(
    addr: std::net::SocketAddr,
    path: &str,
) -> tokio::task::JoinHandle<common::Resp> {
    let req = http::Request::get(path)
        .header("host", "x")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    tokio::spawn(common::send_to(addr, req))
}

/// Long computations take at most their share of the request workers:
/// with two workers, one. Three worker events and three actor turns that
/// compute until their deadline would each have held a worker for a slice
/// in every round of the scheduler, and every other request waited behind
/// all of them; now they take their slices in turn on one worker's worth,
/// the other is left to the calls that answer, and each still ends at its
/// own deadline.
#[tokio::test]
async fn long_computations_take_one_workers_share_and_leave_the_other_to_the_calls_that_answer() {
    let actor = format!("probe={}", common::guest("actor_probe").display());
    let weir = Weir::start_with_env(
        &[
            probe().to_str().unwrap(),
            "--actor",
            &actor,
            "--actor-route",
            "probe=/p",
            "--limit",
            "max_concurrent=8",
            "--limit",
            // Long enough to outlast the measuring on a loaded machine.
            "event_limit_ms=12000",
        ],
        &[("TOKIO_WORKER_THREADS", "2")],
    );
    assert_eq!(weir.get("/hello").await.status, 200);
    let pid = weir.pid();
    let long: Vec<_> = (0..3)
        .map(|_| get_in_background(weir.addr, "/loop"))
        .chain((0..3).map(|i| get_in_background(weir.addr, &format!("/p/spin{i}/loop"))))
        .collect();
    weir.wait_busy(3).await;
    // They wait for their slices in turn.
    common::wait_for("long computations waiting for a slice", || async {
        let share = weir.status().await["compute_share"].clone();
        if share["waiting"].as_u64().unwrap() >= 1 {
            Ok(())
        } else {
            Err(share.to_string())
        }
    })
    .await;
    let granted = weir.status().await["compute_share"]["slices_granted"]
        .as_u64()
        .unwrap();
    let workers = common::thread_ticks(pid, "weir-worker");
    let started = Instant::now();
    let mut answered = 0;
    while started.elapsed() < Duration::from_secs(4) {
        assert_eq!(weir.get("/hello").await.status, 200);
        answered += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let workers = common::thread_ticks(pid, "weir-worker") - workers;
    // Clock ticks are 10 ms: the wall time the workers could have used.
    let one_worker = started.elapsed().as_millis() as u64 / 10;
    let share = weir.status().await["compute_share"].clone();
    assert_eq!(share["slices_per_tick"], 1, "{share}");
    assert!(
        share["slices_granted"].as_u64().unwrap() > granted,
        "the long computations went on: {share}"
    );
    // Both workers computing would be two workers' time; the share is one,
    // plus what answering took.
    assert!(
        workers * 2 < one_worker * 3,
        "the workers spent {workers} ticks in {one_worker} ticks of wall time ({answered} answers)"
    );
    for call in long {
        call.await
            .unwrap()
            .assert_weir_error(503, "event_deadline_exceeded");
    }
    let share = weir.status().await["compute_share"].clone();
    assert_eq!(share["waiting"], 0, "{share}");
}

/// A `GET /sleep?ms=MS` to `addr`, sent from a task of its own.
fn sleep_in_background(
    addr: std::net::SocketAddr,
    ms: u64,
) -> tokio::task::JoinHandle<common::Resp> {
    get_in_background(addr, &format!("/sleep?ms={ms}"))
}

/// After a `SIGTERM`: the `/sleep` in flight is answered in full, and
/// then the server exits cleanly.
async fn the_sleep_is_answered_then_weir_exits(
    slow: tokio::task::JoinHandle<common::Resp>,
    weir: &mut Weir,
) {
    let resp = slow.await.unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "slept\n");
    let status = weir.wait_exit(Duration::from_secs(10)).expect("weir exits");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn sigterm_lets_in_flight_events_finish_then_exits() {
    let mut weir = Weir::start(&probe(), &[]);
    let addr = weir.addr;
    let slow = sleep_in_background(addr, 500);
    weir.wait_busy(1).await;
    weir.signal("TERM");
    the_sleep_is_answered_then_weir_exits(slow, &mut weir).await;
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn sigterm_closes_idle_keep_alive_connections_while_events_finish() {
    let mut weir = Weir::start(&probe(), &["--limit", "event_limit_ms=10000"]);
    let addr = weir.addr;
    // A keep-alive connection that has had its answer and now says nothing.
    let mut idle = std::net::TcpStream::connect(addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    idle.write_all(b"GET /counter HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.ends_with(b"\r\n\r\n1") {
        let n = idle.read(&mut buf).unwrap();
        assert!(n > 0, "the first answer comes whole");
        answer.extend_from_slice(&buf[..n]);
    }
    let slow = sleep_in_background(addr, 3000);
    weir.wait_busy(1).await;
    weir.signal("TERM");

    // The idle connection is closed by the shutdown itself, while the
    // event in flight still runs: not by the process going away after
    // the grace period.
    let (n, rest) = tokio::task::spawn_blocking(move || {
        let n = idle
            .read(&mut buf)
            .expect("the idle connection is closed, not left open");
        (n, buf[..n].to_vec())
    })
    .await
    .unwrap();
    assert_eq!(n, 0, "nothing but the close: {rest:?}");
    assert!(!slow.is_finished(), "the idle connection closed first");
    the_sleep_is_answered_then_weir_exits(slow, &mut weir).await;
    assert!(
        !weir.log().contains("shutdown grace passed"),
        "{}",
        weir.log()
    );
}

/// Connections the kernel completed while the server could not take them
/// (here, while it was stopped, the moment it said it serves), each with
/// its request sent, are served at a `SIGTERM`, not reset when the
/// listener closes.
#[tokio::test]
async fn sigterm_serves_the_connections_waiting_in_the_backlog() {
    const WAITING: usize = 40;
    let mut weir = Weir::start(&probe(), &[]);
    let addr = weir.addr;
    weir.signal("STOP");
    // Stopped the moment it says it serves, it already catches SIGTERM and
    // SIGINT (their default action would end it with no graceful stop).
    let status = std::fs::read_to_string(format!("/proc/{}/status", weir.pid())).unwrap();
    let caught = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .map(|mask| u64::from_str_radix(mask.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(caught & (1 << (15 - 1)), 1 << (15 - 1), "SIGTERM is caught");
    assert_eq!(caught & (1 << (2 - 1)), 1 << (2 - 1), "SIGINT is caught");
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..WAITING)
        .map(|_| {
            let sent = sent.clone();
            std::thread::spawn(move || {
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                c.write_all(b"GET /counter HTTP/1.1\r\nhost: x\r\n\r\n")
                    .unwrap();
                sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut answer = Vec::new();
                let ended = c.read_to_end(&mut answer);
                (ended.map_err(|e| e.kind()), answer)
            })
        })
        .collect();
    // Every request is in the server's socket buffers before it wakes (a
    // connection that has sent nothing yet is closed like an idle one).
    let deadline = Instant::now() + Duration::from_secs(30);
    while sent.load(std::sync::atomic::Ordering::SeqCst) < WAITING {
        assert!(Instant::now() < deadline, "the clients connected and sent");
        std::thread::sleep(Duration::from_millis(10));
    }
    weir.signal("TERM");
    weir.signal("CONT");
    for client in clients {
        let (ended, answer) = client.join().unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(ended.is_ok(), "{ended:?} after {answer:?}");
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    }
    let status = weir.wait_exit(Duration::from_secs(10)).expect("weir exits");
    assert!(status.success(), "{status:?}");
}

/// Sends `request` on a connection its client drops while the guest runs
/// (with 3 s of cancellation grace), and checks that the guest finished
/// in its grace: the receipt says `cancelled`, nothing was abandoned, and
/// the same generation (and its memory) serves on.
async fn client_leaves_and_the_guest_finishes_in_its_grace(request: &[u8]) {
    let weir = Weir::start(
        &probe(),
        &[
            "--limit",
            "cancellation_limit_ms=3000",
            "--limit",
            "max_concurrent=1",
            "--receipt-headers",
        ],
    );
    let before = weir.get("/counter").await;
    let mut s = std::net::TcpStream::connect(weir.addr).unwrap();
    s.write_all(request).unwrap();
    weir.wait_busy(1).await;
    drop(s);
    let receipt = weir.receipt_where(|r| r["outcome"] == "cancelled").await;
    assert_eq!(receipt["error"], "request_cancelled");
    assert_eq!(
        weir.status().await["apps"][0]["generations"]["abandoned"],
        0,
        "{}",
        weir.log()
    );
    let after = weir.get("/counter").await;
    assert_eq!(after.generation(), before.generation());
    assert_eq!(after.text(), "2");
}

#[tokio::test]
async fn a_cancelled_guest_that_finishes_in_time_keeps_its_generation() {
    client_leaves_and_the_guest_finishes_in_its_grace(
        b"GET /sleep?ms=300 HTTP/1.1\r\nhost: x\r\n\r\n",
    )
    .await;
}

#[tokio::test]
async fn a_guest_whose_client_left_writes_its_body_in_its_grace_and_keeps_its_generation() {
    // The guest sets its response after the client has left, then writes
    // its body in three chunks with a wait between them: the host sees the
    // response while the guest still has a body to write, and its writes
    // must not fail.
    client_leaves_and_the_guest_finishes_in_its_grace(
        b"GET /stream?wait_ms=300&chunks=3&size=100&delay_ms=20 HTTP/1.1\r\nhost: x\r\n\r\n",
    )
    .await;
}
