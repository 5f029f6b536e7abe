//! A write to a key-value store or SQL database from an actor's turn is a
//! commit point of the turn, from outside: on one machine and in cluster
//! mode, the turn's writes before it are durable first (the store write
//! never lands without them), and what the turn wrote after it goes with
//! the turn if the turn fails. A store call whose commit is never
//! answered says so the same way for key-value and SQL: `outcome_unknown`,
//! never "unavailable" for a write that may have run.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::Weir;
use common::cluster::{Postgres, node, node_dir, node_with_app};
use http::Request;
use http_body_util::Full;
use serde_json::json;

/// The stores the actor class is given: one of each kind, named alike.
const STORES: [&str; 4] = ["--kv-store", "shared", "--sql-database", "shared"];

/// An event's limit longer than the node waits for a commit (5 s): the
/// guest sees how its store call ended.
const LONG_EVENT: &str = "event_limit_ms=20000";

async fn post(weir: &Weir, path: &str) -> common::Resp {
    weir.send(Request::post(path).body(Full::new(Bytes::new())).unwrap())
        .await
}

/// An actor's turn writes `store-mark`, writes to the store of `kind`,
/// writes `store-after` and traps: the store write and `store-mark` are
/// kept, `store-after` is not.
async fn a_store_write_keeps_the_writes_before_it(weir: &Weir, actor_prefix: &str) {
    for kind in ["kv", "sql"] {
        let actor = format!("{actor_prefix}{kind}");
        post(
            weir,
            &format!("/probe/{actor}/store-then-trap?{kind}=shared&key={actor}"),
        )
        .await
        .assert_weir_error(503, "instance_abandoned");
        let stored = weir
            .get(&format!(
                "/probe/{actor}/store-read?{kind}=shared&key={actor}"
            ))
            .await;
        assert_eq!(stored.status, 200, "{kind}: {:?}", stored.body);
        assert_eq!(
            stored.text(),
            if kind == "kv" { "stored" } else { "1" },
            "{kind}: the store write is kept"
        );
        // What the turn wrote before it: kept with it.
        let mark = weir
            .get(&format!("/probe/{actor}/get?key=store-mark"))
            .await;
        assert_eq!(
            (mark.status.as_u16(), mark.text()),
            (200, "before".to_string()),
            "{kind}: the store holds the turn's write, so the actor holds what the turn wrote before it"
        );
        // What it wrote after: gone with the failed turn.
        let after = weir
            .get(&format!("/probe/{actor}/get?key=store-after"))
            .await;
        assert_eq!(after.status, 404, "{kind}: {:?}", after.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_one_machine_a_store_write_from_a_turn_lands_with_the_turns_writes_before_it() {
    for durability in ["process", "fsync"] {
        let dir = common::actors::data_dir(&format!("store-points-{durability}"));
        let weir =
            common::actors::start(&dir, &[&STORES[..], &["--durability", durability]].concat());
        a_store_write_keeps_the_writes_before_it(&weir, durability).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_mode_a_store_write_from_a_turn_lands_with_the_turns_writes_before_it() {
    let pg = Postgres::start();
    let n1 = node(&pg, "n1", &node_dir("store-points", "n1"), &STORES);
    let n2 = node(&pg, "n2", &node_dir("store-points", "n2"), &STORES);
    a_store_write_keeps_the_writes_before_it(&n1, "through-n1-").await;
    a_store_write_keeps_the_writes_before_it(&n2, "through-n2-").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_write_whose_commit_is_never_answered_says_it_may_have_run() {
    let pg = Postgres::start();
    let kv = node_with_app(
        &pg,
        "kv",
        &node_dir("store-unknown", "kv"),
        &common::guest("kv"),
        &["--kv-store", "counters", "--limit", LONG_EVENT],
    );
    let sql = node_with_app(
        &pg,
        "sql",
        &node_dir("store-unknown", "sql"),
        &common::guest("sqlprobe"),
        &["--sql-database", "app", "--limit", LONG_EVENT],
    );
    let incr = || post(&kv, "/kv/incr?store=counters&key=hits");
    let batch = |statement: &str| {
        let body = json!({ "db": "app", "statements": [{ "sql": statement }] }).to_string();
        sql.send(
            Request::post("/batch")
                .body(Full::new(Bytes::from(body)))
                .unwrap(),
        )
    };
    assert_eq!(incr().await.text(), "1");
    let created = batch("CREATE TABLE t (v INTEGER)").await.json();
    assert!(created["results"].is_array(), "{created}");
    // The cluster's log held locked past the node's wait for a commit: a
    // write's commit is never answered.
    let held = pg.lock_table("weir_log");
    let counted = incr().await;
    let inserted = batch("INSERT INTO t VALUES (1)").await.json();
    drop(held);
    assert_eq!(counted.status, 500, "{:?}", counted.body);
    assert!(
        counted.text().contains("outcome_unknown: "),
        "a key-value write that may have run: {:?}",
        counted.body
    );
    let said = inserted["error"].as_str().unwrap_or_default();
    assert!(
        said.contains("OutcomeUnknown(\"outcome_unknown: "),
        "a SQL batch that may have run: {inserted}"
    );
    // Both answer again, from what the cluster has.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = kv.get("/kv/get?store=counters&key=hits").await;
        if r.status == 200 {
            // The counter as the cluster has it: counted once or not at all.
            let bytes: [u8; 8] = r.body.as_ref().unwrap()[..].try_into().unwrap();
            assert!([1, 2].contains(&u64::from_le_bytes(bytes)), "{bytes:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{:?}", r.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
