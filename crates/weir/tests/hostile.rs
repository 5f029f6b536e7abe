//! A hostile tenant, from outside: the `hostile` guest (as the app and as
//! an actor class) tries every door — SQL escapes, runaway queries, memory
//! and table bombs, names that do not fit a file system, slow bodies, the
//! admin address, a second server on the same data dir — against a real
//! `weir serve`. Each test names what must hold.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{HoldServer, Weir, guest, root, send_to, wait_for};
use http::Request;
use http_body_util::Full;
use serde_json::{Value, json};

fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-hostile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The hostile guest as the app and as actor class `hostile` (route `/h`),
/// next to the `probe` class (route `/p`): the victim.
fn start(dir: &Path, extra: &[&str]) -> Weir {
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
    Weir::start_with(&args)
}

async fn post_json(weir: &Weir, path: &str, body: Value) -> common::Resp {
    weir.send(
        Request::post(path)
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap(),
    )
    .await
}

/// One `weir:sql` batch through the hostile worker: the guest's view.
async fn sql(weir: &Weir, statements: &[&str]) -> Value {
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
async fn exec(weir: &Weir, name: &str, statements: &[&str]) -> Vec<Value> {
    let r = post_json(weir, &format!("/h/{name}/exec"), json!(statements)).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.json().as_array().unwrap().clone()
}

fn proc_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Starts the peak RSS (`VmHWM`) over from now.
fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}

#[tokio::test]
async fn sql_through_weir_sql_reaches_nothing_but_its_own_database() {
    let dir = data_dir("sql-escape");
    let weir = start(&dir, &[]);
    // The victim: another actor's data.
    assert_eq!(weir.get("/p/victim/incr").await.text(), "1");
    let victim = dir.join("actors/probe/victim.sqlite3");
    let stolen = dir.join("stolen.sqlite3");
    let attach = format!("ATTACH DATABASE '{}' AS v", victim.display());
    let vacuum = format!("VACUUM INTO '{}'", stolen.display());
    // The attacks of the issue, as one batch and one by one.
    let r = sql(
        &weir,
        &[
            "COMMIT",
            &attach,
            "BEGIN",
            "SELECT key, value FROM v._weir_kv",
        ],
    )
    .await;
    assert_refused(&r, "statement 0", "COMMIT");
    for (statement, named) in [
        (attach.as_str(), "ATTACH"),
        ("DETACH DATABASE main", "DETACH"),
        (vacuum.as_str(), "VACUUM"),
        ("VACUUM", "VACUUM"),
        ("SELECT load_extension('/tmp/x')", "load_extension"),
        ("PRAGMA journal_mode = DELETE", "journal_mode"),
        (
            "PRAGMA temp_store_directory = '/tmp'",
            "temp_store_directory",
        ),
        ("PRAGMA writable_schema = 1", "writable_schema"),
        ("BEGIN", "BEGIN"),
        ("ROLLBACK", "ROLLBACK"),
        ("SAVEPOINT s", "SAVEPOINT"),
        ("RELEASE s", "RELEASE"),
        ("CREATE TEMP TABLE t (a)", "temporary"),
        (
            "CREATE TEMP TRIGGER tt AFTER INSERT ON mine BEGIN SELECT 1; END",
            "temporary",
        ),
    ] {
        let r = sql(&weir, &["CREATE TABLE IF NOT EXISTS mine (a)", statement]).await;
        assert_refused(&r, "statement 1", named);
    }
    assert!(!stolen.exists(), "VACUUM INTO wrote a file");
    // The guest's own database works as before, and kept nothing of the
    // refused batches (each rolled back whole).
    let r = sql(
        &weir,
        &[
            "CREATE TABLE kept (a)",
            "INSERT INTO kept VALUES (1)",
            "SELECT count(*) FROM kept",
        ],
    )
    .await;
    assert_eq!(r["rows"][2], json!([[1]]), "{r}");
    let r = sql(
        &weir,
        &["SELECT count(*) FROM sqlite_master WHERE name = 'mine'"],
    )
    .await;
    assert_eq!(r["rows"][0], json!([[0]]), "{r}");
    // The victim answers, with its data.
    assert_eq!(weir.get("/p/victim/get?key=n").await.text(), "1");
    assert_eq!(weir.get("/p/victim/incr").await.text(), "2");
}

