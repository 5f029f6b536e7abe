//! Durable actors from outside, their turns and storage: a real `weir
//! serve` with the `gateway` worker in front of the `actor-probe` class,
//! real SQLite files, SIGKILL. Timers are in `actor_timers.rs`, residency
//! and the operators' view in `actor_residency.rs`.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::Value;

use common::actors::*;
use common::{HoldServer, Weir, send_to, try_send_to, wait_for};

/// When a receipt's turn held the actor: (start, end) in µs since the
/// epoch; the receipt is written as the turn ends, and says how long it
/// waited before it began.
fn turn_span(r: &Value) -> (u128, u128) {
    let end = humantime::parse_rfc3339(r["timestamp"].as_str().unwrap())
        .unwrap()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let held = r["total_us"].as_u64().unwrap() - r["queued_us"].as_u64().unwrap();
    (end - held as u128, end)
}

#[tokio::test]
async fn concurrent_increments_lose_no_update_and_actors_run_in_parallel() {
    let dir = data_dir("counter");
    // Turns that wait at a barrier are held as long as the barrier takes.
    let weir = Arc::new(start(
        &dir,
        &[
            "--allow-outbound",
            "http://127.0.0.1:*",
            "--limit",
            "event_limit_ms=30000",
        ],
    ));
    const CONNECTIONS: usize = 50;
    const PER_CONNECTION: usize = 40;
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let weir = weir.clone();
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..PER_CONNECTION {
                let r = post(&weir, "/probe/hot/incr", Vec::new()).await;
                assert_eq!(r.status, 200, "{:?}", r.body);
                seen.push(r.text().parse::<u64>().unwrap());
            }
            seen
        }));
    }
    let mut all = BTreeSet::new();
    for t in tasks {
        for n in t.await.unwrap() {
            assert!(all.insert(n), "value {n} handed out twice");
        }
    }
    let total = (CONNECTIONS * PER_CONNECTION) as u64;
    assert_eq!(
        all,
        (1..=total).collect(),
        "every increment got its own value"
    );
    assert_eq!(
        weir.get("/probe/hot/get?key=n").await.text(),
        total.to_string()
    );

    // Four actors run their turns at the same time: each turn waits at a
    // barrier that opens only when all four are inside their turns at once
    // (it would answer `timeout` after a minute otherwise). Four turns of
    // one actor never overlap.
    let barrier = HoldServer::start(Some(4));
    let mut parallel = Vec::new();
    for actor in ["p1", "p2", "p3", "p4"] {
        let weir = weir.clone();
        let path = format!("/probe/{actor}/gate?port={}", barrier.port);
        parallel.push(tokio::spawn(
            async move { post(&weir, &path, Vec::new()).await },
        ));
    }
    let mut solo = Vec::new();
    for _ in 0..4 {
        let weir = weir.clone();
        solo.push(tokio::spawn(async move {
            post(&weir, "/probe/solo/sleep?ms=200", Vec::new())
                .await
                .status
        }));
    }
    for p in parallel {
        let r = p.await.unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.text(), "released", "the four turns were in at once");
    }
    for s in solo {
        assert_eq!(s.await.unwrap(), 200);
    }
    let mut solo: Vec<_> = weir
        .actor_receipts_where(4, |r| r["name"] == "solo" && r["status"] == 200)
        .await
        .iter()
        .map(turn_span)
        .collect();
    solo.sort();
    for pair in solo.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "turns of one actor never overlap: {solo:?}"
        );
    }
}

