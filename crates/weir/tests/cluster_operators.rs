//! Operators and a cluster's actors, from outside: a real PostgreSQL, real
//! `weir` nodes on loopback. An actor is listed, inspected and deleted
//! through any node and by its owner, and listed a page at a time from the
//! cluster's database; a deletion takes its history out of the cluster's
//! database, fenced like a commit.

mod common;

use bytes::Bytes;
use common::Weir;
use common::cluster::{Postgres, actor_key, incr, node, node_dir, node_path, until_ok};
use http::Request;
use http_body_util::Full;
use serde_json::json;

/// Whether a file named `name` is anywhere under `dir`.
fn holds_file(dir: &std::path::Path, name: &str) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let path = e.path();
            e.file_name() == name || (path.is_dir() && holds_file(&path, name))
        })
    })
}

/// Waits until `sql` (a count) answers more than zero, for at most 30 s.
fn until_counted(pg: &Postgres, sql: &str) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let n: u64 = pg.psql("weir", sql).parse().unwrap();
        if n > 0 || std::time::Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_inspects_and_deletes_an_actor_through_any_node_and_its_history_leaves_the_database()
 {
    let mut pg = Postgres::start();
    let nodes: Vec<Weir> = ["n1", "n2"]
        .iter()
        .map(|n| node(&pg, n, &node_dir("operators", n), &[]))
        .collect();
    // A history: three increments, and enough bytes written twice over
    // that a snapshot is taken (its log passes 1 MiB and the database).
    for i in 1..=3u64 {
        assert_eq!(incr(&nodes[0], "gone").await.text(), i.to_string());
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..8 {
        let body: String = (0..600 << 10)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                char::from(b"0123456789abcdef"[(seed & 15) as usize])
            })
            .collect();
        let r = nodes[1]
            .send(
                Request::post(format!("/probe/gone/put?key=big{}", i % 4))
                    .body(Full::new(Bytes::from(body)))
                    .unwrap(),
            )
            .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let key = actor_key("gone");
    let id = pg.psql(
        "weir",
        &format!("SELECT id FROM weir_objects WHERE key = '{key}'"),
    );
    let snapshots = format!("SELECT count(*) FROM weir_snapshots WHERE object = {id}");
    let logged = format!("SELECT count(*) FROM weir_log WHERE object = {id}");
    assert!(until_counted(&pg, &snapshots) > 0, "a snapshot was taken");
    assert!(until_counted(&pg, &logged) > 0, "a log after it");
    let owner = pg.owner(&key).expect("an owner");
    let (owns, other) = if owner == "n1" {
        (&nodes[0], &nodes[1])
    } else {
        (&nodes[1], &nodes[0])
    };
    // Inspected through either node: its owner reads what is durable.
    for n in [owns, other] {
        let r = n.admin_get("/actors/probe/gone?keys=1").await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let detail = r.json();
        assert_eq!(detail["name"], "gone");
        assert_eq!(detail["entries"], 5, "{detail}");
        assert_eq!(
            common::dumped_keys(&detail),
            ["big0", "big1", "big2", "big3", "n"]
        );
        assert_eq!(detail["keys"][4]["text"], "3");
        // From a key on, as a page.
        let r = n.admin_get("/actors/probe/gone?keys=1&start=big3").await;
        assert_eq!(r.json()["keys"].as_array().unwrap().len(), 2);
    }
    // An actor no call ever reached is not found, through either node.
    for n in [owns, other] {
        let r = n.admin_get("/actors/probe/never").await;
        assert_eq!(r.status, 404, "{:?}", r.body);
        assert_eq!(r.json()["error"], "actor_not_found");
        assert_eq!(r.json()["message"], "actor probe/never does not exist");
    }
    // Listed through either node from the cluster's database, with its
    // owner; a name only looked up (no history) is not an actor.
    for n in [owns, other] {
        let listed = n.admin_get("/actors/probe").await.json();
        let actors = listed["actors"].as_array().unwrap();
        assert_eq!(actors.len(), 1, "{listed}");
        assert_eq!(actors[0]["name"], "gone");
        assert_eq!(actors[0]["owner"], owner.as_str());
        // `weir actors list` shows the owner as a column of its own.
        let out = common::output_within(
            common::weir_command()
                .arg("actors")
                .args(["--admin", &n.admin.unwrap().to_string()])
                .env("WEIR_ADMIN_TOKEN", n.token.as_ref().unwrap())
                .args(["list", "probe"]),
            common::EXITS_WITHIN,
        );
        let table = String::from_utf8(out.stdout).unwrap();
        let rows: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows[0].last(), Some(&"OWNER"), "{table}");
        assert_eq!(rows[1][..2], ["probe", "gone"], "{table}");
        assert_eq!(rows[1].last(), Some(&owner.as_str()), "{table}");
        assert!(table.ends_with(" of storage on this node\n"), "{table}");
    }
    let owner_dir = node_path("operators", &owner);
    assert!(holds_file(&owner_dir, "gone.sqlite3"), "the owner's copy");
    // Deleted through the node that does not own it: the owner deletes
    // its row, log and snapshots, and its local copy.
    let r = other.admin_send("DELETE", "/actors/probe/gone").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["deleted"], true);
    let rows = format!("SELECT count(*) FROM weir_objects WHERE key = '{key}'");
    assert_eq!(pg.psql("weir", &rows), "0");
    assert_eq!(pg.psql("weir", &snapshots), "0");
    assert_eq!(pg.psql("weir", &logged), "0");
    assert!(!holds_file(&owner_dir, "gone.sqlite3"), "the owner's copy");
    for n in [owns, other] {
        let r = n.admin_get("/actors/probe/gone").await;
        assert_eq!(r.status, 404, "{:?}", r.body);
        let listed = n.admin_get("/actors/probe").await.json();
        assert_eq!(listed["actors"], json!([]));
    }
    // Called again, it is a new actor.
    assert_eq!(incr(other, "gone").await.text(), "1");
    // Deleting an actor no call reached says so, and leaves no row.
    let r = owns.admin_send("DELETE", "/actors/probe/never").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["deleted"], false);
    assert_eq!(
        pg.psql(
            "weir",
            &format!(
                "SELECT count(*) FROM weir_objects WHERE key = '{}'",
                actor_key("never")
            )
        ),
        "0"
    );
    // With the database down a deletion is refused by name, and deletes
    // nothing: the actor goes on where it was once the database returns.
    for i in 1..=2u64 {
        assert_eq!(incr(&nodes[0], "kept").await.text(), i.to_string());
    }
    pg.stop("INT");
    for n in &nodes {
        let r = n.admin_send("DELETE", "/actors/probe/kept").await;
        assert_eq!(r.status, 503, "{:?}", r.body);
        assert_eq!(r.json()["error"], "storage_unavailable");
    }
    pg.run();
    let r = until_ok(&nodes[1], "POST", "/probe/kept/incr", "").await;
    assert_eq!(r.text(), "3");
}