fn assert_refused(answer: &Value, index: &str, named: &str) {
    let error = answer["error"]
        .as_str()
        .unwrap_or_else(|| panic!("not refused: {answer}"));
    assert!(error.starts_with("Error::Refused("), "{error}");
    assert!(error.contains(index), "{error}");
    assert!(error.contains(named), "{named}: {error}");
}

#[tokio::test]
async fn sql_inside_an_actor_keeps_its_turn_and_never_touches_weirs_tables() {
    let dir = data_dir("actor-escape");
    let weir = start(&dir, &[]);
    let stolen = dir.join("stolen.sqlite3");
    let vacuum = format!("VACUUM INTO '{}'", stolen.display());
    let answers = exec(
        &weir,
        "a1",
        &[
            "CREATE TABLE mine (a)",
            "INSERT INTO mine VALUES (1)",
            "COMMIT",
            &vacuum,
            "BEGIN",
            "ROLLBACK",
            "SAVEPOINT s",
            "CREATE TEMP TRIGGER t1 AFTER INSERT ON _weir_kv BEGIN SELECT 1; END",
            "CREATE TEMP VIEW v AS SELECT 1",
            "SELECT * FROM _weir_kv",
            "DELETE FROM _weir_timers",
            "CREATE TRIGGER t2 AFTER INSERT ON _weir_kv BEGIN SELECT 1; END",
            "PRAGMA foreign_keys = OFF",
            "ATTACH DATABASE ':memory:' AS x",
            "SELECT count(*) FROM mine",
        ],
    )
    .await;
    assert!(answers[0]["rows"].is_array(), "{answers:?}");
    assert!(answers[1]["rows"].is_array(), "{answers:?}");
    for (i, answer) in answers.iter().enumerate().take(14).skip(2) {
        let error = answer["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{i}: {answer}"));
        assert!(error.starts_with("Error::Refused("), "{i}: {error}");
    }
    // Still one transaction: the insert and the count saw each other.
    assert_eq!(answers[14]["rows"], json!([[1]]));
    assert!(!stolen.exists());
    // The turn committed as a whole, and the actor's own storage works.
    let r = exec(&weir, "a1", &["SELECT count(*) FROM mine"]).await;
    assert_eq!(r[0]["rows"], json!([[1]]));
    let r = weir.get("/h/a1/list").await.json();
    assert_eq!(r["entries"], 0, "{r}");
}

#[tokio::test]
async fn runaway_queries_on_every_sql_thread_leave_everything_else_answering() {
    let dir = data_dir("runaway");
    let weir = Arc::new(start(
        &dir,
        &[
            "--limit",
            "sql_threads=4",
            "--limit",
            "event_limit_ms=10000",
        ],
    ));
    // The victim actor exists before the attack.
    assert_eq!(weir.get("/p/bystander/incr").await.text(), "1");
    const RUNAWAY: &str =
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c";
    // Four runaway statements, two through weir:sql and two through
    // actors: one on every thread of the SQL pool.
    let mut runaways = Vec::new();
    for i in 0..4 {
        let weir = weir.clone();
        runaways.push(tokio::spawn(async move {
            let started = Instant::now();
            let r = if i < 2 {
                post_json(
                    &weir,
                    "/sql",
                    json!({ "db": "app", "statements": [RUNAWAY] }),
                )
                .await
            } else {
                post_json(&weir, &format!("/h/runaway{i}/exec"), json!([RUNAWAY])).await
            };
            (r, started.elapsed())
        }));
    }
    weir.wait_busy(2).await;
    // While they run: another worker, an actor whose data is not involved,
    // and the admin address all answer.
    let mut seen = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        assert_eq!(weir.get("/hello").await.status, 200);
        seen.push(("worker", t.elapsed()));
        let t = Instant::now();
        let r = weir.get("/p/bystander/incr").await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        seen.push(("actor", t.elapsed()));
        let t = Instant::now();
        assert_eq!(weir.admin_get("/healthz").await.status, 200);
        seen.push(("admin", t.elapsed()));
    }
    assert!(
        runaways.iter().all(|r| !r.is_finished()),
        "the runaways were still running while everything else answered"
    );
    let worst = seen.iter().map(|(_, d)| *d).max().unwrap();
    println!("while 4 runaway statements ran: slowest answer {worst:?} ({seen:?})");
    // Each runaway ends at its own deadline with the deadline's error.
    for r in runaways {
        let (r, took) = r.await.unwrap();
        r.assert_weir_error(503, "event_deadline_exceeded");
        assert!(took >= Duration::from_secs(10), "{took:?}");
    }
    // Nothing stays quarantined, and the pool serves again.
    assert_eq!(weir.admin_get("/healthz").await.status, 200);
    let r = sql(&weir, &["SELECT 1"]).await;
    assert_eq!(r["rows"][0], json!([[1]]));
    assert_eq!(
        exec(&weir, "after", &["SELECT 2"]).await[0]["rows"],
        json!([[2]])
    );
}

