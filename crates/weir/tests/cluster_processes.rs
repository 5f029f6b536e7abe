//! Resident processes in cluster mode, from outside: real nodes on a real
//! PostgreSQL, a real resident image spawned from an actor's turn. A
//! process runs on the node that holds its owner; when that node dies or
//! stops, the node that holds the owner next starts it again, once, with
//! no call arriving; a process its owner killed stays dead; a node that
//! loses the database, or is paused past its lease, stops its processes
//! before anyone else may start them, and starts them again itself if its
//! lease comes back in time; a take-over that fails (the owner's history
//! unreadable for a while) is tried again until the process runs; an
//! owner that hibernates and wakes restarts nothing; and a durable storage
//! slot, which could not follow its owner, is refused by name.

mod common;

use std::time::{Duration, Instant};

use common::Weir;
use common::cluster::{
    LEASE_MS, Postgres, SECRET, node_dir, placed_on, runner_key, runner_node, session,
};
use common::postgres::Partition;
use common::programs::{call, push_image, running, wait_running};
use serde_json::Value;

/// Spawns the resident server for `owner` through `node`: its pid.
async fn spawn(node: &Weir, owner: &str, image: &str, query: &str) -> u64 {
    let spawned = call(
        node,
        "POST",
        &format!("/r/{owner}/spawn/{image}?{query}"),
        b"",
    )
    .await;
    assert_eq!(spawned.status, 200, "{}", spawned.text());
    spawned.json()["pid"].as_u64().unwrap()
}

/// What the owner's row in the cluster's database says of its journal.
fn journaled(pg: &Postgres, owner: &str) -> String {
    pg.psql(
        "weir",
        &format!(
            "SELECT journaled FROM weir_objects WHERE key = '{}'",
            runner_key(owner)
        ),
    )
}

/// The process receipts (`weir::process`) of `node` that match `f`.
fn process_receipts(node: &Weir, f: impl Fn(&Value) -> bool) -> Vec<Value> {
    node.logged("weir::process")
        .into_iter()
        .filter(|r| f(r))
        .collect()
}

/// Waits (at most a minute) until `node` runs `n` processes; their pids.
async fn pids_running(node: &Weir, n: usize) -> Vec<u64> {
    wait_running(node, n)
        .await
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect()
}

/// Asks the process `pid` of `owner`, through `node`, how often it
/// started: 200 when it answers.
async fn reaches(node: &Weir, owner: &str, pid: u64) -> u16 {
    call(node, "GET", &format!("/r/{owner}/proc/{pid}/starts"), b"")
        .await
        .status
        .as_u16()
}

/// Waits until `node` owes no take-over and runs none: its recovery pass
/// is over, so a count of processes and re-drives taken after this is the
/// count, not a sample a moment into it.
async fn take_overs_settled(node: &Weir) {
    common::wait_for("no take-over pending", || async {
        let pending = node.status().await["take_overs"]["pending"].clone();
        if pending == 0 {
            Ok(())
        } else {
            Err(pending.to_string())
        }
    })
    .await;
    // And every receipt of the pass is in the log read.
    node.log_flushed("/").await;
}

