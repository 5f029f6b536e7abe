//! Partitions, not only pauses: two nodes and PostgreSQL, each in a
//! network namespace of its own with an address of its own
//! ([`common::netns`]), and the test's client in a fourth, under a stream
//! of writes through both nodes, while links between them are cut or
//! degraded and every process keeps running:
//!
//! - the owner still answers its clients and its peer, but cannot reach
//!   the database: it stops acknowledging, the other node takes over;
//! - the nodes reach the database but not each other: the owner keeps its
//!   actors, the other never commits for them;
//! - the owner's cable is slow, and drops what its queue cannot hold.
//!
//! In each, every acknowledged write is read back through both nodes, the
//! counter never answered a value twice (two owners would each count from
//! the same value), and the failover's time is printed.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Weir;
use common::cluster::{LEASE_MS, Postgres, actor_key, node_dir, node_in};
use common::netns::Net;
use common::write_stream::{Live, Seen, every_ack_is_readable, writers};

const PARTIES: [&str; 4] = ["pg", "n1", "n2", "client"];

/// The actor every writer writes to.
const ACTOR: &str = "hot";

/// A cluster in namespaces: dropped in this order, the namespaces last.
struct Cluster {
    nodes: Vec<Weir>,
    pg: Postgres,
    net: Arc<Net>,
}

impl Cluster {
    fn start(net: Arc<Net>, test: &str) -> Cluster {
        let pg = Postgres::start_at(net.at("pg"));
        let nodes = ["n1", "n2"]
            .iter()
            .map(|n| node_in(&net, n, &pg, &node_dir(test, n), &[]))
            .collect();
        Cluster { nodes, pg, net }
    }

    fn node(&self, name: &str) -> &Weir {
        &self.nodes[if name == "n1" { 0 } else { 1 }]
    }

    /// The node that owns the actor now, by the database.
    fn owner(&self) -> Option<String> {
        self.pg.owner(&actor_key(ACTOR))
    }

    /// The actor's owner once it has one (the first write claims it), and
    /// the other node.
    async fn owner_and_other(&self) -> (String, String) {
        let r =
            common::cluster::until_ok(&self.nodes[0], "POST", &format!("/direct/{ACTOR}/incr"), "")
                .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let owner = self.owner().expect("an owner");
        let other = if owner == "n1" { "n2" } else { "n1" };
        (owner, other.to_string())
    }
}

/// Writers through both nodes, until dropped (then stopped, and what they
/// saw handed back by [`Stream::stop`]).
struct Stream {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Stream {
    fn start(cluster: &Cluster) -> Stream {
        let live: Live = Arc::new(Mutex::new(cluster.nodes.iter().map(|n| n.addr).collect()));
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let tasks = writers(&live, ACTOR, 4, &stop, &seen);
        Stream { stop, seen, tasks }
    }

    fn acked(&self) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.acked.len() + seen.counted.len()
    }

    /// Waits until `n` more writes than now were acknowledged.
    async fn acks_more(&self, n: usize, what: &str) {
        let from = self.acked();
        common::wait_for(what, || async {
            match self.acked() - from {
                done if done >= n => Ok(()),
                done => Err(format!("{done} more acknowledged")),
            }
        })
        .await;
    }

    async fn stop(self) -> Arc<Mutex<Seen>> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        self.seen
    }
}