#[tokio::test]
async fn what_a_query_hands_back_is_bounded() {
    let dir = data_dir("results");
    // Writing 40 MiB in one turn can take seconds on a loaded debug build;
    // this test is about bytes, not time.
    let weir = start(&dir, &["--limit", "event_limit_ms=60000"]);
    let pid = weir.pid();
    reset_peak(pid);
    let before = proc_kib(pid, "VmRSS:");
    // The 4 GB query: ten rows of a 400 MB blob.
    const BOMB: &str = "SELECT zeroblob(400000000) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 10) SELECT x FROM c)";
    // 100 MB of 10 MB rows: each value fits, the result does not.
    const WIDE: &str = "SELECT zeroblob(10000000) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 10) SELECT x FROM c)";
    let r = sql(&weir, &[BOMB]).await;
    let error = r["error"].as_str().unwrap();
    assert!(error.contains("too big"), "{error}");
    let r = sql(&weir, &[WIDE]).await;
    let error = r["error"].as_str().unwrap();
    assert!(error.contains("max_sql_result_bytes (16777216"), "{error}");
    let r = exec(&weir, "big", &[BOMB, WIDE]).await;
    assert!(r[0]["error"].as_str().unwrap().contains("too big"), "{r:?}");
    assert!(
        r[1]["error"]
            .as_str()
            .unwrap()
            .contains("max_sql_result_bytes"),
        "{r:?}"
    );
    // Lists too: 40 entries of 1 MiB are more than one call may return.
    let r = weir.get("/h/big/put-big?n=40&bytes=1048576").await.json();
    assert_eq!(r["put"], 40, "{r}");
    let r = weir.get("/h/big/list").await.json();
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("max_sql_result_bytes"),
        "{r}"
    );
    assert_eq!(weir.get("/h/big/list?limit=3").await.json()["entries"], 3);
    let peak = proc_kib(pid, "VmHWM:");
    println!("RSS {before} KiB before, peak {peak} KiB during the bombs");
    assert!(
        peak < before + 256 * 1024,
        "the bombs made the server hold {} MiB",
        (peak - before) / 1024
    );
}

