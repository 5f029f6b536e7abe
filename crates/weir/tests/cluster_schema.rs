//! The cluster database's schema, from outside, with a real PostgreSQL
//! and real nodes: a node that starts beside running ones finds the
//! schema complete by reading the catalog, and takes no lock that makes
//! any other session wait, so a backup's long read (which holds every
//! table) neither keeps it from starting nor makes it stall the others;
//! a part of the schema a newer build adds (an index, a column) waits,
//! naming who holds its table, while a writer's open transaction or a
//! backup holds it, without keeping its place in the table's queue (the
//! running node's statements wait only while one try waits), and is added
//! once the table is free, or fails the start naming its holders once
//! `cluster_schema_patience_ms` has passed; a schema newer than the build
//! is refused, unwritten; and so is a database reached through a pooler
//! that does not keep a server session for each connection (PgBouncer in
//! transaction or statement mode), which would move each connection's
//! setting and its prepared statements to other connections.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::cluster::{
    Database, PgBouncer, Postgres, node, node_dir, node_that_stops_at_start, put, session,
};

/// Whether the index of journaled owners is there.
const JOURNALED_INDEX: &str =
    "SELECT count(*) FROM pg_indexes WHERE indexname = 'weir_objects_journaled'";

const SCHEMA: &str = "weir_cluster::postgres::schema";

/// What `node` said when its schema change waited for a table.
async fn waited_for(node: &common::Weir) -> serde_json::Value {
    node.first_logged(SCHEMA, |r| {
        r["message"] == "the cluster database's schema change waits for a table others hold"
    })
    .await
}

/// What `node` said when it completed the schema.
async fn completed(node: &common::Weir) -> serde_json::Value {
    node.first_logged(SCHEMA, |r| {
        r["message"] == "the cluster database's schema was completed"
    })
    .await
}

/// Calls to new actors through the node at `addr`, one after another
/// until `stop` is set: a first call to an actor writes its row of
/// `weir_objects`. Their statuses.
fn calls_until(
    addr: std::net::SocketAddr,
    prefix: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<u16>> {
    tokio::spawn(async move {
        let mut statuses = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let r = put(addr, &format!("{prefix}{}", statuses.len()), "x").await;
            statuses.push(r.status.as_u16());
        }
        statuses
    })
}