/// Everything acknowledged is there, through both nodes, once the links
/// are whole again.
async fn nothing_acknowledged_is_lost(cluster: &Cluster, seen: &Arc<Mutex<Seen>>) {
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    println!(
        "{} puts and {} increments acknowledged; refused: {:?}; cut: {}",
        seen.acked.len(),
        seen.counted.len(),
        seen.refused,
        seen.cut
    );
    let nodes: Vec<&Weir> = cluster.nodes.iter().collect();
    // Both nodes serve the actor again (one cut off from the database
    // comes back with a new session first).
    for node in &nodes {
        let r =
            common::cluster::until_ok(node, "GET", &format!("/direct/{ACTOR}/get?key=n"), "").await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    every_ack_is_readable(&nodes, ACTOR, &seen).await;
}

/// Runs `scenario` with a cluster in namespaces of its own, from the
/// client's namespace.
fn partitioned<F, Fut>(test: &'static str, scenario: F)
where
    F: FnOnce(Cluster) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let net = Arc::new(Net::new(test, &PARTIES));
    let inside = net.clone();
    net.run_in("client", move || async move {
        let cluster = Cluster::start(inside, test);
        scenario(cluster).await;
    });
}

#[test]
fn an_owner_cut_off_from_the_database_stops_acknowledging_and_the_other_node_takes_over() {
    partitioned("part-db", |cluster| async move {
        let (owner, other) = cluster.owner_and_other().await;
        let stream = Stream::start(&cluster);
        stream.acks_more(50, "writes before the cut").await;
        // The owner still answers its clients and its peer; only the
        // database is out of its reach.
        let cut = Instant::now();
        cluster.net.cut(&owner, "pg");
        common::wait_for("the other node to own the actor", || async {
            match cluster.owner() {
                Some(now) if now == other => Ok(()),
                now => Err(format!("{now:?}")),
            }
        })
        .await;
        let claimed = cut.elapsed();
        stream.acks_more(50, "writes after the failover").await;
        let served = cut.elapsed();
        println!(
            "owner {owner} cut from the database: {other} owned the actor after {claimed:?}, \
             and 50 more writes were acknowledged after {served:?} (lease {LEASE_MS} ms)"
        );
        // The cut owner acknowledged nothing it could not make durable:
        // its turns now answer without committing anything.
        let r = cluster
            .node(&owner)
            .send(
                http::Request::post(format!("/direct/{ACTOR}/put?key=on-the-cut-owner"))
                    .body(http_body_util::Full::new(bytes::Bytes::from("x")))
                    .unwrap(),
            )
            .await;
        let acked_on_cut_owner = r.status == 200;
        cluster.net.heal(&owner, "pg");
        stream.acks_more(50, "writes once healed").await;
        let seen = stream.stop().await;
        nothing_acknowledged_is_lost(&cluster, &seen).await;
        if acked_on_cut_owner {
            // Acknowledged (forwarded to the new owner): then it is there.
            let r = cluster
                .node(&other)
                .get(&format!("/direct/{ACTOR}/get?key=on-the-cut-owner"))
                .await;
            assert_eq!(r.status, 200, "an acknowledged write was lost");
        }
    });
}

#[test]
fn nodes_cut_off_from_each_other_keep_one_owner_and_the_other_never_commits_for_it() {
    partitioned("part-peers", |cluster| async move {
        let (owner, other) = cluster.owner_and_other().await;
        let stream = Stream::start(&cluster);
        stream.acks_more(50, "writes before the cut").await;
        cluster.net.cut(&owner, &other);
        // For five leases and more, with writes through both: the owner
        // keeps its lease and its actor, the other node's calls for it
        // fail rather than run anywhere else.
        let until = Instant::now() + Duration::from_millis(LEASE_MS * 5);
        while Instant::now() < until {
            assert_eq!(
                cluster.owner().as_deref(),
                Some(owner.as_str()),
                "the actor changed owner with both nodes alive"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stream.acks_more(50, "writes through the owner, cut").await;
        let through_other = cluster
            .node(&other)
            .send(
                http::Request::post(format!("/direct/{ACTOR}/incr"))
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap(),
            )
            .await;
        assert_eq!(through_other.status, 502, "{:?}", through_other.body);
        assert_eq!(through_other.json()["error"], "owner_unreachable");
        cluster.net.heal(&owner, &other);
        // Healed: calls through the other node reach the owner again.
        let r = common::cluster::until_ok(
            cluster.node(&other),
            "POST",
            &format!("/direct/{ACTOR}/incr"),
            "",
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        stream.acks_more(50, "writes once healed").await;
        let seen = stream.stop().await;
        // The other node committed nothing for the actor: every turn of it
        // ran on the owner.
        common::cluster::marker_turns(
            &cluster.pg,
            &cluster.nodes.iter().collect::<Vec<_>>(),
            &["n1", "n2"],
        )
        .await;
        let elsewhere = cluster
            .node(&other)
            .actor_receipts()
            .into_iter()
            .filter(|r| r["name"] == ACTOR)
            .count();
        assert_eq!(elsewhere, 0, "turns of the actor ran on {other}");
        nothing_acknowledged_is_lost(&cluster, &seen).await;
    });
}

#[test]
fn an_owner_on_a_slow_lossy_link_loses_no_acknowledged_write() {
    partitioned("part-lossy", |cluster| async move {
        let (owner, _other) = cluster.owner_and_other().await;
        let stream = Stream::start(&cluster);
        stream.acks_more(50, "writes before").await;
        // The owner's cable slowed to 2 Mbit/s each way, with 30 ms of
        // queue past which packets are dropped: slow, and lossy under the
        // writers' load.
        cluster.net.degrade(&owner, "2mbit", "30ms");
        let degraded = Instant::now();
        stream.acks_more(50, "writes over the lossy link").await;
        println!(
            "50 writes over a lossy, slow link in {:?}",
            degraded.elapsed()
        );
        cluster.net.restore(&owner);
        stream.acks_more(50, "writes once healed").await;
        let seen = stream.stop().await;
        nothing_acknowledged_is_lost(&cluster, &seen).await;
    });
}