/// The coordinator's deletion, one protocol step against a real
/// PostgreSQL: only the owning session, at its epoch and while its lease
/// is live, deletes an object, and whole; a fence of the deleted object
/// writes nothing after it; a retry finds it gone; the key's next claim
/// is a new object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clusters_actors_are_listed_a_page_at_a_time_in_the_databases_order() {
    let pg = Postgres::start();
    let n = node(&pg, "n1", &node_dir("operators-pages", "n1"), &[]);
    // Names whose order depends on the collation (`-`, `.` and `_`).
    let names = ["b0", "a_b", "a", "ab", "a.b", "b", "a-b"];
    for name in names {
        assert_eq!(incr(&n, name).await.text(), "1");
    }
    let in_order = pg.psql(
        "weir",
        "SELECT string_agg(key, ',' ORDER BY key) FROM weir_objects WHERE head > 0",
    );
    let expected: Vec<String> = in_order
        .split(',')
        .map(|key| format!("probe/{}", key.strip_prefix(&actor_key("")).unwrap()))
        .collect();
    assert_eq!(expected.len(), names.len(), "{in_order}");
    // Through a class's listing and the listing of every class, pages of
    // at most two: every actor once, in the database's order.
    for path in ["/actors/probe", "/actors"] {
        let pages = n.actor_pages(path, Some(2)).await;
        let sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
        assert_eq!(sizes, [2, 2, 2, 1], "{path}: {pages:?}");
        assert_eq!(pages.concat(), expected, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinators_deletion_is_fenced_and_whole() {
    use weir_cluster::coordinator::{
        Claimed, Coordinator, Deleted, Entry, Fence, Registration, ShipBatch,
    };
    let pg = Postgres::start();
    let coord = weir_cluster::postgres::Postgres::connect(
        &pg.url(),
        weir_cluster::postgres::SCHEMA_PATIENCE,
    )
    .await
    .unwrap();
    let register = |name: &'static str, ttl_ms: u64| {
        let coord = &coord;
        async move {
            match coord.register(name, "127.0.0.1:9", ttl_ms).await.unwrap() {
                Registration::Registered { session, .. } => session,
                other => panic!("{other:?}"),
            }
        }
    };
    let (a, b) = (register("a", 60_000).await, register("b", 60_000).await);
    let claim = |key: &'static str, session| {
        let coord = &coord;
        async move {
            match coord.claim(key, session, 0).await.unwrap() {
                Claimed::Owned(state) => state,
                other => panic!("{other:?}"),
            }
        }
    };
    let commit = |fence: Fence, previous: u64| {
        let coord = &coord;
        async move {
            let batch = ShipBatch {
                fence,
                previous,
                entries: vec![Entry {
                    head: previous + 1,
                    ltx: vec![1; 64],
                    checksum: 7,
                }],
                mirror: weir_store::replica::Mirror::alarm(Some(1)),
            };
            coord.commit_many(&[batch]).await.unwrap()[0]
        }
    };
    let state = claim("x_y/1", a).await;
    let fence = Fence {
        object: state.id,
        epoch: state.epoch,
        session: a,
    };
    // Head 1, a snapshot at it (which drops the log before it, in time),
    // head 2 after it.
    assert!(commit(fence, 0).await);
    assert!(coord.snapshot(fence, 1, b"snapshot").await.unwrap());
    assert!(commit(fence, 1).await);
    // A prefix is itself: `_` matches only `_`.
    let other = claim("xzy/1", a).await;
    assert!(
        commit(
            Fence {
                object: other.id,
                epoch: other.epoch,
                session: a
            },
            0
        )
        .await
    );
    let asked: Vec<String> = ["x_y/1", "xzy/1", "none"].map(String::from).into();
    let mut found = coord.with_history(&asked).await.unwrap();
    found.sort();
    assert_eq!(found, ["x_y/1", "xzy/1"]);
    let listed = coord.list("x_y/", None, 10).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    // After its one object, nothing.
    assert!(coord.list("x_y/", Some("1"), 10).await.unwrap().is_empty());
    assert_eq!(listed[0].key, "x_y/1");
    assert_eq!(listed[0].alarm_at, Some(1));
    assert_eq!(listed[0].owner.as_deref(), Some("a"));
    let rows_of = |table: &str| {
        pg.psql(
            "weir",
            &format!("SELECT count(*) FROM {table} WHERE object = {}", state.id),
        )
    };
    assert_ne!(rows_of("weir_log"), "0");
    assert_eq!(rows_of("weir_snapshots"), "1");
    // Not another session, not another epoch.
    for stranger in [
        Fence {
            session: b,
            ..fence
        },
        Fence {
            epoch: fence.epoch + 1,
            ..fence
        },
    ] {
        assert_eq!(coord.delete(stranger).await.unwrap(), Deleted::Fenced);
    }
    // The owner: row, log and snapshots in one step.
    assert_eq!(
        coord.delete(fence).await.unwrap(),
        Deleted::Deleted { head: 2 }
    );
    assert_eq!(rows_of("weir_log"), "0");
    assert_eq!(rows_of("weir_snapshots"), "0");
    assert!(coord.list("x_y/", None, 10).await.unwrap().is_empty());
    assert_eq!(coord.with_history(&asked).await.unwrap(), ["xzy/1"]);
    // A retry (its first answer lost) finds it gone.
    assert_eq!(coord.delete(fence).await.unwrap(), Deleted::Gone);
    // The deleted object's fence writes nothing more.
    assert!(!commit(fence, 2).await);
    assert!(!coord.snapshot(fence, 2, b"late").await.unwrap());
    assert_eq!(rows_of("weir_log"), "0");
    assert_eq!(rows_of("weir_snapshots"), "0");
    // The key's next claim is a new object, with nothing of the old.
    let again = claim("x_y/1", b).await;
    assert_eq!(
        coord.with_history(&asked).await.unwrap(),
        ["xzy/1"],
        "a claim alone is no history"
    );
    assert_ne!(again.id, state.id);
    assert_eq!((again.epoch, again.head), (1, 0));
    let history = coord.history(again.id, 0).await.unwrap();
    assert!(history.snapshot.is_none() && history.log.is_empty());
    // A session whose lease lapsed deletes nothing.
    let brief = register("c", 300).await;
    let short = claim("brief", brief).await;
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let lapsed = Fence {
        object: short.id,
        epoch: short.epoch,
        session: brief,
    };
    assert_eq!(coord.delete(lapsed).await.unwrap(), Deleted::Fenced);
}

