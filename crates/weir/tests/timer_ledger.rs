//! The timer ledger from outside: after a SIGKILL, a start indexes every
//! actor's timer from the ledger before the timer pass reads a database;
//! a ledger that is gone or not a database is made again by the pass; a
//! row whose actor was removed from disk makes no actor, and a deleted
//! actor's row goes with it; the rows of a class no longer declared are
//! removed at a start; a ledger that cannot be opened at all is left
//! alone, and the server runs on the pass.

mod common;

use std::path::Path;

use common::actors::*;

const LEDGER: &str = "actors/.timer-ledger.sqlite3";

/// The ledger's rows, read with the server stopped: (name, at_ms).
fn rows(dir: &Path) -> Vec<(String, i64)> {
    let db = rusqlite::Connection::open(dir.join(LEDGER)).unwrap();
    let mut stmt = db
        .prepare("SELECT name, at_ms FROM next_deadline WHERE class = 'probe' ORDER BY name")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Stops the server cleanly (which writes the ledger's rows waiting) and
/// waits for it to end.
fn stop(mut weir: common::Weir) {
    weir.signal("TERM");
    let ended = weir.wait_exit(std::time::Duration::from_secs(30));
    assert!(
        ended.is_some_and(|s| s.success()),
        "{ended:?}\n{}",
        weir.log()
    );
}

/// Schedules `reason` on `actor` `in_ms` from now.
async fn schedule(weir: &common::Weir, actor: &str, reason: &str, in_ms: i64) {
    let path = format!("/probe/{actor}/schedule?reason={reason}&in_ms={in_ms}");
    assert_eq!(post(weir, &path, Vec::new()).await.status, 200, "{path}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sigkill_every_timer_is_indexed_from_the_ledger_and_fires() {
    let dir = data_dir("ledger-kill");
    let weir = start(&dir, &[]);
    // Six actors with a timer after the restart, two with one an hour
    // away, one whose timer fires and is not re-armed, and actors with no
    // timer at all.
    for i in 0..6 {
        schedule(&weir, &format!("soon{i}"), "tick", 1_500).await;
    }
    for i in 0..2 {
        schedule(&weir, &format!("later{i}"), "tick", 3_600_000).await;
    }
    schedule(&weir, "fired", "tick", 0).await;
    for i in 0..20 {
        assert_eq!(
            post(&weir, &format!("/probe/plain{i}/incr"), Vec::new())
                .await
                .status,
            200
        );
    }
    let fired = wait_log(&weir, "fired", |l| !l.is_empty()).await;
    assert_eq!(fired.len(), 1, "{fired:?}");
    weir.signal("KILL");
    drop(weir);

    // What the killed server left: a row for each actor with a timer, at
    // its deadline or before it. The fired timer's row is removed some
    // milliseconds after its turn (exact values are written together), so
    // a kill may find it still there: too early, never too late.
    let killed_at = now_ms() as i64;
    let mut left = rows(&dir);
    if let Some(i) = left.iter().position(|(n, _)| n == "fired") {
        assert!(left[i].1 <= killed_at, "{left:?}");
        left.remove(i);
    }
    let names: Vec<&str> = left.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "later0", "later1", "soon0", "soon1", "soon2", "soon3", "soon4", "soon5"
        ],
        "{left:?}"
    );
    let hour_away = killed_at + 3_000_000;
    for (name, at) in &left {
        assert_eq!(name.starts_with("later"), *at > hour_away, "{name}: {at}");
    }

    let weir = start(&dir, &[]);
    let status = weir.status_after_timer_pass().await;
    let pass = &status["actors"]["timer_pass"];
    let ledgered = pass["ledgered"].as_u64().unwrap();
    assert!(ledgered == 8 || ledgered == 9, "{status}");
    assert_eq!(pass["of"], 29, "{status}");
    assert_eq!(pass["read"], 29, "{status}");
    for i in 0..6 {
        wait_log(&weir, &format!("soon{i}"), |l| !l.is_empty()).await;
    }
    // Counted after a later timer fired, not at the first sight of each.
    after_a_later_timer(&weir, 500).await;
    for i in 0..6 {
        let log = alarm_log(&weir, &format!("soon{i}")).await;
        assert_eq!(log.len(), 1, "soon{i}: {log:?}");
    }
    assert_eq!(
        alarm_log(&weir, "fired").await.len(),
        1,
        "fired once, never again"
    );
    assert_eq!(alarm_log(&weir, "later0").await.len(), 0);
    // The fired timers' rows went with them.
    let status = weir.status().await;
    assert_eq!(status["actors"]["pending_timers"], 2, "{status}");
    stop(weir);
    let names: Vec<String> = rows(&dir).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["later0", "later1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_is_gone_or_not_a_database_is_made_again_by_the_pass() {
    let dir = data_dir("ledger-remade");
    let weir = start(&dir, &[]);
    for i in 0..4 {
        schedule(&weir, &format!("a{i}"), "tick", 3_600_000).await;
    }
    schedule(&weir, "soon", "tick", 1_500).await;
    weir.signal("KILL");
    drop(weir);

    for (broken, how) in [(false, "removed"), (true, "overwritten")] {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(dir.join(format!("{LEDGER}{suffix}")));
        }
        if broken {
            std::fs::write(dir.join(LEDGER), b"not a database at all").unwrap();
        }
        let weir = start(&dir, &[]);
        let status = weir.status_after_timer_pass().await;
        assert_eq!(
            status["actors"]["timer_pass"]["ledgered"], 0,
            "{how}: {status}"
        );
        let pending = weir.admin_get("/actors").await.json();
        assert!(
            pending["status"]["pending_timers"].as_u64().unwrap() >= 4,
            "{how}: the pass found the timers: {pending}"
        );
        if broken {
            let warned = weir
                .first_logged("weir_actors::timer_ledger", |l| {
                    l["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("was made again"))
                })
                .await;
            assert!(
                warned["error"].as_str().unwrap().contains("not a database"),
                "{warned}"
            );
        }
        stop(weir);
        // The pass wrote every row back.
        let names: Vec<String> = rows(&dir).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names[..4], ["a0", "a1", "a2", "a3"], "{how}");
    }
    let weir = start(&dir, &[]);
    let status = weir.status_after_timer_pass().await;
    let ledgered = status["actors"]["timer_pass"]["ledgered"].as_u64().unwrap();
    assert!(ledgered >= 4, "{status}");
    let log = wait_log(&weir, "soon", |l| !l.is_empty()).await;
    assert_eq!(log.len(), 1, "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_whose_actor_was_removed_from_disk_makes_no_actor_and_a_deleted_one_leaves_none() {
    let dir = data_dir("ledger-removed");
    let weir = start(&dir, &[]);
    schedule(&weir, "gone", "tick", 800).await;
    schedule(&weir, "kept", "tick", 800).await;
    // And one deleted by an operator: its row goes with it.
    schedule(&weir, "deleted", "tick", 3_600_000).await;
    let r = weir.admin_send("DELETE", "/actors/probe/deleted").await;
    assert_eq!(r.json()["deleted"], true, "{:?}", r.body);
    weir.signal("KILL");
    drop(weir);
    // An operator removes one actor's files while the server is down.
    let mut removed = 0;
    for entry in std::fs::read_dir(dir.join("actors/probe"))
        .unwrap()
        .flatten()
    {
        if entry.file_name().to_string_lossy().starts_with("gone.") {
            std::fs::remove_file(entry.path()).unwrap();
            removed += 1;
        }
    }
    assert!(removed >= 1, "the actor's database was not where expected");

    let weir = start(&dir, &[]);
    let status = weir.status_after_timer_pass().await;
    assert_eq!(status["actors"]["timer_pass"]["ledgered"], 2, "{status}");
    assert_eq!(status["actors"]["timer_pass"]["of"], 1, "{status}");
    // Both rows fall due; the kept actor's alarm runs, the removed one is
    // not made again.
    let log = wait_log(&weir, "kept", |l| !l.is_empty()).await;
    assert_eq!(log.len(), 1, "{log:?}");
    common::wait_for("the removed actor's row to fall due", || async {
        let pending = weir.admin_get("/actors").await.json()["status"]["pending_timers"].clone();
        if pending == 0 {
            Ok(())
        } else {
            Err(pending.to_string())
        }
    })
    .await;
    assert_eq!(weir.admin_get("/actors/probe/gone").await.status, 404);
    assert!(
        weir.actor_receipts().iter().all(|r| r["name"] != "gone"),
        "{:#?}",
        weir.actor_receipts()
    );
    stop(weir);
    assert_eq!(rows(&dir), [], "both rows are gone with their timers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_cannot_be_opened_is_left_alone_and_the_pass_finds_the_timers() {
    let dir = data_dir("ledger-unopenable");
    let weir = start(&dir, &[]);
    schedule(&weir, "soon", "tick", 1_500).await;
    weir.signal("KILL");
    drop(weir);
    // Something not a file stands where the ledger goes: it is not Weir's
    // to remove.
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.join(format!("{LEDGER}{suffix}")));
    }
    std::fs::create_dir(dir.join(LEDGER)).unwrap();
    std::fs::write(dir.join(LEDGER).join("kept"), b"an operator's").unwrap();

    let weir = start(&dir, &[]);
    let warned = weir
        .first_logged("weir_actors::timer_ledger", |l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("no timer ledger"))
        })
        .await;
    assert!(
        warned["path"].as_str().unwrap().ends_with(LEDGER),
        "{warned}"
    );
    let status = weir.status_after_timer_pass().await;
    assert_eq!(status["actors"]["timer_pass"]["ledgered"], 0, "{status}");
    assert_eq!(status["actors"]["timer_pass"]["read"], 1, "{status}");
    // Without a ledger the actor's turns run, and its timer fires.
    assert_eq!(
        post(&weir, "/probe/other/incr", Vec::new()).await.text(),
        "1"
    );
    let log = wait_log(&weir, "soon", |l| !l.is_empty()).await;
    assert_eq!(log.len(), 1, "{log:?}");
    stop(weir);
    assert_eq!(
        std::fs::read(dir.join(LEDGER).join("kept")).unwrap(),
        b"an operator's",
        "left alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rows_of_a_class_no_longer_declared_are_removed_and_come_back_with_it() {
    let dir = data_dir("ledger-undeclared");
    let weir = start(&dir, &[]);
    for name in ["a", "b"] {
        schedule(&weir, name, "tick", 3_600_000).await;
    }
    stop(weir);
    assert_eq!(rows(&dir).len(), 2);
    // The same code under another class name: `probe` is no longer
    // declared, and its rows go.
    let other = format!("other={}", common::guest("actor_probe").display());
    let gateway = common::guest("gateway");
    let weir = common::Weir::start_with(&[
        gateway.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
        "--actor",
        &other,
    ]);
    let removed = weir
        .first_logged("weir_actors::timer_ledger", |l| {
            l["message"] == "removed the timer ledger's rows of a class no longer declared"
        })
        .await;
    assert_eq!(
        (&removed["class"], &removed["rows"]),
        (&"probe".into(), &2.into())
    );
    stop(weir);
    assert_eq!(rows(&dir), []);
    // Declared again: the pass reads its actors' timers and writes their
    // rows back.
    let weir = start(&dir, &[]);
    let status = weir.status_after_timer_pass().await;
    assert_eq!(status["actors"]["pending_timers"], 2, "{status}");
    stop(weir);
    let names: Vec<String> = rows(&dir).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["a", "b"]);
}