#[tokio::test]
async fn two_hundred_actors_growing_100_mib_fit_a_2_gib_budget() {
    const BUDGET: u64 = 2 << 30;
    const ACTORS: usize = 200;
    const CONNECTIONS: usize = 16;
    let dir = data_dir("budget");
    let gateway = guest("gateway");
    let probe = format!("probe={}", guest("actor_probe").display());
    let budget = format!("max_total_guest_memory_bytes={BUDGET}");
    let weir = Arc::new(Weir::start_with(&[
        gateway.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
        "--actor",
        &probe,
        "--limit",
        &budget,
        "--limit",
        "event_limit_ms=30000",
    ]));
    let pid = weir.pid();
    let baseline = proc_kib(pid, "VmRSS:");
    reset_peak(pid);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let (weir, next) = (weir.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= ACTORS {
                    return answers;
                }
                let r = weir
                    .send(
                        Request::post(format!("/probe/m{i}/grow?mb=100"))
                            .body(Full::new(Bytes::new()))
                            .unwrap(),
                    )
                    .await;
                answers.push((r.status.as_u16(), r.body.unwrap_or_default()));
            }
        }));
    }
    let (mut grown, mut refused) = (0, 0);
    for t in tasks {
        for (status, body) in t.await.unwrap() {
            match status {
                200 => grown += 1,
                503 => {
                    let v: Value = serde_json::from_slice(&body).unwrap();
                    assert_eq!(v["error"], "memory_budget_exceeded", "{v}");
                    refused += 1;
                }
                other => panic!("{other}: {}", String::from_utf8_lossy(&body)),
            }
        }
    }
    let peak = proc_kib(pid, "VmHWM:");
    let status = weir.admin_get("/actors").await.json()["status"].clone();
    println!(
        "{grown} actors grew 100 MiB, {refused} refused memory_budget_exceeded; RSS baseline {baseline} KiB, peak {peak} KiB (budget {} KiB); {} hibernations",
        BUDGET / 1024,
        status["hibernations"]
    );
    // Idle actors were hibernated to make room: far more grew than fit at
    // once.
    assert!(grown > 40, "{grown} grew");
    assert_eq!(grown + refused, ACTORS);
    // Stated overhead: the server itself, and allocator slack.
    const OVERHEAD_KIB: u64 = 512 * 1024;
    assert!(
        peak < baseline + BUDGET / 1024 + OVERHEAD_KIB,
        "peak {peak} KiB over baseline {baseline} + budget + {OVERHEAD_KIB} KiB"
    );
    let metrics = weir.admin_get("/metrics").await.text();
    assert!(
        metrics.contains("weir_guest_memory_budget_bytes"),
        "{metrics}"
    );
}

/// The table bomb with GROW_BY elements, as a component file.
fn table_bomb(grow_by: u64) -> PathBuf {
    let wat = std::fs::read_to_string(root().join("guests/wat/table-bomb.wat"))
        .unwrap()
        .replace("GROW_BY", &grow_by.to_string());
    let path = std::env::temp_dir().join(format!("weir-table-bomb-{}.wasm", std::process::id()));
    std::fs::write(&path, wat::parse_str(&wat).unwrap()).unwrap();
    path
}

#[tokio::test]
async fn one_table_grow_cannot_make_the_host_allocate_without_bound() {
    let dir = data_dir("table");
    let bomb = table_bomb(100_000_000);
    let class = format!("bomb={}", bomb.display());
    let weir = Weir::start_with(&[
        bomb.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
        "--actor",
        &class,
        "--actor-route",
        "bomb=/b",
    ]);
    let pid = weir.pid();
    let before = proc_kib(pid, "VmRSS:");
    reset_peak(pid);
    // Refused growth returns -1 and the guest traps: on the workers'
    // engine (pooled tables) and on the actors' (tables on demand).
    weir.get("/")
        .await
        .assert_weir_error(503, "instance_abandoned");
    weir.get("/b/x/")
        .await
        .assert_weir_error(503, "instance_abandoned");
    let peak = proc_kib(pid, "VmHWM:");
    assert!(
        peak < before + 64 * 1024,
        "a table grow made the server hold {} MiB",
        (peak - before) / 1024
    );
    // A modest table still grows (the bound is not "never").
    let small = table_bomb(1000);
    let weir = Weir::start(&small, &[]);
    weir.get("/")
        .await
        .assert_weir_error(502, "invalid_response");
}