#[tokio::test]
async fn a_trap_mid_turn_leaves_nothing_and_the_next_call_is_a_fresh_incarnation() {
    let dir = data_dir("trap");
    let weir = start(
        &dir,
        &[
            "--limit",
            "event_limit_ms=500",
            "--limit",
            "memory_limit_bytes=33554432",
        ],
    );
    let first = incarnation(&weir, "t").await;
    post(&weir, "/probe/t/write-then-trap", Vec::new())
        .await
        .assert_weir_error(503, "instance_abandoned");
    assert_eq!(weir.get("/probe/t/get?key=trapped").await.status, 404);
    let second = incarnation(&weir, "t").await;
    assert!(second > first, "{second} > {first}");

    // A sync inside the turn makes what came before it durable; the rest
    // of the trapped turn is gone.
    post(&weir, "/probe/t/sync-then-trap", Vec::new())
        .await
        .assert_weir_error(503, "instance_abandoned");
    assert_eq!(weir.get("/probe/t/get?key=before").await.text(), "1");
    assert_eq!(weir.get("/probe/t/get?key=after").await.status, 404);

    // A turn that never returns is cut at the deadline, the same way.
    post(&weir, "/probe/t/loop", Vec::new())
        .await
        .assert_weir_error(503, "event_deadline_exceeded");
    weir.actor_receipt_where(|r| r["name"] == "t" && r["error"] == "event_deadline_exceeded")
        .await;
    let third = incarnation(&weir, "t").await;
    assert!(third > second, "{third} > {second}");
    let r = weir
        .actor_receipt_where(|r| r["error"] == "instance_abandoned")
        .await;
    assert_eq!(r["class"], "probe");
    assert_eq!(r["name"], "t");

    // Memory lives in the instance between turns, and past the limit the
    // instance is abandoned like a worker's.
    assert_eq!(post(&weir, "/probe/t/memory", Vec::new()).await.text(), "1");
    assert_eq!(post(&weir, "/probe/t/memory", Vec::new()).await.text(), "2");
    post(&weir, "/probe/t/grow?mb=64", Vec::new())
        .await
        .assert_weir_error(503, "memory_limit_exceeded");
    assert_eq!(
        post(&weir, "/probe/t/memory", Vec::new()).await.text(),
        "1",
        "a fresh instance"
    );
    assert_eq!(
        weir.get("/probe/t/get?key=before").await.text(),
        "1",
        "storage stays"
    );
}

#[tokio::test]
async fn a_commit_that_fails_resets_the_actor_and_keeps_none_of_the_turn() {
    let dir = data_dir("commit");
    let weir = start(&dir, &[]);
    assert_eq!(post(&weir, "/probe/c/incr", Vec::new()).await.text(), "1");
    let before = incarnation(&weir, "c").await;
    // The turn leaves a deferred foreign key broken: SQLite refuses the
    // commit at the turn's end.
    post(&weir, "/probe/c/fk-violation", Vec::new())
        .await
        .assert_weir_error(503, "storage_commit_failed");
    assert_eq!(weir.get("/probe/c/get?key=fk").await.status, 404);
    assert_eq!(weir.get("/probe/c/get?key=n").await.text(), "1");
    let after = incarnation(&weir, "c").await;
    assert!(after > before, "reset: {after} > {before}");
    let r = weir
        .actor_receipt_where(|r| r["error"] == "storage_commit_failed")
        .await;
    assert!(r["detail"].as_str().unwrap().contains("FOREIGN KEY"), "{r}");
}

#[tokio::test]
async fn the_output_gate_holds_outbound_requests_until_earlier_writes_are_durable() {
    use std::io::Read;

    let dir = data_dir("gate");
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = upstream.local_addr().unwrap().port();
    let allow = format!("http://127.0.0.1:{port}");
    let weir = start(&dir, &["--allow-outbound", &allow]);
    // The moment the actor's outbound request arrives, the server is
    // killed: whatever the turn wrote before it must already be on disk.
    let pid = weir.pid();
    upstream.set_nonblocking(true).unwrap();
    let killer = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut stream = loop {
            match upstream.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "the actor's request never came");
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        stream.set_nonblocking(false).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut head = [0u8; 1024];
        let n = stream.read(&mut head).unwrap();
        assert!(String::from_utf8_lossy(&head[..n]).starts_with("GET / HTTP/1.1"));
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
    });
    let weir = Arc::new(weir);
    let call = {
        let weir = weir.clone();
        tokio::spawn(async move {
            let addr = weir.addr;
            let req = Request::post(format!("/probe/g/gate?port={port}"))
                .header("host", addr.to_string())
                .body(Full::new(Bytes::new()))
                .unwrap();
            send_to(addr, req).await
        })
    };
    tokio::task::spawn_blocking(move || killer.join().unwrap())
        .await
        .unwrap();
    assert!(
        call.await.is_err(),
        "the client got no answer from the killed server"
    );
    drop(weir);
    let weir = start(&dir, &[]);
    assert_eq!(weir.get("/probe/g/get?key=gate").await.text(), "1");
}

/// Milliseconds a pair write waits between its two writes, so that a kill
/// often lands between them: a turn that committed its first write alone
/// would then be seen as half applied.
const PAIR_GAP_MS: u64 = 5;

