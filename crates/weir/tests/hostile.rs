//! A hostile tenant, from outside: the `hostile` guest (as the app and as
//! an actor class) tries the doors of storage and memory — SQL escapes,
//! runaway queries, result, memory and table bombs, names that do not fit
//! a file system, what an actor may hang on its sockets, and alarms that
//! re-arm forever — against a real `weir serve`. The transport's doors are
//! in `hostile_clients.rs`, how much disk a guest can fill in
//! `hostile_storage.rs`, its reach into the host's memory (stack, handles,
//! the budget, tables, runs) in `hostile_memory.rs`, into SQLite's heap and
//! temporary files in `hostile_sql_memory.rs`, into the compiler in
//! `hostile_compiler.rs`, calls back into an actor's own chain in
//! `actor_calls.rs`. Each test names what must hold.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::hostile::*;
use common::*;

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
    // Every thread of the pool is taken by one (the status says so).
    common::wait_for("4 busy SQL threads", || async {
        let pool = weir.status().await["sql_pool"].clone();
        if pool["busy"] == 4 && pool["threads"] == 4 {
            Ok(())
        } else {
            Err(pool.to_string())
        }
    })
    .await;
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
    // Not one of them waited for a pool thread: a wait would have lasted
    // until a runaway's 10 s deadline. (Not a speed bound: half of that
    // deadline is a hundred times what an answer takes here.)
    assert!(
        worst < Duration::from_secs(5),
        "an answer waited on the runaways: {seen:?}"
    );
    assert_eq!(weir.status().await["sql_pool"]["busy"], 4);
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
    // The stray name is found by the start's listing; the corrupt database
    // by the timer pass, which opens each one once the server serves.
    let status = weir.status_after_timer_pass().await;
    assert_eq!(status["actors"]["timer_pass"]["of"], 3, "{status}");
    assert_eq!(status["actors"]["timer_pass"]["read"], 3, "{status}");
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

#[tokio::test]
async fn what_an_actor_hangs_on_its_sockets_is_bounded_and_a_refusal_keeps_nothing() {
    let dir = data_dir("socket-limits");
    let weir = start(&dir, &[]);
    // At every limit: 10 tags and a key of 256 bytes, a 16 KiB attachment,
    // a 2 KiB auto-response request. All kept.
    let mut fits = hostile_socket(
        &weir,
        "fits",
        "tags=10&tag_bytes=256&key_bytes=256&attachment=16384&auto=2048",
    )
    .await
    .expect("everything at its limit is accepted");
    let set: Value = serde_json::from_str(&exchange(&mut fits, None).await).unwrap();
    assert_eq!(set, json!({ "attachment": "Ok(())", "auto": "Ok(())" }));
    let held: Value =
        serde_json::from_str(&exchange(&mut fits, Some("size?".into())).await).unwrap();
    assert_eq!(held["attachment_bytes"], 16384);
    assert_eq!(
        exchange(&mut fits, Some("p".repeat(2048))).await,
        "pong",
        "the 2 KiB auto-response is answered by Weir"
    );

    // One past each limit of the accept: refused, and the guest answers
    // the upgrade itself (no socket is opened).
    for (query, named) in [
        ("tags=11&tag_bytes=1", "at most 10 tags"),
        ("tags=1&tag_bytes=257", "at most 256 bytes"),
        ("key_bytes=257", "at most 256 bytes"),
    ] {
        let (status, body) = hostile_socket(&weir, "over", query)
            .await
            .err()
            .unwrap_or_else(|| panic!("{query} was accepted"));
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains(named), "{query}: {body}");
    }

    // One past the attachment and auto-response limits: each call is
    // refused by name, nothing of it is kept, and the socket still works.
    let mut over = hostile_socket(&weir, "over", "attachment=16385&auto=2049")
        .await
        .expect("accepted");
    let set: Value = serde_json::from_str(&exchange(&mut over, None).await).unwrap();
    assert!(
        set["attachment"]
            .as_str()
            .unwrap()
            .contains("an attachment is at most 16384 bytes"),
        "{set}"
    );
    assert!(
        set["auto"]
            .as_str()
            .unwrap()
            .contains("each at most 2048 bytes"),
        "{set}"
    );
    let held: Value =
        serde_json::from_str(&exchange(&mut over, Some("p".repeat(2049))).await).unwrap();
    assert_eq!(
        held,
        json!({ "attachment_bytes": null }),
        "no attachment was kept, and the oversized request reached the actor instead of an auto-response"
    );
    // The server still serves the other tenants.
    assert_eq!(weir.get("/p/victim/incr").await.text(), "1");
}

