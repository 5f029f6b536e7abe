//! Cluster mode, from outside: a real PostgreSQL, real `weir` nodes on
//! loopback, real clients. Each actor runs on the one node that owns it,
//! every node reaches it, and nothing acknowledged is lost when nodes die,
//! pause, or lose the database.

mod common;

use bytes::Bytes;
use common::cluster::{
    Postgres, actor_key, incr, marker_turns, node, node_dir, node_that_stops_at_start,
    node_with_app, until_ok,
};
use common::{Weir, guest, try_send_to};
use http::Request;
use http_body_util::Full;
use serde_json::json;

/// The receipts of turns of `actor` a node's log holds.
fn turns_of(node: &Weir, actor: &str) -> usize {
    node.actor_receipts()
        .iter()
        .filter(|r| r["name"] == actor && r["turn"] == "request")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_actor_runs_on_one_node_and_every_node_reaches_it() {
    let pg = Postgres::start();
    let nodes: Vec<Weir> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| node(&pg, n, &node_dir("one-owner", n), &[]))
        .collect();
    // Thirty increments, round robin over the nodes: one counter.
    for i in 1..=30u64 {
        let r = incr(&nodes[(i as usize) % 3], "a").await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.text(), i.to_string());
    }
    // Every turn ran on the owner the database names, none elsewhere.
    let owner = pg.owner(&actor_key("a")).expect("an owner");
    marker_turns(&pg, &nodes.iter().collect::<Vec<_>>(), &["n1", "n2", "n3"]).await;
    for (n, name) in nodes.iter().zip(["n1", "n2", "n3"]) {
        let ran = turns_of(n, "a");
        if name == owner {
            assert_eq!(ran, 30, "{name} owns it");
        } else {
            assert_eq!(ran, 0, "{name} does not own it");
        }
    }
    // The log in the database holds every commit; the head is the last.
    let head: u64 = pg
        .psql(
            "weir",
            &format!(
                "SELECT head FROM weir_objects WHERE key = '{}'",
                actor_key("a")
            ),
        )
        .parse()
        .unwrap();
    // Each entry is a run of commits ending at its head: the commits that
    // queued during one round trip (the actor's schema and incarnation
    // with its first turn) share one; each later turn waited for the one
    // before, so it has its own.
    let (entries, last): (u64, u64) = {
        let row = pg.psql(
            "weir",
            &format!(
                "SELECT count(*) || ' ' || max(l.head) FROM weir_log l JOIN weir_objects o ON o.id = l.object WHERE o.key = '{}'",
                actor_key("a")
            ),
        );
        let (n, h) = row.split_once(' ').expect("a count and a head");
        (n.parse().unwrap(), h.parse().unwrap())
    };
    assert!(head >= 32, "schema, incarnation and 30 turns: {head}");
    assert_eq!(last, head, "no snapshot yet: the whole log, up to the head");
    assert!(
        (30..=head).contains(&entries),
        "{entries} entries for {head} commits"
    );
    // Many actors spread over the nodes (rendezvous placement).
    for i in 0..60 {
        let r = incr(&nodes[i % 3], &format!("spread{i}")).await;
        assert_eq!(r.status, 200);
    }
    let spread = pg.psql(
        "weir",
        "SELECT count(DISTINCT owner) FROM weir_objects WHERE key LIKE 'actor/gateway/probe/spread%'",
    );
    assert_eq!(spread, "3", "60 actors land on all three nodes");
    // Each node counts what it shipped and handed on: the owner shipped
    // every commit and served the others' calls; the others forwarded.
    for (n, name) in nodes.iter().zip(["n1", "n2", "n3"]) {
        let counters = n.admin_get("/status").await.json()["cluster"]["counters"].clone();
        if name == owner {
            assert!(counters["commits"].as_u64().unwrap() >= 32, "{counters}");
            assert!(counters["claims"].as_u64().unwrap() >= 1, "{counters}");
            assert!(counters["served"].as_u64().unwrap() >= 20, "{counters}");
            assert_eq!(counters["fenced"], 0, "{counters}");
        } else {
            assert!(counters["forwarded"].as_u64().unwrap() >= 10, "{counters}");
        }
    }
    // `/status` names the cluster.
    let status = nodes[0].admin_get("/status").await.json();
    assert_eq!(status["cluster"]["node"], "n1");
    assert_eq!(status["cluster"]["lease_held"], true);
    let mut seen: Vec<String> = serde_json::from_value(status["cluster"]["nodes"].clone()).unwrap();
    seen.sort();
    assert_eq!(seen, ["n1", "n2", "n3"]);
    // The nodes that found the schema made by the first logged nothing of
    // it (PostgreSQL's notices that each table was there already).
    for (n, name) in nodes.iter().zip(["n1", "n2", "n3"]) {
        let notices = n.logged("tokio_postgres::connection");
        assert!(notices.is_empty(), "{name}: {notices:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_call_keeps_everything_and_runs_once() {
    let pg = Postgres::start();
    let nodes: Vec<Weir> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| node(&pg, n, &node_dir("forward", n), &[]))
        .collect();
    // The actor's owner is whoever claims it first; then call it from the
    // other two.
    let first = nodes[0]
        .send(
            Request::post("/direct/fwd/echo")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(first.status, 200);
    let owner = pg.owner(&actor_key("fwd")).unwrap();
    let others: Vec<&Weir> = nodes
        .iter()
        .zip(["n1", "n2", "n3"])
        .filter(|(_, n)| *n != owner)
        .map(|(w, _)| w)
        .collect();
    assert_eq!(others.len(), 2);
    let body: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let mut count = 1;
    for node in &others {
        let request = Request::builder()
            .method("PATCH")
            .uri("/direct/fwd/echo?status=207&q=a%20b&q=c")
            .header("x-one", "1")
            .header("x-many", "first")
            .header("x-many", "second")
            .header("content-type", "application/octet-stream")
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap();
        let r = node.send(request).await;
        count += 1;
        assert_eq!(r.status.as_u16(), 207, "{:?}", r.body);
        let cookies: Vec<_> = r.headers.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"], "repeated response headers");
        assert_eq!(r.headers["x-echo-count"], count.to_string().as_str());
        let seen = r.json();
        assert_eq!(seen["method"], "PATCH");
        assert_eq!(seen["path"], "/echo?status=207&q=a%20b&q=c");
        let headers: Vec<(String, Vec<u8>)> =
            serde_json::from_value(seen["headers"].clone()).unwrap();
        let many: Vec<&[u8]> = headers
            .iter()
            .filter(|(k, _)| k == "x-many")
            .map(|(_, v)| v.as_slice())
            .collect();
        assert_eq!(many, [b"first".as_slice(), b"second"]);
        assert!(headers.iter().any(|(k, v)| k == "x-one" && v == b"1"));
        let echoed: Vec<u8> = serde_json::from_value(seen["body"].clone()).unwrap();
        assert_eq!(echoed, body, "the body, byte for byte");
        assert_eq!(seen["count"], count);
    }
    // Each call ran once, on the owner: three runs in all.
    marker_turns(&pg, &nodes.iter().collect::<Vec<_>>(), &["n1", "n2", "n3"]).await;
    let runs: usize = nodes.iter().map(|n| turns_of(n, "fwd")).sum();
    assert_eq!(runs, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_internal_listener_refuses_strangers_and_guests_cannot_reach_it() {
    let pg = Postgres::start();
    let n1 = node(&pg, "n1", &node_dir("strangers", "n1"), &[]);
    let status = n1.admin_get("/status").await.json();
    let internal: std::net::SocketAddr = status["cluster"]["address"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // No secret, a wrong one: refused before anything is read or run.
    for secret in [None, Some("not-the-secret-at-all-0000")] {
        let mut req = Request::post("/weir/cluster/v3/call").header("host", internal.to_string());
        if let Some(s) = secret {
            req = req.header("x-weir-cluster-secret", s);
        }
        let r = try_send_to(
            internal,
            req.body(Full::new(Bytes::from_static(b"\x01"))).unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 401);
    }
    // A truncated envelope, with the secret, posted to `path`.
    let truncated = |path: &'static str| {
        try_send_to(
            internal,
            Request::post(path)
                .header("host", internal.to_string())
                .header("x-weir-cluster-secret", common::cluster::SECRET)
                .body(Full::new(Bytes::from_static(b"\x01\x00")))
                .unwrap(),
        )
    };
    // A call of an envelope version this build no longer speaks (a node
    // two builds older): 400, named, nothing read.
    let r = truncated("/weir/cluster/v1/call").await.unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(
        r.text(),
        "a call of version 1 from a node of another Weir build; this node speaks versions 2 \
         to 3: nodes of a cluster must be at most one version apart\n"
    );
    // The secret with a malformed envelope: 400, nothing runs.
    let r = truncated("/weir/cluster/v3/call").await.unwrap();
    assert_eq!(r.status, 400);
    drop(n1);
    // A guest allowed every loopback port still cannot reach the node's
    // internal listener: it is one of the server's own addresses.
    let n2 = common::cluster::node_with_app(
        &pg,
        "n2",
        &node_dir("strangers", "n2"),
        &common::probe(),
        &["--allow-outbound", "http://127.0.0.1:*"],
    );
    let status = n2.admin_get("/status").await.json();
    let internal = status["cluster"]["address"].as_str().unwrap().to_string();
    let port = internal.rsplit_once(':').unwrap().1;
    for url in [
        format!("http://{internal}/weir/cluster/v3/call"),
        format!("http://localhost:{port}/"),
        format!("http://0.0.0.0:{port}/"),
    ] {
        let r = n2.get(&format!("/fetch?url={url}")).await;
        assert_eq!(r.status, 502, "{url}");
        assert_eq!(r.text(), "ErrorCode::HttpRequestDenied", "{url}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_does_not_run_in_cluster_mode_is_refused_by_name() {
    let pg = Postgres::start();
    // (A resident process's durable storage slot: `cluster_processes.rs`.)
    // A database bound past what one PostgreSQL value holds (a snapshot
    // is one): refused at start, naming the limit and the most allowed.
    let out = node_that_stops_at_start(
        &pg.url(),
        "n2",
        &node_dir("refused", "n2"),
        &["--limit", "max_database_bytes=1073741824"],
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "max_database_bytes is 1073741824; in cluster mode it may be at most 1006632960"
        ),
        "{}",
        out.stderr
    );
}

#[test]
fn a_node_whose_database_cannot_be_reached_exits_naming_it_and_why() {
    // Nothing listens on the port: the start fails, naming the database
    // (its port included, its password not) and why it cannot be reached.
    // The password in a weir.toml only its owner reads (on the command
    // line it would be refused before anything is tried).
    let port = common::cluster::free_port();
    let url = format!("postgres://weir:hunter2@127.0.0.1:{port}/weir");
    let dir = node_dir("unreachable", "n1");
    let config = dir.with_extension("toml");
    std::fs::write(
        &config,
        format!("[cluster]\ndatabase = {url:?}\nnode = \"n1\"\nlisten = \"127.0.0.1:0\"\n"),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let gateway = guest("gateway");
    let out = common::run_weir_with_env(
        &[
            "serve",
            gateway.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--data-dir",
            dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        &[("WEIR_CLUSTER_SECRET", common::cluster::SECRET)],
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let said = out.stderr.trim();
    assert!(
        said.starts_with(&format!(
            "weir: cluster: postgres://weir@127.0.0.1:{port}/weir: the cluster database is unavailable: "
        )),
        "{said}"
    );
    assert!(
        said.ends_with("Connection refused (os error 111)"),
        "{said}"
    );
    assert!(!said.contains("hunter2"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_back_into_its_chain_through_another_node_is_refused_at_once() {
    // Actor A on n1 calls B on n2, which calls A back: the chain travels
    // in the envelope, so n2 refuses the call back at once. Without it,
    // the call would wait in A's queue on n1 behind the turn that waits
    // for it, for the whole minute of the deadline, and end 503.
    let pg = Postgres::start();
    let hostile = guest("hostile");
    let class = format!("hostile={}", hostile.display());
    let args = [
        "--actor",
        class.as_str(),
        "--actor-route",
        "hostile=/h",
        "--limit",
        "event_limit_ms=60000",
    ];
    let n1 = node_with_app(&pg, "n1", &node_dir("chain", "n1"), &hostile, &args);
    let n2 = node_with_app(&pg, "n2", &node_dir("chain", "n2"), &hostile, &args);
    // Two actors, one owned by each node (placement is the cluster's).
    let key = |name: &str| format!("actor/hostile/hostile/{name}");
    let (mut on1, mut on2) = (None, None);
    for i in 0..64 {
        let name = format!("x{i}");
        assert_eq!(
            until_ok(&n1, "GET", &format!("/h/{name}/hello"), "")
                .await
                .status,
            200
        );
        match pg.owner(&key(&name)).as_deref() {
            Some("n1") => on1 = on1.or(Some(name)),
            Some("n2") => on2 = on2.or(Some(name)),
            other => panic!("{name}: owner {other:?}"),
        }
        if on1.is_some() && on2.is_some() {
            break;
        }
    }
    let (a, b) = (on1.expect("an actor on n1"), on2.expect("an actor on n2"));
    let r = n1.get(&format!("/h/{a}/relay?via={b},{a}")).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        common::hostile::innermost(r.json()),
        (508, json!({ "error": "actor_call_cycle" }), 1)
    );
    // And a chain through both nodes without a cycle answers.
    let r = n2.get(&format!("/h/{b}/relay?via={a},c")).await;
    assert_eq!(common::hostile::innermost(r.json()), (200, json!("end"), 2));
}