/// Waits (at most 30 s) until `owner`, asked through `node`, says it was
/// told of `n` recoveries: what it was told.
async fn told(node: &Weir, owner: &str, n: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let told = call(node, "GET", &format!("/r/{owner}/recovered"), b"").await;
        assert_eq!(told.status, 200, "{}", told.text());
        if told.json().as_array().is_some_and(|t| t.len() >= n) {
            return told.json();
        }
        assert!(
            Instant::now() < deadline,
            "the owner was not told: {}",
            told.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_whose_node_dies_starts_again_on_the_next_node_without_a_call() {
    let pg = Postgres::start();
    let mut a = runner_node(&pg, "a", &node_dir("procs-die", "a"), &[]);
    let b = runner_node(&pg, "b", &node_dir("procs-die", "b"), &[]);
    let image = push_image(&a, &common::guest("resident")).await;
    let owner = placed_on("a", &["a", "b"]);
    let pid = spawn(&a, &owner, &image, "").await;
    let reported = spawn(&a, &owner, &image, "on_crash=report").await;
    assert_eq!(reaches(&a, &owner, pid).await, 200);
    // Its launch is in the owner's row before the spawn answered.
    assert_eq!(journaled(&pg, &owner), "t");
    assert_eq!(
        running(&b).await.len(),
        0,
        "it runs on its owner's node only"
    );

    a.signal("KILL");
    a.wait_exit(Duration::from_secs(10));
    // Nobody calls the owner: b claims it for its journal and starts the
    // process again, under a new pid.
    let started = Instant::now();
    let back = pids_running(&b, 1).await;
    let new_pid = back[0];
    assert_ne!(new_pid, pid);
    eprintln!("re-driven on b {:?} after a's SIGKILL", started.elapsed());
    let recovered = b
        .first_logged("weir::process", |r| r["outcome"] == "recovered")
        .await;
    assert_eq!(
        (recovered["old_pid"].as_u64(), recovered["new_pid"].as_u64()),
        (Some(pid), Some(new_pid)),
        "{recovered}"
    );
    assert_eq!(pg.owner(&runner_key(&owner)).as_deref(), Some("b"));
    // The owner reaches it through b, and the old pid is gone.
    assert_eq!(reaches(&b, &owner, new_pid).await, 200);
    assert_ne!(reaches(&b, &owner, pid).await, 200);
    // Once: still one process, and one re-drive, a moment later; the
    // process whose on_crash is report is reported lost, not started.
    take_overs_settled(&b).await;
    assert_eq!(running(&b).await.len(), 1);
    let recoveries = process_receipts(&b, |r| r["message"] == "recovery");
    assert_eq!(recoveries.len(), 2, "{recoveries:#?}");
    let lost = recoveries.iter().find(|r| r["outcome"] == "lost").unwrap();
    assert_eq!(lost["old_pid"], reported, "{lost}");
    assert_eq!(lost["detail"], "its on_crash is report", "{lost}");
    // The owner heard of both (the lost first), in turns of its own on b.
    let told = told(&b, &owner, 2).await;
    assert_eq!(
        told,
        serde_json::json!([
            { "old": reported, "new": null, "outcome": "lost: its on_crash is report" },
            { "old": pid, "new": new_pid, "outcome": "restarted" },
        ])
    );
    // The owner kills it: its row goes, and so does the row's flag.
    let killed = call(&b, "POST", &format!("/r/{owner}/kill/{new_pid}"), b"").await;
    assert_eq!(killed.status, 200, "{}", killed.text());
    assert_eq!(journaled(&pg, &owner), "f");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_stops_hands_its_processes_over_and_a_killed_one_stays_dead() {
    let pg = Postgres::start();
    let mut a = runner_node(&pg, "a", &node_dir("procs-stop", "a"), &[]);
    let b = runner_node(&pg, "b", &node_dir("procs-stop", "b"), &[]);
    let image = push_image(&a, &common::guest("resident")).await;
    let owner = placed_on("a", &["a", "b"]);
    let kept = spawn(&a, &owner, &image, "").await;
    let killed = spawn(&a, &owner, &image, "").await;
    let r = call(&a, "POST", &format!("/r/{owner}/kill/{killed}"), b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(pids_running(&a, 1).await, [kept]);

    a.signal("TERM");
    assert!(a.wait_exit(Duration::from_secs(30)).is_some());
    // a ended it with a receipt, its launch kept for the next node.
    let stopped = a
        .first_logged("weir::process", |r| r["outcome"] == "stopped")
        .await;
    assert_eq!(stopped["pid"], kept, "{stopped}");
    // b starts the one that ran, and only it.
    let back = pids_running(&b, 1).await;
    let recovered = b
        .first_logged("weir::process", |r| r["outcome"] == "recovered")
        .await;
    assert_eq!(
        (recovered["old_pid"].as_u64(), recovered["new_pid"].as_u64()),
        (Some(kept), Some(back[0])),
        "{recovered}"
    );
    take_overs_settled(&b).await;
    let recoveries = process_receipts(&b, |r| r["message"] == "recovery");
    assert_eq!(recoveries.len(), 1, "{recoveries:#?}");
    assert_eq!(reaches(&b, &owner, back[0]).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_that_fails_is_tried_again_until_the_process_runs() {
    let pg = Postgres::start();
    let mut a = runner_node(&pg, "a", &node_dir("procs-retry", "a"), &[]);
    let b = runner_node(&pg, "b", &node_dir("procs-retry", "b"), &[]);
    let image = push_image(&a, &common::guest("resident")).await;
    let owner = placed_on("a", &["a", "b"]);
    let pid = spawn(&a, &owner, &image, "").await;
    let held = session(&b).await;
    // The owner's history cannot be read for longer than a statement may
    // take, and a dies: b claims the owner, and cannot open it, twice.
    let lock = pg.lock_table("weir_log");
    a.signal("KILL");
    a.wait_exit(Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(60);
    let failed = loop {
        let failed: Vec<Value> = b
            .logged("weir_programs::handover")
            .into_iter()
            .filter(|r| {
                r["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("cannot take over the resident processes"))
            })
            .collect();
        if failed.len() >= 2 {
            break failed;
        }
        assert!(
            Instant::now() < deadline,
            "no two failed take-overs: {failed:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Each tried again later than the one before.
    let waits: Vec<_> = failed[..2]
        .iter()
        .map(|r| r["retry_in_ms"].clone())
        .collect();
    assert_eq!(waits, [250, 500], "{failed:#?}");
    assert!(
        failed[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("storage_unavailable")),
        "{failed:#?}"
    );
    assert_eq!(pg.owner(&runner_key(&owner)).as_deref(), Some("b"));
    assert_eq!(running(&b).await.len(), 0);
    // Statements the node gave up on held its lease up neither: the same
    // session throughout, never a renewal missed.
    assert_eq!(session(&b).await, held);
    let renewals: Vec<Value> = b
        .logged("weir_cluster::lease")
        .into_iter()
        .filter(|r| r["message"] != "holding the cluster lease")
        .collect();
    assert!(renewals.is_empty(), "{renewals:#?}");
    // The history is readable again: with no call to the owner, b tries
    // again and starts the process, once.
    drop(lock);
    let back = pids_running(&b, 1).await;
    let recovered = b
        .first_logged("weir::process", |r| r["outcome"] == "recovered")
        .await;
    assert_eq!(
        (recovered["old_pid"].as_u64(), recovered["new_pid"].as_u64()),
        (Some(pid), Some(back[0])),
        "{recovered}"
    );
    take_overs_settled(&b).await;
    assert_eq!(pids_running(&b, 1).await, back);
    let recoveries = process_receipts(&b, |r| r["message"] == "recovery");
    assert_eq!(recoveries.len(), 1, "{recoveries:#?}");
    assert_eq!(reaches(&b, &owner, back[0]).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_loses_the_database_stops_its_processes_and_they_come_back_once() {
    let mut pg = Postgres::start();
    let a = runner_node(&pg, "a", &node_dir("procs-lapse", "a"), &[]);
    let image = push_image(&a, &common::guest("resident")).await;
    let owner = placed_on("a", &["a"]);
    let pid = spawn(&a, &owner, &image, "").await;
    // The database stops answering: the node's lease lapses by its own
    // clock, and it stops the process before anyone else may start it.
    pg.stop("INT");
    let stopped = a
        .first_logged("weir::process", |r| r["outcome"] == "stopped")
        .await;
    assert_eq!(stopped["pid"], pid, "{stopped}");
    assert_eq!(
        stopped["detail"],
        "stopped: this node no longer holds its owner; its launch is kept for the node that holds the owner next"
    );
    assert_eq!(running(&a).await.len(), 0);
    // It answers again: the process comes back, once.
    pg.run();
    let back = pids_running(&a, 1).await;
    assert_ne!(back[0], pid);
    take_overs_settled(&a).await;
    assert_eq!(running(&a).await.len(), 1);
    let recoveries = process_receipts(&a, |r| r["message"] == "recovery");
    assert_eq!(recoveries.len(), 1, "{recoveries:#?}");
    assert_eq!(recoveries[0]["old_pid"], pid);
    assert_eq!(reaches(&a, &owner, back[0]).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_storage_slot_is_refused_by_name_and_nothing_runs() {
    let pg = Postgres::start();
    let a = runner_node(&pg, "a", &node_dir("procs-slot", "a"), &[]);
    let image = push_image(&a, &common::guest("resident")).await;
    let r = call(
        &a,
        "POST",
        &format!("/r/owner/spawn/{image}?slot=app&durable=1"),
        b"",
    )
    .await;
    assert!(
        r.status.is_client_error() || r.status.is_server_error(),
        "{}",
        r.text()
    );
    assert!(
        r.text()
            .contains("cluster_unsupported: a durable storage slot is one node's files"),
        "{}",
        r.text()
    );
    assert_eq!(running(&a).await.len(), 0);
    // An ephemeral slot is the node's own for the process's life: allowed.
    let pid = spawn(&a, "owner", &image, "slot=scratch").await;
    assert_eq!(pids_running(&a, 1).await, [pid]);
}

/// How many times `node`'s actors hibernated.
async fn hibernations(node: &Weir) -> u64 {
    node.admin_get("/actors").await.json()["status"]["hibernations"]
        .as_u64()
        .unwrap()
}

/// Waits (at most a minute) until `node`'s actors hibernated more than
/// `past` times.
async fn hibernated_past(node: &Weir, past: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = hibernations(node).await;
        if now > past {
            return now;
        }
        assert!(Instant::now() < deadline, "no hibernation past {past}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_hibernates_and_wakes_while_its_processes_run_and_their_ends_clear_its_row() {
    let pg = Postgres::start();
    let a = runner_node(
        &pg,
        "a",
        &node_dir("procs-idle", "a"),
        &["--limit", "actor_idle_ms=100"],
    );
    let image = push_image(&a, &common::guest("resident")).await;
    let owner = placed_on("a", &["a"]);
    let first = spawn(&a, &owner, &image, "").await;
    let second = spawn(&a, &owner, &image, "").await;
    let slept = hibernated_past(&a, 0).await;
    // Its storage opens again for a call: what runs here is not owed, and
    // nothing starts again.
    assert_eq!(reaches(&a, &owner, first).await, 200);
    assert_eq!(pids_running(&a, 2).await, [first, second]);
    assert!(
        process_receipts(&a, |r| r["message"] == "recovery").is_empty(),
        "nothing was re-driven"
    );
    // Killed from outside while the owner sleeps: each end deletes its
    // row, its storage opened for it, and the last takes the row's flag.
    hibernated_past(&a, slept).await;
    for pid in [second, first] {
        let r = a
            .admin_send("DELETE", &format!("/processes/runner/{owner}/{pid}"))
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while journaled(&pg, &owner) != "f" {
        assert!(
            Instant::now() < deadline,
            "the owner's row still says it has launches"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(running(&a).await.len(), 0);
    let launches = a.admin_get(&format!("/actors/runner/{owner}")).await;
    assert_eq!(
        launches.json()["launches"],
        serde_json::json!([]),
        "{}",
        launches.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_stops_its_process_when_it_runs_again_and_one_copy_is_left() {
    let pg = Postgres::start();
    let a = runner_node(&pg, "a", &node_dir("procs-pause", "a"), &[]);
    let b = runner_node(&pg, "b", &node_dir("procs-pause", "b"), &[]);
    let image = push_image(&a, &common::guest("resident")).await;
    let owner = placed_on("a", &["a", "b"]);
    let pid = spawn(&a, &owner, &image, "").await;
    // a stops, process and all, past its lease: b takes the owner over.
    a.signal("STOP");
    let back = pids_running(&b, 1).await;
    assert_ne!(back[0], pid);
    // a runs again: its lease is over by its own clock, so it stops its
    // copy (its launch kept, for whoever holds the owner: b does).
    a.signal("CONT");
    let stopped = a
        .first_logged("weir::process", |r| r["outcome"] == "stopped")
        .await;
    assert_eq!(stopped["pid"], pid, "{stopped}");
    assert_eq!(running(&a).await.len(), 0);
    // One copy is left, b's, and nothing starts again: a does not hold
    // the owner, and b runs what its journal names.
    take_overs_settled(&a).await;
    take_overs_settled(&b).await;
    assert_eq!(running(&a).await.len(), 0);
    assert_eq!(pids_running(&b, 1).await, back);
    assert_eq!(
        reaches(&a, &owner, back[0]).await,
        200,
        "reached through a, on b"
    );
    let recoveries = process_receipts(&b, |r| r["message"] == "recovery");
    assert_eq!(recoveries.len(), 1, "{recoveries:#?}");
    assert!(process_receipts(&a, |r| r["message"] == "recovery").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_lapsed_by_the_nodes_own_clock_is_not_taken_back_and_its_processes_start_under_a_new_one()
 {
    let pg = Postgres::start();
    // A lease of 20 s: the node's own end of it comes 2 s before the
    // cluster's, when the database may still answer the renewal.
    let a = runner_node(
        &pg,
        "a",
        &node_dir("procs-regain", "a"),
        &["--limit", "cluster_lease_ms=20000"],
    );
    let image = push_image(&a, &common::guest("resident")).await;
    let owner = placed_on("a", &["a"]);
    let pid = spawn(&a, &owner, &image, "").await;
    let before = session(&a).await;
    assert!(before.is_i64(), "{before}");
    // The database stops answering: by its own clock the node's lease
    // ends, and it stops the process, its launch kept.
    pg.freeze();
    let stopped = a
        .first_logged("weir::process", |r| r["outcome"] == "stopped")
        .await;
    assert_eq!(stopped["pid"], pid, "{stopped}");
    // It answers again before the cluster's end of the lease. A renewal
    // answered now proves nothing of the time between the node's end
    // and the cluster's (another node could have claimed the owner), so
    // the session is over: the node registers a new one, takes the owner
    // again, and starts the process again itself, once.
    pg.thaw();
    let back = pids_running(&a, 1).await;
    assert_ne!(back[0], pid);
    let after = session(&a).await;
    assert!(after.is_i64(), "{after}");
    assert_ne!(after, before, "a new session");
    take_overs_settled(&a).await;
    assert_eq!(pids_running(&a, 1).await, back);
    let recoveries = process_receipts(&a, |r| r["message"] == "recovery");
    assert_eq!(recoveries.len(), 1, "{recoveries:#?}");
    assert_eq!(recoveries[0]["old_pid"], pid);
    assert_eq!(reaches(&a, &owner, back[0]).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawn_the_database_did_not_confirm_is_started_once_if_the_database_kept_it() {
    let pg = Postgres::start();
    // A lease of 20 s: the database may stall for seconds and the node
    // still hold the owner when it answers again.
    let a = runner_node(
        &pg,
        "a",
        &node_dir("procs-unconfirmed", "a"),
        &[
            "--limit",
            "cluster_lease_ms=20000",
            "--limit",
            "event_limit_ms=2000",
        ],
    );
    let image = push_image(&a, &common::guest("resident")).await;
    let owner = placed_on("a", &["a"]);
    let r = call(&a, "GET", &format!("/r/{owner}/recovered"), b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // The database stops answering as the spawn's launch row is on its
    // way: the spawn's turn ends at its deadline, unconfirmed, and
    // nothing starts. The row waits in the database's queue, and is kept
    // when it answers again.
    pg.freeze();
    let path = format!("/r/{owner}/spawn/{image}");
    // Refused at the event's deadline (2 s, set above), the database
    // still frozen; it answers again once the refusal is in.
    let spawned = call(&a, "POST", &path, b"").await;
    pg.thaw();
    assert_eq!(spawned.status, 503, "{}", spawned.text());
    assert_eq!(spawned.json()["error"], "event_deadline_exceeded");
    // With no call to the owner, the node opens it again and starts the
    // launch the database kept, once, and tells the owner.
    let back = pids_running(&a, 1).await;
    assert_eq!(journaled(&pg, &owner), "t");
    let recovered = a
        .first_logged("weir::process", |r| r["outcome"] == "recovered")
        .await;
    assert_eq!(recovered["new_pid"], back[0], "{recovered}");
    let old = recovered["old_pid"].as_u64().unwrap();
    let told = told(&a, &owner, 1).await;
    assert_eq!(
        told,
        serde_json::json!([{ "old": old, "new": back[0], "outcome": "restarted" }])
    );
    take_overs_settled(&a).await;
    assert_eq!(pids_running(&a, 1).await, back);
    let recoveries = process_receipts(&a, |r| r["message"] == "recovery");
    assert_eq!(recoveries.len(), 1, "{recoveries:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_still_booting_when_its_nodes_lease_ends_is_stopped_and_runs_once_on_the_next_owner()
 {
    let pg = Postgres::start();
    let link = Partition::to(&pg);
    // Turns long enough for a boot of 3 s.
    let extra = ["--limit", "event_limit_ms=20000"];
    let a = runner_node(&link, "a", &node_dir("procs-booting", "a"), &extra);
    let b = runner_node(&pg, "b", &node_dir("procs-booting", "b"), &extra);
    let image = push_image(&a, &common::guest("resident")).await;
    let owner = placed_on("a", &["a", "b"]);
    // A start that takes 3 s, spawned through a.
    let spawning = {
        let (addr, path) = (
            a.addr,
            format!("/r/{owner}/spawn/{image}?slot=scratch&start=slow"),
        );
        tokio::spawn(async move {
            common::send_to(
                addr,
                http::Request::post(path)
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap(),
            )
            .await
        })
    };
    // Once its launch is journaled, a is cut off from the database: its
    // own end of its lease comes within the boot.
    let deadline = Instant::now() + Duration::from_secs(30);
    while journaled(&pg, &owner) != "t" {
        assert!(Instant::now() < deadline, "the launch was never journaled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    link.cut();
    // The boot is stopped with a's hold on the owner: the spawn fails,
    // and a runs nothing, now or later (never a copy that boots after a's
    // lease ended, to be stopped once it is up).
    let spawned = spawning.await.unwrap();
    assert_ne!(spawned.status, 200, "{:?}", spawned.body);
    // b takes the owner over and starts the process, once.
    let on_b = pids_running(&b, 1).await;
    assert_eq!(running(&a).await.len(), 0);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        running(&a).await.len(),
        0,
        "a copy booted on a after its lease ended"
    );
    assert_eq!(pids_running(&b, 1).await, on_b);
    // No copy ever came up on a: its start did not run on past a's end of
    // the lease, while b's ran.
    let on_a = process_receipts(&a, |r| r["message"] == "process");
    assert!(on_a.is_empty(), "{on_a:#?}");
}

/// SECURITY.md: a secret's value is resolved at every launch and written
/// nowhere, which in cluster mode includes the cluster's database, where
/// the owner's journal is mirrored (its launch rows name the secret).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secrets_value_reaches_no_table_of_the_clusters_database() {
    const VALUE: &str = "cluster-secret-value-7c1f";
    let pg = Postgres::start();
    let dir = node_dir("procs-secret", "a");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token.txt"), format!("{VALUE}\n")).unwrap();
    let runner = common::guest("runner");
    let config = dir.join("weir.toml");
    std::fs::write(
        &config,
        format!(
            "app = {runner:?}\n\n[actors.runner]\ncomponent = {runner:?}\nroute = \"/r\"\n\n\
             [actors.runner.secrets]\ntoken = {{ file = \"token.txt\" }}\n"
        ),
    )
    .unwrap();
    let (url, lease) = (pg.url(), format!("cluster_lease_ms={LEASE_MS}"));
    let a = Weir::start_with_env(
        &[
            "--config",
            config.to_str().unwrap(),
            "--data-dir",
            dir.to_str().unwrap(),
            "--cluster",
            &url,
            "--node",
            "a",
            "--cluster-listen",
            "127.0.0.1:0",
            "--limit",
            &lease,
            "--limit",
            "memory_limit_bytes=33554432",
        ],
        &[("WEIR_CLUSTER_SECRET", SECRET)],
    );
    let image = push_image(&a, &common::guest("cmdprobe")).await;
    let pid = spawn(
        &a,
        "owner",
        &image,
        "contract=lifetime&arg=hold&secret=TOKEN=token&on_crash=restart_once",
    )
    .await;
    // The process has the value; the owner's journal is in the database.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let read = call(
            &a,
            "GET",
            &format!("/r/owner/output/{pid}?offset=0&timeout=1000"),
            b"",
        )
        .await;
        if read.json()["data"]
            .as_str()
            .is_some_and(|t| t.contains(&format!("env TOKEN={VALUE}\n")))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{}", read.text());
    }
    assert_eq!(journaled(&pg, "owner"), "t");
    let dump = pg.dump();
    let hex = |text: &str| -> String { text.bytes().map(|b| format!("{b:02x}")).collect() };
    // The launch row is there, readable (its secret named, as plain
    // bytes): a dump that held the value would show it.
    let name = r#"["TOKEN","token"]"#;
    assert!(
        dump.contains(name) || dump.contains(&hex(name)),
        "the journal is not where this test looks: {} bytes of dump",
        dump.len()
    );
    assert!(
        !dump.contains(VALUE) && !dump.contains(&hex(VALUE)),
        "the secret's value is in the cluster's database"
    );
}