/// Makes `n` actors of the hostile class (`storm0`…) each arm an alarm
/// that re-arms itself for "now" every time it runs.
async fn start_storms(weir: &Weir, n: usize) {
    for i in 0..n {
        assert_eq!(
            weir.get(&format!("/h/storm{i}/storm")).await.json(),
            json!("storming")
        );
    }
}

/// How many times each of the first `n` storms has run.
async fn storm_runs(weir: &Weir, n: usize) -> Vec<u64> {
    futures::future::join_all((0..n).map(|i| async move {
        weir.get(&format!("/h/storm{i}/storm-runs")).await.json()["runs"]
            .as_u64()
            .unwrap_or(0)
    }))
    .await
}

/// Every storm ran again since `before` was counted: none stopped.
async fn assert_every_storm_went_on(weir: &Weir, before: &[u64]) {
    let after = storm_runs(weir, before.len()).await;
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert!(a > b, "storm {i} stopped: {b} then {a}");
    }
}

#[tokio::test]
async fn actors_whose_alarms_rearm_for_now_forever_leave_everyone_else_answering() {
    let dir = data_dir("alarm-storm");
    let weir = start(&dir, &[]);
    assert_eq!(weir.get("/p/victim/incr").await.text(), "1");
    // Ten actors each arm an alarm that re-arms itself for "now" every
    // time it runs: turns with no end and no caller.
    const STORMS: usize = 10;
    start_storms(&weir, STORMS).await;
    // While they storm, another actor, the worker and the admin address
    // answer, every time, and the storms go on meanwhile.
    let before = storm_runs(&weir, STORMS).await;
    let mut worst = Duration::ZERO;
    for n in 2..=21 {
        let t = Instant::now();
        assert_eq!(weir.get("/p/victim/incr").await.text(), n.to_string());
        assert_eq!(weir.get("/hello").await.json(), json!("still here"));
        assert_eq!(weir.admin_send("GET", "/healthz").await.status, 200);
        worst = worst.max(t.elapsed());
    }
    assert_every_storm_went_on(&weir, &before).await;
    // Answering is not waiting: no round of the three waited behind the
    // storms for anything like a second (one takes milliseconds here; the
    // bound is a hundred times that, so a loaded machine does not trip it).
    println!("while {STORMS} storms ran: slowest round {worst:?}");
    assert!(
        worst < Duration::from_secs(2),
        "a round waited {worst:?} behind the storms"
    );
}

#[tokio::test]
async fn alarms_that_rearm_forever_take_turns_within_max_concurrent_alarms() {
    let dir = data_dir("alarm-places");
    let weir = start(&dir, &["--limit", "max_concurrent_alarms=2"]);
    assert_eq!(weir.get("/p/victim/incr").await.text(), "1");
    // Twelve times more storms than places: unbounded, each would be a
    // delivery queued beside every request.
    const STORMS: usize = 24;
    start_storms(&weir, STORMS).await;
    let before = storm_runs(&weir, STORMS).await;
    let mut seen_waiting = 0;
    for n in 2..=21 {
        assert_eq!(weir.get("/p/victim/incr").await.text(), n.to_string());
        assert_eq!(weir.get("/hello").await.json(), json!("still here"));
        let status = weir.admin_get("/actors").await.json()["status"].clone();
        assert_eq!(status["max_concurrent_alarms"], 2, "{status}");
        assert!(status["alarms_running"].as_u64().unwrap() <= 2, "{status}");
        seen_waiting = seen_waiting.max(status["alarms_waiting"].as_u64().unwrap());
    }
    // Every storm went on (they take turns: none is starved), ...
    assert_every_storm_went_on(&weir, &before).await;
    // ... never more than two at once, and the bound was reached: due
    // storms waited for a place.
    let status = weir.admin_get("/actors").await.json()["status"].clone();
    assert_eq!(status["alarms_running_peak"], 2, "{status}");
    assert!(seen_waiting > 0, "no storm ever waited: {status}");
    assert!(
        status["alarms"].as_u64().unwrap() >= STORMS as u64,
        "{status}"
    );
}