/// One writer's pair writes until the server is killed. Every answer must
/// be the acknowledgement of its write; the only failure allowed is a
/// transport error after `killed` is set.
async fn write_pairs(
    weir: Arc<Weir>,
    actor: String,
    next: Arc<AtomicU64>,
    acked: Arc<std::sync::Mutex<Vec<u64>>>,
    killed: Arc<std::sync::atomic::AtomicBool>,
) -> Result<(), String> {
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let addr = weir.addr;
        let req = Request::post(format!("/probe/{actor}/pair?i={i}&gap_ms={PAIR_GAP_MS}"))
            .header("host", addr.to_string())
            .body(Full::new(Bytes::new()))
            .unwrap();
        match try_send_to(addr, req).await {
            Ok(r) if r.status == 200 && r.body.as_deref() == Ok(i.to_string().as_bytes()) => {
                acked.lock().unwrap().push(i)
            }
            // A response cut mid-body by the kill.
            Ok(r) if r.body.is_err() && killed.load(Ordering::SeqCst) => return Ok(()),
            Ok(r) => {
                return Err(format!(
                    "{actor}: write {i} answered {} {:?}",
                    r.status, r.body
                ));
            }
            Err(_) if killed.load(Ordering::SeqCst) => return Ok(()),
            Err(e) => return Err(format!("{actor}: write {i} failed before the kill: {e}")),
        }
    }
}

#[tokio::test]
async fn acknowledged_writes_survive_sigkill_and_no_turn_is_half_applied() {
    const CYCLES: u64 = 20;
    const ACTORS: [&str; 4] = ["k0", "k1", "k2", "k3"];
    let dir = data_dir("sigkill");
    let acked: HashMap<&str, Arc<std::sync::Mutex<Vec<u64>>>> = ACTORS
        .iter()
        .map(|a| (*a, Arc::new(std::sync::Mutex::new(Vec::new()))))
        .collect();
    let next: HashMap<&str, Arc<AtomicU64>> = ACTORS
        .iter()
        .map(|a| (*a, Arc::new(AtomicU64::new(0))))
        .collect();
    let total_acked = |acked: &HashMap<&str, Arc<std::sync::Mutex<Vec<u64>>>>| {
        acked
            .values()
            .map(|a| a.lock().unwrap().len())
            .sum::<usize>()
    };
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut cycles_with_writes = 0;
    for _ in 0..CYCLES {
        let weir = Arc::new(start(&dir, &[]));
        // Everything acknowledged before the last kill is still there,
        // and every turn left both of its keys or neither.
        for actor in ACTORS {
            let so_far = acked[actor].lock().unwrap().clone();
            check_pairs(&weir, actor, &so_far).await;
        }
        let before = total_acked(&acked);
        let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = ACTORS
            .iter()
            .map(|a| {
                tokio::spawn(write_pairs(
                    weir.clone(),
                    a.to_string(),
                    next[a].clone(),
                    acked[a].clone(),
                    killed.clone(),
                ))
            })
            .collect();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let wait = 50 + seed % 200;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        killed.store(true, Ordering::SeqCst);
        weir.signal("KILL");
        for w in writers {
            w.await.unwrap().unwrap();
        }
        if total_acked(&acked) > before {
            cycles_with_writes += 1;
        }
    }
    let weir = start(&dir, &[]);
    for actor in ACTORS {
        let acked = acked[actor].lock().unwrap().clone();
        check_pairs(&weir, actor, &acked).await;
    }
    let total = total_acked(&acked);
    eprintln!(
        "{CYCLES} SIGKILL cycles ({cycles_with_writes} with acknowledged writes), {total} acknowledged pair writes checked"
    );
    assert!(
        cycles_with_writes * 2 > CYCLES,
        "most cycles acknowledge writes: {cycles_with_writes} of {CYCLES}"
    );
}

async fn check_pairs(weir: &Weir, actor: &str, acked: &[u64]) {
    let r = weir.get(&format!("/probe/{actor}/pairs")).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let v = r.json();
    let x: BTreeSet<u64> = serde_json::from_value(v["x"].clone()).unwrap();
    let y: BTreeSet<u64> = serde_json::from_value(v["y"].clone()).unwrap();
    assert_eq!(x, y, "{actor}: a turn was half applied");
    for i in acked {
        assert!(x.contains(i), "{actor}: acknowledged write {i} lost");
    }
}