/// Samples, until `stop` is set, how many statements of the nodes'
/// wait for a lock, as PostgreSQL sees them.
fn lock_waits_until(pg: &Postgres, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<usize>> {
    let psql = pg.client();
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let waiting = psql.psql(
                "weir",
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'weir' AND wait_event_type = 'Lock'",
            );
            samples.push(waiting.parse().unwrap());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        samples
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_while_a_backup_runs_starts_and_holds_up_no_call() {
    let pg = Postgres::start();
    let a = node(&pg, "a", &node_dir("schema-backup", "a"), &[]);
    assert_eq!(a.get("/direct/warm/get?key=k").await.status, 404);

    let backup = pg.back_up();
    let stop = Arc::new(AtomicBool::new(false));
    let calls = calls_until(a.addr, "during-", stop.clone());
    let waits = lock_waits_until(&pg, stop.clone());
    // A start blocks this thread until the node serves; the calls and
    // the watch go on meanwhile.
    let b = node(&pg, "b", &node_dir("schema-backup", "b"), &[]);
    assert!(session(&b).await.is_i64());
    // A few more calls with both nodes up.
    let r = b.get("/direct/after/get?key=k").await;
    assert_eq!(r.status, 404, "{}", r.text());
    stop.store(true, Ordering::Relaxed);
    let statuses = calls.await.unwrap();
    let waits = waits.join().unwrap();
    println!(
        "{} calls through a while b started; statements waiting for a lock, sampled: {waits:?}",
        statuses.len()
    );
    assert!(!statuses.is_empty());
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert!(waits.iter().all(|&n| n == 0), "{waits:?}");
    // It found nothing to add.
    let changed = b.logged(SCHEMA);
    assert!(changed.is_empty(), "{changed:#?}");
    // The first node made the whole schema, and said so.
    let made = completed(&a).await;
    assert!(
        made["added"]
            .as_str()
            .unwrap()
            .starts_with("weir_schema, weir_nodes, weir_nodes_name, weir_objects"),
        "{made}"
    );
    drop(backup);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_index_waits_for_a_writer_that_holds_its_table_and_names_it() {
    let pg = Postgres::start();
    let a = node(&pg, "a", &node_dir("schema-index", "a"), &[]);
    let r = put(a.addr, "kept", "1").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // A database an older build made lacks the index of journaled
    // owners (the running node does without it); a session has written
    // a row of the table it indexes, and left its transaction open.
    pg.psql("weir", "DROP INDEX weir_objects_journaled");
    let writer =
        pg.hold("UPDATE weir_objects SET epoch = epoch WHERE key = 'actor/gateway/probe/kept'");

    let stop = Arc::new(AtomicBool::new(false));
    let calls = calls_until(a.addr, "during-", stop.clone());
    let waits = lock_waits_until(&pg, stop.clone());
    let dir = node_dir("schema-index", "b");
    let b = std::thread::scope(|s| {
        let b = s.spawn(|| node(&pg, "b", &dir, &[]));
        // The writer goes on for a while, and the index cannot be built.
        std::thread::sleep(std::time::Duration::from_secs(3));
        assert_eq!(pg.psql("weir", JOURNALED_INDEX), "0");
        assert!(!b.is_finished());
        drop(writer);
        b.join().unwrap()
    });
    assert_eq!(pg.psql("weir", JOURNALED_INDEX), "1");
    stop.store(true, Ordering::Relaxed);
    let statuses = calls.await.unwrap();
    let waits = waits.join().unwrap();
    println!(
        "{} calls through a while b waited; statements waiting for a lock, sampled: {waits:?}",
        statuses.len()
    );
    assert!(statuses.len() > 1, "{statuses:?}");
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    // B's tries made statements wait (its own, and a's behind it), and
    // each try gave up its place: between them, none waited.
    let first = waits.iter().position(|&n| n > 0).expect("b's tries waited");
    let last = waits.iter().rposition(|&n| n > 0).unwrap();
    assert!(waits[first..last].contains(&0), "{waits:?}");

    // B said what it waited for, and for whom.
    let waited = waited_for(&b).await;
    assert_eq!(waited["missing"], "weir_objects_journaled", "{waited}");
    assert_eq!(waited["table"], "weir_objects", "{waited}");
    let held_by = waited["held_by"].as_str().unwrap();
    assert!(
        held_by.contains("(psql, idle in transaction, in a transaction since "),
        "{held_by}"
    );
    assert_eq!(completed(&b).await["added"], "weir_objects_journaled");
    assert!(session(&b).await.is_i64());
    let r = b.get("/direct/kept/get?key=k").await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "1".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_column_waits_for_a_backup_to_end() {
    let pg = Postgres::start();
    {
        let _a = node(&pg, "a", &node_dir("schema-column", "a"), &[]);
    }
    // A database an older build made lacks the journaled column (and so
    // its index), and a backup of it runs.
    pg.psql("weir", "ALTER TABLE weir_objects DROP COLUMN journaled");
    let backup = pg.back_up();
    let dir = node_dir("schema-column", "b");
    let b = std::thread::scope(|s| {
        let b = s.spawn(|| node(&pg, "b", &dir, &[]));
        std::thread::sleep(std::time::Duration::from_secs(2));
        assert_eq!(pg.psql("weir", JOURNALED_INDEX), "0");
        assert!(!b.is_finished());
        drop(backup);
        b.join().unwrap()
    });
    let waited = waited_for(&b).await;
    assert_eq!(
        waited["missing"], "weir_objects.journaled, weir_objects_journaled",
        "{waited}"
    );
    assert!(
        waited["held_by"]
            .as_str()
            .unwrap()
            .contains("(psql, idle in transaction"),
        "{waited}"
    );
    assert_eq!(
        completed(&b).await["added"],
        "weir_objects.journaled, weir_objects_journaled"
    );
    assert_eq!(pg.psql("weir", JOURNALED_INDEX), "1");
    let r = put(b.addr, "after", "1").await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_table_held_past_the_patience_fails_the_start_naming_who_holds_it() {
    let pg = Postgres::start();
    {
        let _a = node(&pg, "a", &node_dir("schema-patience", "a"), &[]);
    }
    pg.psql("weir", "DROP INDEX weir_objects_journaled");
    let writer = pg.hold("UPDATE weir_objects SET epoch = epoch");
    let began = std::time::Instant::now();
    let out = node_that_stops_at_start(
        &pg.url(),
        "b",
        &node_dir("schema-patience", "b"),
        &["--limit", "cluster_schema_patience_ms=1500"],
    );
    let took = began.elapsed();
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let said = out.stderr.trim().lines().last().unwrap_or_default();
    assert!(
        said.contains(
            "the schema change (weir_objects_journaled) could not lock weir_objects for 1500 ms \
             (cluster_schema_patience_ms); it is held by pid "
        ) && said.contains("(psql, idle in transaction, in a transaction since "),
        "{}",
        out.stderr
    );
    println!("the start gave up after {took:?}");
    // It tried for its patience, and gave up on it: not at once, and not
    // at the default's two minutes (the rest of a start takes seconds).
    assert!(
        took >= Duration::from_millis(1500),
        "gave up after {took:?}"
    );
    assert!(
        took < Duration::from_secs(60),
        "the patience of 1500 ms was not what ended it: {took:?}"
    );
    assert_eq!(pg.psql("weir", JOURNALED_INDEX), "0");
    drop(writer);
}

#[test]
fn a_schema_newer_than_the_build_is_refused_and_left_unwritten() {
    let pg = Postgres::start();
    {
        let _a = node(&pg, "a", &node_dir("schema-newer", "a"), &[]);
    }
    pg.psql("weir", "UPDATE weir_schema SET version = version + 1");
    let nodes = "SELECT count(*) FROM weir_nodes";
    let before = pg.psql("weir", nodes);
    let out = node_that_stops_at_start(&pg.url(), "b", &node_dir("schema-newer", "b"), &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.trim().ends_with(
            "the cluster database refused: the cluster database has schema version 2; this build knows 1"
        ),
        "{}",
        out.stderr
    );
    assert_eq!(pg.psql("weir", nodes), before);
    assert_eq!(pg.psql("weir", "SELECT version FROM weir_schema"), "2");
}

#[test]
fn a_pooler_that_shares_server_sessions_between_connections_is_refused_unwritten() {
    let pg = Postgres::start();
    let tables = "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'weir\\_%'";
    // An idle pooler hands a pair of connections one session; one that
    // rotates its sessions (round robin, over sessions opened before)
    // gives a connection's next statement another session.
    let rotating = "server_round_robin = 1\n";
    for (mode, more) in [
        ("transaction", ""),
        ("statement", ""),
        ("transaction", rotating),
    ] {
        let bouncer = PgBouncer::pooling(&pg, mode, more);
        if !more.is_empty() {
            // Three sessions open at once, for the rotation to go round.
            let held: Vec<_> = (0..3)
                .map(|_| {
                    let psql = bouncer.client();
                    std::thread::spawn(move || {
                        psql.psql("weir", "BEGIN; SELECT pg_sleep(0.5); COMMIT")
                    })
                })
                .collect();
            for h in held {
                h.join().unwrap();
            }
        }
        let out = node_that_stops_at_start(
            &bouncer.url(),
            "a",
            &node_dir("pooled", &format!("{mode}{}", more.len())),
            &[],
        );
        assert_eq!(out.code, Some(1), "{mode} {more}: {}", out.stderr);
        assert!(
            out.stderr.trim().ends_with(
                "the cluster database refused: the node's connections do not keep a \
                 server session each (a pooler in transaction or statement mode, such as \
                 PgBouncer's pool_mode = transaction?): a node needs a session of its own \
                 on each connection; pool by session"
            ),
            "{mode} {more}: {}",
            out.stderr
        );
        // Refused before the schema is made: the database is left as it was.
        assert_eq!(pg.psql("weir", tables), "0", "{mode} {more}");
    }
    // The same database through a pooler by session: the node starts.
    let bouncer = PgBouncer::start(&pg);
    let a = node(&bouncer, "a", &node_dir("pooled", "session"), &[]);
    assert_ne!(pg.psql("weir", tables), "0");
    drop(a);
}
