//! Key-value stores and SQL databases in cluster mode, from outside: each
//! is owned by one node, a worker on any node reaches it, and its owner's
//! death loses nothing acknowledged.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::Weir;
use common::cluster::{Postgres, node_dir, node_with_app, until_ok};
use http::Request;
use http_body_util::Full;
use serde_json::json;

const NAMES: [&str; 3] = ["n1", "n2", "n3"];

fn kv_nodes(pg: &Postgres, test: &str) -> Vec<Weir> {
    let kv = common::guest("kv");
    NAMES
        .iter()
        .map(|n| node_with_app(pg, n, &node_dir(test, n), &kv, &["--kv-store", "counters"]))
        .collect()
}

async fn incr(node: &Weir, key: &str) -> common::Resp {
    node.send(
        Request::post(format!("/kv/incr?store=counters&key={key}"))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_has_one_owner_and_every_node_reaches_it() {
    let pg = Postgres::start();
    let nodes = kv_nodes(&pg, "kv-owner");
    for i in 1..=30u64 {
        let r = incr(&nodes[i as usize % 3], "n").await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.text(), i.to_string(), "one counter, whichever node");
    }
    // Sets and gets across nodes; a missing key and store answer as the
    // interface says.
    let r = nodes[0]
        .send(
            Request::put("/kv/set?store=counters&key=greeting")
                .body(Full::new(Bytes::from_static(b"\x00hello\xff")))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, 200);
    for node in &nodes {
        let r = node.get("/kv/get?store=counters&key=greeting").await;
        assert_eq!(r.body.as_deref().unwrap(), b"\x00hello\xff");
        assert_eq!(
            node.get("/kv/get?store=counters&key=nope").await.status,
            404
        );
        let r = node.get("/kv/open?store=undeclared").await;
        assert_eq!(r.status, 500);
        assert!(r.text().contains("NoSuchStore"), "{}", r.text());
    }
    let owners = pg.psql(
        "weir",
        "SELECT count(*) FROM weir_objects WHERE key = 'kv/kv/counters' AND owner IS NOT NULL",
    );
    assert_eq!(owners, "1");
    // Listing goes through the owner from a node that is not it.
    let r = nodes[1].get("/kv/list?store=counters").await;
    let keys: Vec<String> = r.text().lines().map(str::to_string).collect();
    assert_eq!(keys, ["greeting", "n"]);
}

async fn batch(node: &Weir, statements: serde_json::Value) -> serde_json::Value {
    let body = json!({ "db": "app", "statements": statements }).to_string();
    let req = Request::post("/batch")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    node.send(req).await.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_has_one_owner_and_batches_run_there_from_every_node() {
    let pg = Postgres::start();
    let sql = common::guest("sqlprobe");
    let nodes: Vec<Weir> = NAMES
        .iter()
        .map(|n| {
            node_with_app(
                &pg,
                n,
                &node_dir("sql-owner", n),
                &sql,
                &["--sql-database", "app"],
            )
        })
        .collect();
    let r = batch(
        &nodes[0],
        json!([{ "sql": "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, b BLOB)" }]),
    )
    .await;
    assert!(r["results"].is_array(), "{r}");
    for (i, node) in nodes.iter().enumerate() {
        let r = batch(
            node,
            json!([{ "sql": "INSERT INTO t (v, b) VALUES (?1, ?2)", "params": [format!("from {i}"), { "blob": [0, 255, i] }] }]),
        )
        .await;
        assert_eq!(r["results"][0]["rows_written"], 1, "{r}");
        assert_eq!(r["results"][0]["last_insert_id"], (i + 1) as i64, "{r}");
    }
    for node in &nodes {
        let r = batch(node, json!([{ "sql": "SELECT id, v FROM t ORDER BY id" }])).await;
        assert_eq!(
            r["results"][0]["rows"],
            json!([[1, "from 0"], [2, "from 1"], [3, "from 2"]]),
            "{r}"
        );
    }
    // A failing statement names its index through the hop; nothing of the
    // batch is kept.
    let r = batch(
        &nodes[2],
        json!([
            { "sql": "INSERT INTO t (v) VALUES ('kept?')" },
            { "sql": "INSERT INTO missing VALUES (1)" }
        ]),
    )
    .await;
    let error = r["error"].as_str().unwrap();
    assert!(error.contains("index: 1"), "{error}");
    let r = batch(&nodes[1], json!([{ "sql": "SELECT count(*) FROM t" }])).await;
    assert_eq!(r["results"][0]["rows"], json!([[3]]));
    // Confinement holds on the owner, wherever the batch came from.
    let r = batch(
        &nodes[1],
        json!([{ "sql": "ATTACH DATABASE '/tmp/x' AS x" }]),
    )
    .await;
    assert!(r["error"].as_str().unwrap().contains("Refused"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_a_stores_owner_under_increments_loses_none() {
    let pg = Postgres::start();
    let mut nodes: Vec<Option<Weir>> = kv_nodes(&pg, "kv-kill").into_iter().map(Some).collect();
    let mut acked = Vec::new();
    let mut refused = std::collections::BTreeMap::<String, usize>::new();
    for round in 0..3 {
        // Increments through every live node, then the owner dies.
        for i in 0..60 {
            let live: Vec<&Weir> = nodes.iter().flatten().collect();
            let r = incr(live[i % live.len()], "hits").await;
            if r.status == 200 {
                acked.push(r.text().parse::<u64>().unwrap());
            } else {
                *refused.entry(r.text()).or_default() += 1;
            }
        }
        let owner = pg.psql(
            "weir",
            "SELECT n.name FROM weir_objects o JOIN weir_nodes n ON n.session = o.owner \
                 WHERE o.key = 'kv/kv/counters' AND n.expires_at > now()",
        );
        let i = NAMES
            .iter()
            .position(|n| *n == owner)
            .unwrap_or_else(|| panic!("round {round}: owner {owner:?}"));
        let mut dead = nodes[i].take().unwrap();
        dead.signal("KILL");
        dead.wait_exit(Duration::from_secs(10)).unwrap();
        drop(dead);
        // The store answers again through a survivor.
        let survivor = nodes.iter().flatten().next().unwrap();
        let r = until_ok(survivor, "POST", "/kv/incr?store=counters&key=hits", "").await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        acked.push(r.text().parse().unwrap());
        nodes[i] = Some(node_with_app(
            &pg,
            NAMES[i],
            &node_dir("kv-kill", NAMES[i]),
            &common::guest("kv"),
            &["--kv-store", "counters"],
        ));
    }
    let distinct: std::collections::BTreeSet<u64> = acked.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        acked.len(),
        "an acknowledged increment was counted twice: lost"
    );
    let last = incr(nodes[0].as_ref().unwrap(), "hits").await;
    let now: u64 = last.text().parse().unwrap();
    assert!(now > *acked.iter().max().unwrap());
    println!(
        "{} increments acknowledged over 3 kills; refused meanwhile {refused:?}",
        acked.len()
    );
}
