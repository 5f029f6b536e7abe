//! Helpers of the cluster tests: real `weir` nodes joined to a real
//! PostgreSQL of the test's own ([`super::postgres`]), each with the
//! `gateway` worker in front of the `actor-probe` class, which clients also
//! reach directly at `/direct/NAME/…`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

// The tests reach the database's helpers through here too; not every test
// binary uses them all.
#[allow(unused_imports)]
pub use super::postgres::{Database, Held, PgBouncer, Postgres, Psql, free_port};
use super::{Resp, Weir, guest};

/// The secret every test node shares.
pub const SECRET: &str = "weir-test-cluster-secret-0123456789";

/// The lease the tests' nodes run with: short, so failovers are quick.
pub const LEASE_MS: u64 = 1000;

/// The object key of actor `name` of the test class.
pub fn actor_key(name: &str) -> String {
    format!("actor/gateway/probe/{name}")
}

/// A node's data directory, fresh for the test.
pub fn node_dir(test: &str, node: &str) -> PathBuf {
    let dir = node_path(test, node);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Where [`node_dir`] put a node's data directory (left as it is).
pub fn node_path(test: &str, node: &str) -> PathBuf {
    weir_scratch::path(&format!("cluster-{test}-{node}"))
}

/// Starts node `name` of the cluster on `pg`, its data under `dir`: the
/// `gateway` worker, the `probe` class (also at `/direct/NAME/…`).
pub fn node(pg: &impl Database, name: &str, dir: &Path, extra: &[&str]) -> Weir {
    let actor = format!("probe={}", guest("actor_probe").display());
    let mut args = vec!["--actor", &actor, "--actor-route", "probe=/direct"];
    args.extend_from_slice(extra);
    node_with_app(pg, name, dir, &guest("gateway"), &args)
}

/// Starts node `name` serving `app`, with `extra` arguments.
pub fn node_with_app(
    pg: &impl Database,
    name: &str,
    dir: &Path,
    app: &Path,
    extra: &[&str],
) -> Weir {
    node_listening(pg, name, dir, app, "127.0.0.1:0", extra)
}

/// Starts node `name` serving `app`, its internal listener on `listen`.
pub fn node_listening(
    pg: &impl Database,
    name: &str,
    dir: &Path,
    app: &Path,
    listen: &str,
    extra: &[&str],
) -> Weir {
    let url = pg.url();
    let lease = format!("cluster_lease_ms={LEASE_MS}");
    let mut args = vec![
        app.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
        "--cluster",
        &url,
        "--node",
        name,
        "--cluster-listen",
        listen,
        "--limit",
        &lease,
    ];
    args.extend_from_slice(extra);
    Weir::start_with_env(&args, &[("WEIR_CLUSTER_SECRET", SECRET)])
}

/// Starts node `party` of `net` ([`super::netns::Net`]) in its namespace,
/// listening (clients, admin, peers) on its address there: the same app
/// and classes as [`node`], the node named as its party.
pub fn node_in(
    net: &super::netns::Net,
    party: &str,
    pg: &impl Database,
    dir: &Path,
    extra: &[&str],
) -> Weir {
    let any = format!("{}:0", net.addr(party));
    let actor = format!("probe={}", guest("actor_probe").display());
    let lease = format!("cluster_lease_ms={LEASE_MS}");
    let mut command = std::process::Command::new("ip");
    command
        .args(["netns", "exec", &net.ns(party)])
        .arg(env!("CARGO_BIN_EXE_weir"))
        .arg("serve")
        .args(["--listen", &any, "--admin", &any])
        .arg(guest("gateway"))
        .arg("--data-dir")
        .arg(dir)
        .args(["--cluster", &pg.url(), "--node", party])
        .args(["--cluster-listen", &any, "--limit", &lease])
        .args(["--actor", &actor, "--actor-route", "probe=/direct"])
        .args(extra)
        .env("WEIR_CLUSTER_SECRET", SECRET);
    Weir::serving(command)
}

/// Runs node `name` of the cluster at `url` (the gateway app, data in
/// `dir`, with `extra` arguments) to its end: for starts that must fail.
pub fn node_that_stops_at_start(
    url: &str,
    name: &str,
    dir: &Path,
    extra: &[&str],
) -> super::Exited {
    let app = guest("gateway");
    let mut args = vec![
        "serve",
        app.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--cluster",
        url,
        "--node",
        name,
        "--cluster-listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    super::run_weir_with_env(&args, &[("WEIR_CLUSTER_SECRET", SECRET)])
}

/// Puts `value` under key `k` of the `probe` actor `name` through the
/// node at `addr` (at `/direct/NAME/put`).
pub async fn put(addr: std::net::SocketAddr, name: &str, value: &str) -> Resp {
    super::send_to(
        addr,
        Request::post(format!("/direct/{name}/put?key=k"))
            .body(Full::new(Bytes::from(value.to_string())))
            .unwrap(),
    )
    .await
}

/// Increments the `probe` actor `actor`'s counter through `node`.
pub async fn incr(node: &Weir, actor: &str) -> Resp {
    node.send(
        Request::post(format!("/probe/{actor}/incr"))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await
}

/// Increments `actor`'s counter through `node`, which must answer 200;
/// the counter after.
pub async fn incr_at(node: &Weir, actor: &str) -> String {
    let r = incr(node, actor).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.text()
}

/// The name of an actor `owner` owns, found by calling names through
/// `through` until one's owner is `owner`.
pub async fn actor_of(pg: &Postgres, through: &Weir, owner: &str, prefix: &str) -> String {
    for i in 0..32 {
        let name = format!("{prefix}{i}");
        let r = incr(through, &name).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        if pg.owner(&actor_key(&name)).as_deref() == Some(owner) {
            return name;
        }
    }
    panic!("no actor of {owner}'s among 32 names");
}

/// Runs a turn on each of `nodes` (named `names`), on an actor that node
/// owns, and waits for its receipt in that node's log: a count of receipts
/// taken after this holds every turn that ended on those nodes before,
/// rather than what a moment's settling let through.
pub async fn marker_turns(pg: &Postgres, nodes: &[&Weir], names: &[&str]) {
    for (node, name) in nodes.iter().zip(names) {
        let actor = actor_of(pg, node, name, &format!("marker-{name}-")).await;
        node.actor_receipt_where(|r| r["name"] == actor.as_str())
            .await;
    }
}

/// Sends until the answer is 200 (a node may still be failing over),
/// for at most 30 s; the last answer.
pub async fn until_ok(node: &Weir, method: &str, path: &str, body: &str) -> Resp {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = node
            .send(
                Request::builder()
                    .method(method)
                    .uri(path)
                    .body(Full::new(Bytes::from(body.to_string())))
                    .unwrap(),
            )
            .await;
        if r.status == 200 || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts node `name` serving the runner guest: its app, and its actor
/// class `runner` at `/r/NAME/…` (`/r/NAME/run/<digest>` runs an image,
/// `/r/NAME/spawn/<digest>` spawns one).
pub fn runner_node(pg: &impl Database, name: &str, dir: &Path, extra: &[&str]) -> Weir {
    let runner = guest("runner");
    let actor = format!("runner={}", runner.display());
    let mut args = vec![
        "--actor",
        &actor,
        "--actor-route",
        "runner=/r",
        "--limit",
        "memory_limit_bytes=33554432",
    ];
    args.extend_from_slice(extra);
    node_with_app(pg, name, dir, &runner, &args)
}

/// `node`'s cluster session, as its `/status` names it.
pub async fn session(node: &Weir) -> serde_json::Value {
    node.admin_get("/status").await.json()["cluster"]["session"].clone()
}

/// The object key of the runner class's actor `name`.
pub fn runner_key(name: &str) -> String {
    format!("actor/runner/runner/{name}")
}

/// A name of a runner actor that `node` owns while the live nodes are
/// `nodes` (by the cluster's rendezvous placement).
pub fn placed_on(node: &str, nodes: &[&str]) -> String {
    placed_on_from(node, nodes, 0)
}

/// [`placed_on`], trying names from the `from`th on.
pub fn placed_on_from(node: &str, nodes: &[&str], from: usize) -> String {
    use weir_cluster::coordinator::NodeInfo;
    let live: Vec<NodeInfo> = nodes
        .iter()
        .enumerate()
        .map(|(i, name)| NodeInfo {
            session: i as i64,
            name: name.to_string(),
            address: String::new(),
        })
        .collect();
    (from..)
        .map(|i| format!("on-{node}-{i}"))
        .find(|name| {
            weir_cluster::ownership::preferred(&live, &runner_key(name))
                .unwrap()
                .name
                == node
        })
        .unwrap()
}