/// Waits until `node_dir` no longer holds `file`, for at most 30 s.
async fn until_gone(node_dir: &std::path::Path, file: &str) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while holds_file(node_dir, file) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_kept_from_an_earlier_ownership_go_with_a_deleted_actor() {
    let pg = Postgres::start();
    let (dir1, dir2) = (node_dir("copies", "n1"), node_dir("copies", "n2"));
    // n1 alone makes two actors, then dies; n2 takes them over.
    let n1 = node(&pg, "n1", &dir1, &[]);
    for name in ["moved", "away"] {
        for i in 1..=2u64 {
            assert_eq!(incr(&n1, name).await.text(), i.to_string());
        }
    }
    drop(n1);
    let n2 = node(&pg, "n2", &dir2, &[]);
    for name in ["moved", "away"] {
        let r = until_ok(&n2, "POST", &format!("/probe/{name}/incr"), "").await;
        assert_eq!(r.text(), "3");
        assert_eq!(pg.owner(&actor_key(name)).as_deref(), Some("n2"));
    }
    // n1 comes back with its copies, which still have history: kept.
    let n1 = node(&pg, "n1", &dir1, &[]);
    tokio::time::sleep(common::SETTLE).await;
    for name in ["moved", "away"] {
        assert!(holds_file(&dir1, &format!("{name}.sqlite3")), "{name}");
    }
    // Deleted through n1: the owner (n2) deletes it, and n1 drops the
    // copy it kept before the deletion is answered.
    let r = n1.admin_send("DELETE", "/actors/probe/moved").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["deleted"], true);
    assert!(!holds_file(&dir2, "moved.sqlite3"), "the owner's copy");
    assert!(!holds_file(&dir1, "moved.sqlite3"), "n1's old copy");
    assert!(holds_file(&dir1, "away.sqlite3"), "another actor's copy");
    // Deleted while n1 is away: n1 drops its copy when it starts again.
    drop(n1);
    let r = n2.admin_send("DELETE", "/actors/probe/away").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["deleted"], true);
    assert!(holds_file(&dir1, "away.sqlite3"), "n1 was away");
    let n1 = node(&pg, "n1", &dir1, &[]);
    assert!(until_gone(&dir1, "away.sqlite3").await, "dropped at start");
    // What was deleted starts anew, through either node.
    assert_eq!(incr(&n2, "moved").await.text(), "1");
    assert_eq!(incr(&n1, "away").await.text(), "1");
}