#[tokio::test]
async fn no_actor_name_can_break_storage_and_bad_files_never_stop_the_server() {
    let dir = data_dir("names");
    let mut weir = start(&dir, &[]);
    for len in [1, 200, 240, 247, 253] {
        let name = "n".repeat(len);
        let r = weir.get(&format!("/p/{name}/incr")).await;
        if len <= 200 {
            assert_eq!(r.status, 200, "{len}: {:?}", r.body);
            assert!(dir.join(format!("actors/probe/{name}.sqlite3")).is_file());
        } else {
            r.assert_weir_error(400, "actor_address_invalid");
        }
    }
    let files: Vec<_> = std::fs::read_dir(dir.join("actors/probe"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.ends_with(".sqlite3"))
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    // Files the server cannot use, left by something else: a zero-length
    // file of a name no actor can have, and a database that is not one.
    weir.signal("KILL");
    weir.wait_exit(Duration::from_secs(10));
    let stray = dir.join(format!("actors/probe/{}.sqlite3", "s".repeat(245)));
    std::fs::write(&stray, b"").unwrap();
    let corrupt = dir.join("actors/probe/corrupt.sqlite3");
    std::fs::write(&corrupt, vec![0xA5u8; 8192]).unwrap();
    let weir = start(&dir, &[]);
    let status = weir.status().await;
    let unreadable: Vec<String> = status["actors"]["unreadable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(unreadable.len(), 2, "{status}");
    assert!(
        unreadable.iter().any(|p| p.ends_with("corrupt.sqlite3")),
        "{unreadable:?}"
    );
    assert!(
        unreadable.iter().any(|p| p.contains(&"s".repeat(245))),
        "{unreadable:?}"
    );
    // The others serve, with their data.
    assert_eq!(
        weir.get(&format!("/p/{}/incr", "n".repeat(200)))
            .await
            .text(),
        "2"
    );
    assert_eq!(weir.get("/p/n/incr").await.text(), "2");
}

/// Opens a connection that declares a body of 10 bytes and sends none.
fn silent_body(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"POST /hello HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n")
        .unwrap();
    s
}

/// Reads what the server answers on `s` (until it closes or 30 s pass).
fn answer(mut s: TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
        if out.windows(4).any(|w| w == b"\r\n\r\n") && out.ends_with(b"}") {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn slow_clients_cannot_hold_the_lanes() {
    let dir = data_dir("slow");
    // The whole-body timeout is far away: only the silence and rate bounds
    // can end these bodies within the test's waits.
    let weir = start(
        &dir,
        &[
            "--limit",
            "body_idle_timeout_ms=1000",
            "--limit",
            "header_read_timeout_ms=1000",
            "--limit",
            "body_read_timeout_ms=300000",
        ],
    );
    // 70 bodies that never come: 32 hold lanes, 32 wait, 6 are refused.
    let started = Instant::now();
    let silent: Vec<TcpStream> = (0..70).map(|_| silent_body(weir.addr)).collect();
    let readers: Vec<_> = silent
        .into_iter()
        .map(|s| std::thread::spawn(move || answer(s)))
        .collect();
    // A normal client keeps trying; it is served once the silent bodies
    // have been answered 408.
    wait_for("a normal request to be served", || async {
        let r = weir.get("/hello").await;
        if r.status == 200 {
            Ok(())
        } else {
            Err(r.status.to_string())
        }
    })
    .await;
    println!(
        "a normal request was served {:?} after 70 silent bodies",
        started.elapsed()
    );
    let (mut timed_out, mut refused) = (0, 0);
    for r in readers {
        let answer = r.join().unwrap();
        if answer.contains("{\"error\":\"request_body_timeout\"}") {
            assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
            timed_out += 1;
        } else if answer.contains("event_capacity_exceeded")
            || answer.contains("admission_deadline_exceeded")
        {
            // Refused, or waited in the queue past its deadline: either
            // way it never held a lane.
            refused += 1;
        } else {
            panic!("{answer:?}");
        }
    }
    assert_eq!(timed_out + refused, 70);
    assert!(timed_out >= 32, "{timed_out} timed out, {refused} refused");
    // A trickle (a byte every 300 ms, never silent for a whole second) is
    // below the minimum rate once the first second has passed: it is
    // answered 408 while it still trickles.
    let mut s = TcpStream::connect(weir.addr).unwrap();
    s.write_all(b"POST /hello HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n")
        .unwrap();
    let reader = s.try_clone().unwrap();
    let trickling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let trickle = {
        let trickling = trickling.clone();
        std::thread::spawn(move || {
            while trickling.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(300));
                if s.write_all(b"x").is_err() {
                    break;
                }
            }
        })
    };
    let answer = tokio::task::spawn_blocking(move || answer(reader))
        .await
        .unwrap();
    let still_trickling = !trickle.is_finished();
    trickling.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(still_trickling, "answered only after the trickle stopped");
    // A head that never completes: the server closes the connection.
    let mut s = TcpStream::connect(weir.addr).unwrap();
    s.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\n").unwrap();
    let closed = tokio::task::spawn_blocking(move || closed_by_server(s))
        .await
        .unwrap();
    assert!(closed, "a half-sent head kept its connection open");
}

/// True when the server closes `s` (within 30 s) without answering.
fn closed_by_server(mut s: TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[tokio::test]
async fn connections_past_the_cap_are_refused_with_a_reason() {
    let dir = data_dir("conns");
    let weir = start(&dir, &["--limit", "max_connections=8"]);
    let held: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(weir.addr).unwrap())
        .collect();
    // The held connections are accepted (their requests would be served).
    wait_for("eight connections accepted", || async {
        let mut s = TcpStream::connect(weir.addr).unwrap();
        s.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let a = answer(s);
        if a.contains("connection_limit_exceeded") {
            Ok(a)
        } else {
            Err(a)
        }
    })
    .await;
    let mut s = TcpStream::connect(weir.addr).unwrap();
    s.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let refused = answer(s);
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.contains("{\"error\":\"connection_limit_exceeded\"}"),
        "{refused}"
    );
    drop(held);
    // Once they close, new connections are served.
    wait_for("a connection to be served again", || async {
        let r = common::try_send_to(
            weir.addr,
            Request::get("/hello")
                .header("host", "x")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
        match r {
            Ok(r) if r.status == 200 => Ok(()),
            Ok(r) => Err(r.status.to_string()),
            Err(e) => Err(e),
        }
    })
    .await;
}

#[tokio::test]
async fn the_admin_needs_its_token_and_guests_never_reach_weir_itself() {
    let dir = data_dir("admin");
    let upstream = HoldServer::start(Some(1));
    let weir = start(
        &dir,
        &[
            "--allow-outbound",
            "http://127.0.0.1:*",
            "--allow-outbound",
            "http://localhost:*",
            "--allow-outbound",
            "http://0.0.0.0:*",
        ],
    );
    let admin = weir.admin.unwrap();
    let token_file = dir.join("admin-token");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // Without the token (or with a wrong one): no names, no keys, no
    // deletion. Monitoring stays open.
    assert_eq!(weir.get("/p/secret/incr").await.text(), "1");
    for (method, path, auth) in [
        ("GET", "/actors", None),
        ("GET", "/actors/probe/secret?keys=1", None),
        ("DELETE", "/actors/probe/secret", Some("Bearer wrong")),
        ("GET", "/actors/probe", Some("secret")),
    ] {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "x");
        if let Some(auth) = auth {
            req = req.header("authorization", auth);
        }
        let r = send_to(admin, req.body(Full::new(Bytes::new())).unwrap()).await;
        assert_eq!(r.status, 401, "{method} {path}");
        assert_eq!(r.json()["error"], "admin_token_required");
    }
    assert_eq!(
        weir.get("/p/secret/get?key=n").await.text(),
        "1",
        "not deleted"
    );
    assert_eq!(
        weir.admin_get("/actors/probe/secret?keys=1").await.status,
        200
    );
    for path in ["/healthz", "/status", "/metrics"] {
        let r = send_to(
            admin,
            Request::get(path)
                .header("host", "x")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
        assert_eq!(r.status, 200, "{path}");
    }
    // Guests cannot reach the admin or the listen address, whatever the
    // allow-list says and however the address is written.
    let listen = weir.addr;
    for url in [
        format!("http://127.0.0.1:{}/actors", admin.port()),
        format!("http://localhost:{}/healthz", admin.port()),
        format!("http://0.0.0.0:{}/healthz", admin.port()),
        format!("http://127.0.0.1:{}/hello", listen.port()),
    ] {
        let r = weir.get(&format!("/fetch?url={url}")).await.json();
        assert_eq!(r["error"], "ErrorCode::HttpRequestDenied", "{url}: {r}");
    }
    // An allowed upstream is reached (the refusal is not of everything).
    let r = weir
        .get(&format!("/fetch?url={}", upstream.url()))
        .await
        .json();
    assert_eq!(r["body"], "released", "{r}");
    let metrics = weir.admin_get("/metrics").await.text();
    assert!(
        metrics.contains("weir_outbound_refused_total{app=\"hostile\",result=\"denied\"} 4"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_guest_cannot_flood_weirs_log() {
    let dir = data_dir("print");
    let weir = start(&dir, &[]);
    let log_bytes = |weir: &Weir| weir.log().len();
    let before = log_bytes(&weir);
    for _ in 0..2 {
        let r = weir.get("/print?kb=10000").await.json();
        assert_eq!(r["printed_kb"], 10000);
    }
    // Each event's output is cut at 64 KiB; what reaches the log is the
    // two events' 128 KiB and the receipts.
    common::wait_for("the guest's lines in the log", || async {
        let grown = log_bytes(&weir) - before;
        if grown >= 2 * 60 * 1024 {
            Ok(())
        } else {
            Err(format!("{grown} bytes"))
        }
    })
    .await;
    tokio::time::sleep(common::SETTLE).await;
    let grown = log_bytes(&weir) - before;
    println!("20 MB printed by two events; the log grew {grown} bytes");
    assert!(
        grown < 2 * 64 * 1024 + 8 * 1024,
        "the log grew {grown} bytes"
    );
}

#[tokio::test]
async fn one_server_per_data_dir_and_a_crash_frees_it() {
    let dir = data_dir("lock");
    let first = start(&dir, &[]);
    let out = common::run_weir(&[
        "serve",
        guest("hello").to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("in use by another weir (pid {})", first.pid())),
        "{}",
        out.stderr
    );
    first.signal("KILL");
    drop(first);
    let again = start(&dir, &[]);
    assert_eq!(again.get("/hello").await.status, 200);
}

#[tokio::test]
async fn actor_addresses_are_exact() {
    let dir = data_dir("address");
    let weir = start(&dir, &[]);
    assert_eq!(weir.get("/p/v1/incr").await.text(), "1");
    for authority in [
        "v1.probe.actor.internal:80",
        "v1.probe.actor.internal.",
        "evil@v1.probe.actor.internal",
    ] {
        let r = weir
            .get(&format!("/raw?authority={authority}&path=/incr"))
            .await
            .json();
        // Either the guest's HTTP library refuses the authority, or Weir
        // answers it as an invalid address; nothing reaches the actor.
        let refused = r["error"].is_string()
            || (r["status"] == 400
                && r["body"]
                    .as_str()
                    .unwrap()
                    .contains("actor_address_invalid"));
        assert!(refused, "{authority}: {r}");
    }
    assert_eq!(weir.get("/p/v1/get?key=n").await.text(), "1", "no call ran");
    // Names built from user input cannot redirect a call to another class.
    let gateway = guest("gateway");
    let probe = format!("probe={}", guest("actor_probe").display());
    let dir2 = data_dir("address-gateway");
    let gw = Weir::start_with(&[
        gateway.to_str().unwrap(),
        "--data-dir",
        dir2.to_str().unwrap(),
        "--actor",
        &probe,
    ]);
    for name in ["x.hostile.actor.internal%2F", "a@b", "a:1"] {
        let r = gw.get(&format!("/probe/{name}/incr")).await;
        assert_eq!(r.status, 502, "{name}");
        assert!(
            r.headers["x-call-error"]
                .to_str()
                .unwrap()
                .contains("actor name"),
            "{name}"
        );
    }
}