#[tokio::test]
async fn limits_value_size_queue_overflow_and_reserved_tables() {
    let dir = data_dir("limits");
    let weir = Arc::new(start(
        &dir,
        &[
            "--limit",
            "max_request_body_bytes=8388608",
            "--limit",
            "actor_max_queued=2",
            "--limit",
            "event_limit_ms=30000",
            "--allow-outbound",
            "http://127.0.0.1:*",
            "--limit",
            "max_response_body_bytes=100000",
            // No hibernation between the calls: incarnations are counted.
            "--limit",
            "actor_idle_ms=600000",
        ],
    ));
    // A response over the limit is refused, and its turn rolled back.
    assert_eq!(
        post(&weir, "/probe/l/large?bytes=100000", Vec::new())
            .await
            .text()
            .len(),
        100_000
    );
    post(&weir, "/probe/l/large?bytes=100001", Vec::new())
        .await
        .assert_weir_error(502, "response_body_too_large");
    assert_eq!(weir.get("/probe/l/get?key=large").await.text(), "100000");
    // An entry is at most 2 MiB, key included.
    const LIMIT: usize = 2 << 20;
    let r = post(&weir, "/probe/l/put?key=k", vec![b'v'; LIMIT - 1]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = post(&weir, "/probe/l/put?key=k2", vec![b'v'; LIMIT - 1]).await;
    assert_eq!(r.status, 413);
    assert!(
        r.text().contains("2097152"),
        "the limit is named: {}",
        r.text()
    );
    assert_eq!(weir.get("/probe/l/get?key=k2").await.status, 404);
    // One oversized entry in a batch of small ones: none of the batch is
    // written. (The same batch without it is.)
    let r = post(&weir, "/probe/l/put-many?n=3&bytes=10&big=2", Vec::new()).await;
    assert_eq!(r.status, 413, "{:?}", r.body);
    for i in 0..3 {
        let got = weir.get(&format!("/probe/l/get?key=many:{i}")).await;
        assert_eq!(got.status, 404, "many:{i} was written");
    }
    let r = post(&weir, "/probe/l/put-many?n=3&bytes=10", Vec::new()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        weir.get("/probe/l/get?key=many:1").await.text(),
        "m".repeat(10)
    );

    // User SQL works on its own tables and is refused on Weir's. (The
    // refused response above may or may not have cut its guest short,
    // depending on who ran first; count incarnations from here.)
    let before = incarnation(&weir, "l").await;
    let sql = |q: &str| post(&weir, "/probe/l/sql", q.as_bytes().to_vec());
    assert_eq!(sql("CREATE TABLE t (a INTEGER)").await.status, 200);
    let r = sql("INSERT INTO t VALUES (1), (2)").await;
    assert_eq!(r.json()["rows_written"], 2);
    let r = sql("SELECT sum(a) AS s FROM t").await;
    assert_eq!(r.json()["rows"][0][0], 3);
    for refused in [
        "SELECT * FROM _weir_kv",
        "DELETE FROM _weir_timers",
        "UPDATE _weir_meta SET value = 0",
        "PRAGMA foreign_keys = OFF",
        "ATTACH DATABASE '/tmp/x' AS x",
    ] {
        let r = sql(refused).await;
        assert_eq!(r.status, 403, "{refused}: {:?}", r.body);
    }
    assert_eq!(
        incarnation(&weir, "l").await,
        before,
        "refusals do not reset the actor"
    );

    // One turn runs (held open at an upstream until the test lets it go),
    // two wait, and the rest are refused at once.
    let hold = HoldServer::start(None);
    let holder = {
        let weir = weir.clone();
        let path = format!("/probe/busy/gate?port={}", hold.port);
        tokio::spawn(async move { post(&weir, &path, Vec::new()).await })
    };
    hold.wait_arrived(1).await;
    let answers = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut calls = Vec::new();
    for _ in 0..9 {
        let (weir, answers) = (weir.clone(), answers.clone());
        calls.push(tokio::spawn(async move {
            let r = post(&weir, "/probe/busy/incr", Vec::new()).await;
            answers.lock().unwrap().push(r.status.as_u16());
            r
        }));
    }
    // The refused ones answer while the turn is still held; the two that
    // wait cannot answer before it ends.
    wait_for("seven refusals", || async {
        let n = answers.lock().unwrap().len();
        if n >= 7 {
            Ok(())
        } else {
            Err(format!("{n} answered"))
        }
    })
    .await;
    assert_eq!(*answers.lock().unwrap(), vec![503; 7]);
    hold.release();
    let r = holder.await.unwrap();
    assert_eq!(r.text(), "released");
    let (mut ok, mut overloaded) = (1, 0);
    for c in calls {
        let r = c.await.unwrap();
        match r.status.as_u16() {
            200 => ok += 1,
            503 => {
                r.assert_weir_error(503, "actor_overloaded");
                overloaded += 1;
            }
            other => panic!("unexpected {other}: {:?}", r.body),
        }
    }
    assert_eq!((ok, overloaded), (3, 7));
    let status = weir.admin_get("/actors").await.json();
    assert_eq!(status["status"]["overloaded"], 7);
    let metrics = weir.admin_get("/metrics").await.text();
    assert!(
        metrics.contains(r#"weir_actor_events_total{class="probe",event="overloaded"} 7"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"weir_actor_turns_total{class="probe",turn="request",result="ok"}"#)
    );
}

#[tokio::test]
async fn unknown_classes_and_bad_addresses_are_named() {
    let dir = data_dir("address");
    let weir = start(&dir, &[]);
    weir.get("/nope/a/x")
        .await
        .assert_weir_error(404, "actor_class_unknown");
    // The gateway takes the name from its path: weir-guest checks it before
    // building the address, so it never leaves the guest.
    let r = weir.get("/probe/a..b/x").await;
    assert_eq!(r.status, 502);
    assert!(
        r.headers["x-call-error"]
            .to_str()
            .unwrap()
            .contains("actor name `a..b`"),
        "{:?}",
        r.headers
    );
    // What reaches the host is checked there too (see hostile.rs for hosts
    // built by hand); through a route, the path's name is checked alike.
}

#[tokio::test]
async fn a_caller_that_leaves_before_its_turn_never_enters_wasm() {
    let dir = data_dir("leaves");
    let weir = Arc::new(start(
        &dir,
        &[
            "--allow-outbound",
            "http://127.0.0.1:*",
            "--limit",
            "event_limit_ms=30000",
            "--actor-route",
            "probe=/direct",
        ],
    ));
    let hold = HoldServer::start(None);
    let holder = {
        let weir = weir.clone();
        let path = format!("/probe/w/gate?port={}", hold.port);
        tokio::spawn(async move { post(&weir, &path, Vec::new()).await })
    };
    hold.wait_arrived(1).await;
    // Two callers queue behind the held turn, one through the app and one
    // through the actor route, and leave before their turns come.
    let mut leavers = Vec::new();
    for path in ["/probe/w/incr", "/direct/w/incr"] {
        let mut s = std::net::TcpStream::connect(weir.addr).unwrap();
        use std::io::Write;
        write!(
            s,
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
        )
        .unwrap();
        leavers.push(s);
    }
    let waiting = || async {
        let list = weir.admin_get("/actors/probe").await.json();
        list["actors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == "w")
            .map(|a| a["waiting"].as_u64().unwrap())
            .unwrap_or(0)
    };
    wait_for("two callers waiting behind the held turn", || async {
        let n = waiting().await;
        if n == 2 {
            Ok(())
        } else {
            Err(format!("{n} waiting"))
        }
    })
    .await;
    drop(leavers);
    // They stay queued, marked as gone, and are skipped at their turn.
    wait_for("the callers that left to be seen gone", || async {
        let n = waiting().await;
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} waiting"))
        }
    })
    .await;
    hold.release();
    assert_eq!(holder.await.unwrap().text(), "released");
    // Neither incr ran: n was never written, and only the holder's turn
    // (and the reads below) left receipts.
    assert_eq!(weir.get("/probe/w/get?key=n").await.status, 404);
    let turns = weir
        .actor_receipts_where(2, |r| r["name"] == "w" && r["turn"] == "request")
        .await;
    assert_eq!(
        (&turns[0]["status"], &turns[1]["status"]),
        (&200.into(), &404.into())
    );
}

#[tokio::test]
async fn an_actor_that_returns_without_a_response_gets_a_fresh_instance_and_keeps_its_storage() {
    let dir = data_dir("no-response");
    let weir = start(&dir, &[]);
    assert_eq!(weir.get("/probe/n/incr").await.text(), "1");
    // One instance serves turn after turn: its in-memory counter grows.
    assert_eq!(weir.get("/probe/n/memory").await.text(), "1");
    assert_eq!(weir.get("/probe/n/memory").await.text(), "2");
    weir.get("/probe/n/no-response")
        .await
        .assert_weir_error(502, "invalid_response");
    // The next turn runs on a fresh instance; the database is the same.
    assert_eq!(weir.get("/probe/n/memory").await.text(), "1");
    assert_eq!(weir.get("/probe/n/incr").await.text(), "2");
    let metrics = weir.admin_get("/metrics").await.text();
    assert!(
        metrics.contains(r#"weir_generations_total{app="actor:probe",event="retired"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"weir_generations_total{app="actor:probe",event="abandoned"} 0"#),
        "{metrics}"
    );
}
