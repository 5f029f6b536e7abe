//! Cluster mode on a database that is slow to answer some statements: a
//! table held locked by another session, as a long migration or a
//! `VACUUM FULL` would hold it. From outside, with a real PostgreSQL and a
//! real node: what waits on the locked table is refused by name within the
//! statement bound, and the database itself ends each such statement by
//! then (none is left running, holding its connection and its locks, after
//! the node gave up on it); nothing else of the node waits with it (its
//! lease least of all); and once the table is free everything works again.
//! A write whose answer the database never sent in time, but which it
//! kept, is what the next call sees.

mod common;

use common::cluster::{PgBouncer, Postgres, node, node_dir, put, session};
use serde_json::Value;

/// More calls at once than the node keeps connections to the database
/// (`weir_cluster::postgres::POOL_SIZE`, 16): every connection waits on
/// the lock, and more calls wait for a connection.
const CALLS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_stuck_behind_a_locked_table_are_refused_by_name_and_the_lease_holds() {
    let pg = Postgres::start();
    let a = node(&pg, "a", &node_dir("slow-db", "a"), &[]);
    stuck_calls_are_refused_and_the_lease_holds(&pg, &a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_a_node_runs_and_its_statements_are_bounded_as_without_it() {
    // PgBouncer refuses a startup parameter it does not know (`options`,
    // where the bound on statements could go): a node sets the bound on
    // each connection once it is open instead, so it starts through a
    // pooler of default settings and keeps the bound. Its cancels go
    // through PgBouncer too (1.18, Debian 12's, drops a cancel whose
    // client half-closes its socket once it is sent).
    let pg = Postgres::start();
    let bouncer = PgBouncer::start(&pg);
    let a = node(&bouncer, "a", &node_dir("slow-db-bouncer", "a"), &[]);
    stuck_calls_are_refused_and_the_lease_holds(&pg, &a).await;
    let log = bouncer.log();
    assert!(log.contains("login attempt: db=weir user=weir"), "{log}");
    assert!(!log.contains("unsupported startup parameter"), "{log}");
}

/// Locks `weir_objects` and sends [`CALLS`] first calls through `a`: each
/// is refused 503 `storage_unavailable`, PostgreSQL ends each statement
/// before the node stops waiting for it (or the node has it cancelled
/// when it stops), and the node's lease goes on untouched; once the table
/// is free, the same calls succeed.
async fn stuck_calls_are_refused_and_the_lease_holds(pg: &Postgres, a: &common::Weir) {
    let r = put(a.addr, "warm", "1").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let held = session(a).await;
    assert!(held.is_i64(), "{held}");

    // Every actor's row is locked: a first call to an actor cannot claim
    // it, and waits, on every connection the node has.
    let lock = pg.lock_table("weir_objects");
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let addr = a.addr;
            tokio::spawn(async move { put(addr, &format!("slow-{i}"), "x").await })
        })
        .collect();
    // Meanwhile, how long the node's longest statement has been running,
    // by the database's own clock.
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let longest = std::thread::spawn({
        let (answered, psql) = (answered.clone(), pg.client());
        move || {
            let mut longest = 0f64;
            let after = |at: &mut Option<std::time::Instant>| {
                at.get_or_insert_with(std::time::Instant::now).elapsed()
            };
            let mut answered_at = None;
            while !answered.load(std::sync::atomic::Ordering::Relaxed)
                || after(&mut answered_at) < std::time::Duration::from_secs(4)
            {
                let running = psql.psql(
                    "weir",
                    "SELECT coalesce(max(extract(epoch FROM now() - query_start)), 0) \
                     FROM pg_stat_activity WHERE application_name = 'weir' AND state = 'active'",
                );
                longest = longest.max(running.parse::<f64>().unwrap());
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            longest
        }
    });
    let mut refused = std::collections::BTreeMap::<String, usize>::new();
    for call in calls {
        let r = call.await.unwrap();
        assert_eq!(r.status, 503, "{}", r.text());
        let code = serde_json::from_slice::<Value>(r.body.as_deref().unwrap_or_default())
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_default();
        *refused.entry(code).or_default() += 1;
    }
    answered.store(true, std::sync::atomic::Ordering::Relaxed);
    let longest = longest.join().unwrap();
    println!(
        "refused while the table was locked: {refused:?}; the longest statement ran {longest:.2} s"
    );
    // The database ended each statement before the node stopped waiting
    // for it (5 s, `weir_cluster::postgres::CALL_TIMEOUT`).
    assert!(longest < 5.0, "a statement ran {longest} s");
    // A statement sent late in its call (after the wait for a connection)
    // was still running when the node gave up on the call: the node had
    // it cancelled then, rather than leave it to run its 4.5 s.
    let log = pg.log();
    let cancelled = log
        .matches("canceling statement due to user request")
        .count();
    let timed_out = log
        .matches("canceling statement due to statement timeout")
        .count();
    println!("cancelled by the node: {cancelled}; by the statement timeout: {timed_out}");
    assert!(cancelled > 0, "{log}");

    assert_eq!(
        refused.keys().collect::<Vec<_>>(),
        ["storage_unavailable"],
        "{refused:?}"
    );
    // The lease went on, on its own connection: the same session, and
    // not one renewal missed.
    assert_eq!(
        session(a).await,
        held,
        "{:#?}",
        a.logged("weir_cluster::lease")
    );
    let lease: Vec<Value> = a
        .logged("weir_cluster::lease")
        .into_iter()
        .filter(|r| r["message"] != "holding the cluster lease")
        .collect();
    assert!(lease.is_empty(), "{lease:#?}");

    // The table is free: the same calls succeed, and what they wrote is
    // there.
    drop(lock);
    for i in 0..CALLS {
        let name = format!("slow-{i}");
        let r = put(a.addr, &name, &format!("v{i}")).await;
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        let r = a.get(&format!("/direct/{name}/get?key=k")).await;
        assert_eq!((r.status.as_u16(), r.text()), (200, format!("v{i}")));
    }
    assert_eq!(session(a).await, held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_kept_by_a_database_that_answered_too_late_is_what_the_next_read_sees() {
    let pg = Postgres::start();
    // A lease of 20 s: the database may stall for seconds and the node
    // still hold the actor when it answers again.
    let a = node(
        &pg,
        "a",
        &node_dir("slow-db-kept", "a"),
        &[
            "--limit",
            "cluster_lease_ms=20000",
            "--limit",
            "event_limit_ms=2000",
        ],
    );
    let r = put(a.addr, "kept", "before").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let head = |pg: &Postgres| {
        pg.psql(
            "weir",
            "SELECT head FROM weir_objects WHERE key = 'actor/gateway/probe/kept'",
        )
        .parse::<u64>()
        .unwrap()
    };
    let before = head(&pg);
    // The database stops answering while the write's commit is on its
    // way: the write is refused, and the commit waits in the database's
    // queue until it answers again, within the node's lease.
    pg.freeze();
    // Refused at the event's deadline (2 s, set above), the database
    // still frozen; it answers again once the refusal is in.
    let r = put(a.addr, "kept", "after").await;
    pg.thaw();
    assert_eq!(r.status, 503, "{}", r.text());
    let session_held = session(&a).await;
    // Kept: the row's head moved past the write's.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while head(&pg) == before {
        assert!(
            std::time::Instant::now() < deadline,
            "the write was not kept"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The next read answers with what the database kept, not with what
    // the node knew before the write.
    let r = a.get("/direct/kept/get?key=k").await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "after".to_string()));
    assert_eq!(session(&a).await, session_held);
    let reread = a
        .first_logged("weir_cluster::replicas", |r| {
            r["message"] == "a commit whose answer was lost had been kept"
        })
        .await;
    assert_eq!(reread["was"], before, "{reread}");
}