/// An operator's call whose owner died: refused by name while the dead
/// node's lease still holds (nothing deleted), then run by the node that
/// takes the actor over, from the history in PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_call_to_a_dead_owner_is_refused_by_name_then_runs_on_the_next_owner() {
    let pg = Postgres::start();
    // A lease long enough that the refusal comes while it holds.
    let lease = ["--limit", "cluster_lease_ms=5000"];
    let n1 = node(&pg, "n1", &node_dir("dead-owner", "n1"), &lease);
    let mut n2 = node(&pg, "n2", &node_dir("dead-owner", "n2"), &lease);
    // An actor n2 owns, with a history (asked through n2, which knew n1
    // when it started; n1 learns of n2 at its next renewal).
    let mut owned = None;
    for i in 0..32 {
        let name = format!("doomed{i}");
        assert_eq!(incr(&n2, &name).await.text(), "1");
        if pg.owner(&actor_key(&name)).as_deref() == Some("n2") {
            owned = Some(name);
            break;
        }
    }
    let doomed = owned.expect("an actor of n2's among 32 names");
    assert_eq!(incr(&n1, &doomed).await.text(), "2");
    n2.signal("KILL");
    n2.wait_exit(std::time::Duration::from_secs(10))
        .expect("killed");
    let path = format!("/actors/probe/{doomed}");
    let rows = format!(
        "SELECT count(*) FROM weir_objects WHERE key = '{}'",
        actor_key(&doomed)
    );
    for (method, what) in [("GET", "inspection"), ("DELETE", "deletion")] {
        let r = n1.admin_send(method, &path).await;
        assert_eq!(r.status, 502, "{what}: {:?}", r.body);
        assert_eq!(r.json()["error"], "owner_unreachable", "{what}");
    }
    assert_eq!(pg.psql("weir", &rows), "1", "nothing deleted");
    // Once the lease lapses n1 takes the actor over: it inspects what
    // was durable, and deletes it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let detail = loop {
        let r = n1.admin_get(&format!("{path}?keys=1")).await;
        if r.status == 200 || std::time::Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(detail.status, 200, "{:?}", detail.body);
    assert_eq!(detail.json()["keys"][0]["text"], "2");
    let r = n1.admin_send("DELETE", &path).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["deleted"], true);
    assert_eq!(pg.psql("weir", &rows), "0");
    assert_eq!(incr(&n1, &doomed).await.text(), "1", "a new actor");
}
