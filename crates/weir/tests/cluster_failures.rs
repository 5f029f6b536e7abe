//! Cluster mode under failure, from outside: owners killed under writes,
//! an owner paused past its lease, PostgreSQL stopped and started, and
//! calls cut mid-hop. A real PostgreSQL, real `weir` nodes, real clients;
//! nothing acknowledged may be lost, and every refusal is named.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::cluster::{Postgres, actor_key, marker_turns, node, node_dir, node_path, until_ok};
use common::write_stream::{Live, Seen, every_ack_is_readable, writers};
use common::{Weir, try_send_to};
use http::Request;
use http_body_util::Full;

/// A small seeded generator for kill moments and node choices (printed,
/// so a failure can be replayed with `WEIR_TEST_SEED`).
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let seed = std::env::var("WEIR_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        println!("WEIR_TEST_SEED={seed}");
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_owner_fifty_times_under_writes_loses_no_acknowledged_write() {
    const KILLS: usize = 50;
    let pg = Postgres::start();
    let names = ["n1", "n2", "n3"];
    let dirs: Vec<_> = names.iter().map(|n| node_dir("kills", n)).collect();
    let mut nodes: Vec<Option<Weir>> = names
        .iter()
        .zip(&dirs)
        .map(|(n, d)| Some(node(&pg, n, d, &[])))
        .collect();
    let live: Live = std::sync::Arc::new(std::sync::Mutex::new(
        nodes.iter().flatten().map(|w| w.addr).collect(),
    ));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Seen::default()));
    let tasks = writers(&live, "hot", 4, &stop, &seen);
    let mut rng = Rng::seeded();
    let mut failovers = Vec::new();
    for round in 0..KILLS {
        // Writes flow for a random moment, then the owner dies.
        tokio::time::sleep(Duration::from_millis(100 + rng.below(600))).await;
        let owner = loop {
            if let Some(owner) = pg.owner(&actor_key("hot")) {
                break owner;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let i = names.iter().position(|n| *n == owner).unwrap();
        let mut dead = nodes[i].take().unwrap();
        live.lock().unwrap().retain(|a| *a != dead.addr);
        dead.signal("KILL");
        dead.wait_exit(Duration::from_secs(10)).expect("killed");
        let killed = Instant::now();
        drop(dead);
        // The actor answers again through the live nodes.
        let acks_before = seen.lock().unwrap().acked.len();
        let deadline = killed + Duration::from_secs(60);
        loop {
            let answered = {
                let seen = seen.lock().unwrap();
                seen.acked[acks_before..]
                    .iter()
                    .find(|(_, at)| *at > killed)
                    .map(|(_, at)| *at)
            };
            if let Some(at) = answered {
                failovers.push(at - killed);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no write succeeded for 60 s after the kill"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The killed node comes back (after its old lease ends).
        let back = node(&pg, names[i], &dirs[i], &[]);
        live.lock().unwrap().push(back.addr);
        nodes[i] = Some(back);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let up: Vec<&Weir> = nodes.iter().flatten().collect();
    every_ack_is_readable(&up, "hot", &seen).await;
    failovers.sort();
    println!(
        "{KILLS} kills: {} puts and {} increments acknowledged, refused {:?}, {} cut by a kill; \
         answering again after p50 {:?}, p90 {:?}, max {:?} (lease {} ms)",
        seen.acked.len(),
        seen.counted.len(),
        seen.refused,
        seen.cut,
        percentile(&failovers, 0.5),
        percentile(&failovers, 0.9),
        failovers.last().unwrap(),
        common::cluster::LEASE_MS,
    );
    // Whatever was refused was refused by name.
    for code in seen.refused.keys() {
        assert!(
            ["ownership_lost", "storage_unavailable", "owner_unreachable"].contains(&code.as_str()),
            "refused with {code}"
        );
    }
    assert!(
        seen.acked.len() > KILLS * 10,
        "writes flowed: {}",
        seen.acked.len()
    );
}

/// The three test nodes (with `extra` arguments) and which of them owns
/// `actor` (created first).
async fn three_and_the_owner(
    pg: &Postgres,
    test: &str,
    actor: &str,
    extra: &[&str],
) -> (Vec<Weir>, usize) {
    let nodes: Vec<Weir> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| node(pg, n, &node_dir(test, n), extra))
        .collect();
    let r = nodes[0]
        .send(
            Request::post(format!("/direct/{actor}/incr"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let owner = pg.owner(&actor_key(actor)).unwrap();
    let i = ["n1", "n2", "n3"].iter().position(|n| *n == owner).unwrap();
    (nodes, i)
}

/// The WAL of the replica of `actor` under a node's data directory.
fn replica_wal(dir: &std::path::Path, actor: &str) -> std::path::PathBuf {
    let file = format!("{actor}.sqlite3-wal");
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.file_name().is_some_and(|n| n == file.as_str()) {
                return path;
            }
        }
    }
    panic!("no {file} under {}", dir.display());
}

/// Stores `value` under `blob` in the actor `long`, through `node`.
async fn put_blob(node: &Weir, value: &str) {
    let r = until_ok(node, "POST", "/direct/long/put?key=blob", value).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A long-lived actor's WAL passes `CHECKPOINT_WAL_FRAMES`, is checkpointed
/// into its file and starts over in place, over its own stale frames. The
/// commits written over them ship like any other: killed afterwards, the
/// owner leaves every acknowledged write to the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_after_a_live_checkpoint_ship_and_survive_the_owner() {
    use weir_store::actor::PAGE_BYTES;
    use weir_store::replica::CHECKPOINT_WAL_FRAMES;
    use weir_store::replica::wal::{FRAME_HEADER_BYTES, HEADER_BYTES};

    let pg = Postgres::start();
    let (mut nodes, x) = three_and_the_owner(&pg, "checkpoint", "long", &[]).await;
    let wal = replica_wal(&node_path("checkpoint", ["n1", "n2", "n3"][x]), "long");
    let frame = FRAME_HEADER_BYTES + u64::from(PAGE_BYTES);
    let full = HEADER_BYTES + CHECKPOINT_WAL_FRAMES * frame;
    // Each call rewrites one 100 KiB value, different in every page
    // (SQLite writes no frame for a page whose content did not change):
    // about 50 frames per commit.
    let value = |call: u64| format!("{call:08}").repeat(12_800);
    let mut counted = 1u64;
    let mut calls = 0u64;
    while std::fs::metadata(&wal).unwrap().len() <= full {
        calls += 1;
        put_blob(&nodes[x], &value(calls)).await;
        assert!(calls < 5_000, "the WAL never reached {full} bytes");
    }
    let long = std::fs::metadata(&wal).unwrap().len();
    for _ in 0..40 {
        calls += 1;
        put_blob(&nodes[x], &value(calls)).await;
        let r = until_ok(&nodes[x], "POST", "/direct/long/incr", "").await;
        assert_eq!(r.status, 200, "{}", r.text());
        counted += 1;
        assert_eq!(r.text(), counted.to_string());
    }
    assert_eq!(
        std::fs::metadata(&wal).unwrap().len(),
        long,
        "40 more commits of ~50 frames each were written over the restarted WAL, not after it"
    );
    let mut dead = nodes.remove(x);
    dead.signal("KILL");
    dead.wait_exit(Duration::from_secs(10)).expect("killed");
    let r = until_ok(&nodes[0], "POST", "/direct/long/incr", "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.text(),
        (counted + 1).to_string(),
        "every acknowledged increment survived"
    );
    let r = until_ok(&nodes[1], "GET", "/direct/long/get?key=blob", "").await;
    assert_eq!(r.status, 200);
    assert!(
        r.text() == value(calls),
        "the last value, read through another node"
    );
    println!("{calls} calls filled the WAL to {long} bytes before its live checkpoint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_is_fenced_and_never_overwrites_the_new_owner() {
    let pg = Postgres::start();
    // The stopped turn must outlive the pause: its deadline is longer, so
    // that it reaches its commit when the node runs again.
    let (nodes, x) =
        three_and_the_owner(&pg, "paused", "split", &["--limit", "event_limit_ms=10000"]).await;
    let y = (x + 1) % 3;
    let r = until_ok(&nodes[x], "POST", "/direct/split/put?key=before", "before").await;
    assert_eq!(r.status, 200);
    // A turn on the owner that writes, waits, writes and then commits;
    // the owner is stopped in the middle of it, past its lease.
    let owner_addr = nodes[x].addr;
    let pending = tokio::spawn(async move {
        try_send_to(
            owner_addr,
            Request::post("/direct/split/pair?i=777&gap_ms=1500")
                .header("host", owner_addr.to_string())
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
    });
    // In the middle of it: its first write done, in its gap.
    nodes[x]
        .first_logged("weir::guest", |r| r["line"] == "pair 777: x written")
        .await;
    nodes[x].signal("STOP");
    tokio::time::sleep(Duration::from_millis(common::cluster::LEASE_MS + 1000)).await;
    // Another node takes the actor over and writes.
    for i in 0..5 {
        let key = format!("after{i}");
        let r = until_ok(
            &nodes[y],
            "POST",
            &format!("/direct/split/put?key={key}"),
            &key,
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let new_owner = pg.owner(&actor_key("split")).unwrap();
    assert_ne!(new_owner, ["n1", "n2", "n3"][x], "taken over");
    // The old owner wakes up; its pending commit is refused by the fence.
    nodes[x].signal("CONT");
    let r = pending.await.unwrap().expect("an answer");
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert_eq!(r.json()["error"], "ownership_lost");
    // The state is exactly the new owner's history, seen from every node
    // (the old owner too, once it has rejoined).
    for node in &nodes {
        let r = until_ok(node, "GET", "/direct/split/pairs", "").await;
        assert_eq!(
            r.json(),
            serde_json::json!({ "x": [], "y": [] }),
            "no half of the fenced turn"
        );
        for key in ["before", "after0", "after4"] {
            let r = until_ok(node, "GET", &format!("/direct/split/get?key={key}"), "").await;
            assert_eq!(r.text(), key);
        }
    }
    // And the old owner writes again through the cluster.
    let r = until_ok(
        &nodes[x],
        "POST",
        "/direct/split/put?key=rejoined",
        "rejoined",
    )
    .await;
    assert_eq!(r.status, 200);
    let r = until_ok(&nodes[y], "GET", "/direct/split/get?key=rejoined", "").await;
    assert_eq!(r.text(), "rejoined");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_may_have_run_is_never_sent_again() {
    let pg = Postgres::start();
    let (mut nodes, x) =
        three_and_the_owner(&pg, "once", "once", &["--limit", "event_limit_ms=10000"]).await;
    let y = (x + 1) % 3;
    // Through another node, a turn that writes, waits and writes; its
    // owner dies in the wait. The hop cannot know whether it ran.
    let via = nodes[y].addr;
    let call = tokio::spawn(async move {
        try_send_to(
            via,
            Request::post("/direct/once/pair?i=5&gap_ms=2000")
                .header("host", via.to_string())
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
    });
    // In the middle of it: its first write done, in its gap.
    nodes[x]
        .first_logged("weir::guest", |r| r["line"] == "pair 5: x written")
        .await;
    nodes[x].signal("KILL");
    let r = call
        .await
        .unwrap()
        .expect("an answer from the node it went through");
    assert_eq!(r.status, 502, "{:?}", r.body);
    assert_eq!(r.json()["error"], "owner_unreachable");
    let dead = nodes.remove(x);
    drop(dead);
    // After the failover the turn is nowhere: it did not commit where it
    // ran, and it was not sent to the new owner.
    for node in &nodes {
        let r = until_ok(node, "GET", "/direct/once/pairs", "").await;
        assert_eq!(r.json(), serde_json::json!({ "x": [], "y": [] }));
    }
    // The survivors ran no pair turn: the new owner's turns were reads.
    let mut names = vec!["n1", "n2", "n3"];
    names.remove(x);
    marker_turns(&pg, &nodes.iter().collect::<Vec<_>>(), &names).await;
    let pairs_run: usize = nodes
        .iter()
        .map(|n| {
            n.actor_receipts()
                .iter()
                .filter(|r| r["name"] == "once" && r["turn"] == "request")
                .filter(|r| r["wasm_us"].as_u64().unwrap_or(0) >= 1_500_000)
                .count()
        })
        .sum();
    assert_eq!(pairs_run, 0, "the pair was not sent to the new owner");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_of_an_owner_that_died_fire_on_another_node() {
    let pg = Postgres::start();
    let (mut nodes, x) = three_and_the_owner(&pg, "timers", "t", &[]).await;
    let r = until_ok(
        &nodes[x],
        "POST",
        "/direct/t/schedule?reason=tick&in_ms=1500",
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    nodes[x].signal("KILL");
    let dead = nodes.remove(x);
    drop(dead);
    // Nobody calls the actor: its alarm alone brings it back, elsewhere.
    let deadline = Instant::now() + Duration::from_secs(30);
    let fired_on = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let fired: Vec<usize> = (0..2)
            .filter(|i| {
                nodes[*i]
                    .actor_receipts()
                    .iter()
                    .any(|r| r["name"] == "t" && r["turn"] == "alarm" && r["reason"] == "tick")
            })
            .collect();
        if let Some(i) = fired.first() {
            break *i;
        }
        assert!(Instant::now() < deadline, "the orphaned alarm never fired");
    };
    let log = until_ok(&nodes[fired_on], "GET", "/direct/t/log", "")
        .await
        .json();
    let ticks = log
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l.as_str().unwrap().starts_with("tick@"))
        .count();
    assert!(ticks >= 1, "{log}");
    // It is gone from the owner row once delivered.
    let alarm = pg.psql(
        "weir",
        &format!(
            "SELECT coalesce(alarm_at::text, 'none') FROM weir_objects WHERE key = '{}'",
            actor_key("t")
        ),
    );
    assert_eq!(alarm, "none");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_stopped_and_started_under_load_loses_nothing_and_service_resumes() {
    let mut pg = Postgres::start();
    let names = ["n1", "n2", "n3"];
    let nodes: Vec<Weir> = names
        .iter()
        .map(|n| node(&pg, n, &node_dir("pgdown", n), &[]))
        .collect();
    let live: Live = std::sync::Arc::new(std::sync::Mutex::new(
        nodes.iter().map(|w| w.addr).collect(),
    ));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Seen::default()));
    let tasks = writers(&live, "pgdown", 4, &stop, &seen);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = seen.lock().unwrap().acked.len();
    assert!(before > 0, "writes flowed before the outage");
    pg.stop("INT");
    let down = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let refused_while_down = seen.lock().unwrap().refused.clone();
    pg.run();
    let up = Instant::now();
    // Service resumes by itself: writes are acknowledged again.
    let deadline = up + Duration::from_secs(60);
    loop {
        let resumed = seen.lock().unwrap().acked.iter().any(|(_, at)| *at > up);
        if resumed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no write acknowledged for 60 s after the database returned"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resumed = seen
        .lock()
        .unwrap()
        .acked
        .iter()
        .find(|(_, at)| *at > up)
        .unwrap()
        .1
        - up;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    println!(
        "outage of {:?}: refused meanwhile {refused_while_down:?}; resumed {resumed:?} after the database returned; \
         {} puts and {} increments acknowledged in all, {} cut",
        up - down,
        seen.acked.len(),
        seen.counted.len(),
        seen.cut
    );
    // While the database was down, calls were refused by name, and
    // nothing was acknowledged that it does not hold.
    assert!(
        refused_while_down
            .get("storage_unavailable")
            .is_some_and(|n| *n > 0),
        "{refused_while_down:?}"
    );
    for code in seen.refused.keys() {
        assert!(
            ["ownership_lost", "storage_unavailable", "owner_unreachable"].contains(&code.as_str()),
            "refused with {code}"
        );
    }
    assert_eq!(seen.cut, 0, "no node went away");
    let all: Vec<&Weir> = nodes.iter().collect();
    every_ack_is_readable(&all, "pgdown", &seen).await;
}
