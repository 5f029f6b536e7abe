//! Images in cluster mode, from outside: real nodes on a real PostgreSQL,
//! real command images run from actors' turns. An image pushed to one node
//! runs on any node; a node checks what it fetches byte for byte, and a
//! damaged, cut or oversized shared copy is refused by name and leaves
//! nothing behind; a node that joins with images of its own shares them;
//! a removal reaches every node, also one that was away; and a push the
//! cluster cannot take is not acknowledged.

mod common;

use std::time::{Duration, Instant};

use common::Weir;
use common::cluster::{
    Postgres, node_dir, placed_on, placed_on_from, runner_key as actor_key, runner_node,
};
use common::programs::{admin, call, cmdprobe, image_file, push as push_offline};
use serde_json::Value;

/// Pushes cmdprobe through `node`'s admin address: the answer.
async fn push_cmdprobe(node: &Weir) -> common::Resp {
    admin(
        node,
        "PUT",
        "/images",
        std::fs::read(cmdprobe()).unwrap(),
        true,
    )
    .await
}

/// The digests of `node`'s own store.
async fn stored_on(node: &Weir) -> Vec<String> {
    let listed = admin(node, "GET", "/images", Vec::new(), true).await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    listed.json()["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["digest"].as_str().unwrap().to_string())
        .collect()
}

/// Runs `digest` as `cat` of `body` from actor `actor`'s turn, through
/// `node`.
async fn run_cat(node: &Weir, actor: &str, digest: &str, body: &str) -> common::Resp {
    call(
        node,
        "POST",
        &format!("/r/{actor}/run/{digest}?arg=cat"),
        body.as_bytes(),
    )
    .await
}

/// A failed call's status, `error` and `message` (the runner guest
/// answers every image error 404, its code first in the message).
fn guest_error(resp: &common::Resp) -> (u16, Value, String) {
    let body = resp.json();
    (
        resp.status.as_u16(),
        body["error"].clone(),
        body["message"].as_str().unwrap_or_default().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_pushed_to_one_node_runs_on_another_which_fetches_it_whole() {
    let pg = Postgres::start();
    let a = runner_node(&pg, "a", &node_dir("images-run", "a"), &[]);
    let b = runner_node(&pg, "b", &node_dir("images-run", "b"), &[]);

    let pushed = push_cmdprobe(&a).await;
    assert_eq!(pushed.status, 201, "{}", pushed.text());
    assert_eq!(pushed.json()["shared"], true);
    let digest = pushed.json()["digest"].as_str().unwrap().to_string();
    let size = pushed.json()["bytes"].as_u64().unwrap();
    assert_eq!(
        pg.psql(
            "weir",
            &format!("SELECT bytes FROM weir_images WHERE digest = '{digest}'")
        ),
        size.to_string(),
        "the cluster's database names the image once it is whole"
    );
    let shared = admin(&b, "GET", "/images", Vec::new(), true).await.json();
    assert_eq!(
        shared["shared"],
        serde_json::json!([{ "digest": digest, "bytes": size }]),
        "every node lists what the cluster shares"
    );

    // Two actors b owns run the image on b at once, called through a:
    // b fetches it once, and both run it.
    let on_b = placed_on("b", &["a", "b"]);
    let other = placed_on_from(
        "b",
        &["a", "b"],
        on_b.rsplit('-').next().unwrap().parse::<usize>().unwrap() + 1,
    );
    let (ran, also) = tokio::join!(
        run_cat(&a, &on_b, &digest, "hello from b"),
        run_cat(&a, &other, &digest, "and again")
    );
    assert_eq!(ran.status, 200, "{}", ran.text());
    assert_eq!(ran.json()["exit_code"], 0);
    assert_eq!(ran.json()["stdout"], "hello from b");
    assert_eq!(also.json()["stdout"], "and again", "{}", also.text());
    assert_eq!(pg.owner(&actor_key(&on_b)).as_deref(), Some("b"));
    assert_eq!(pg.owner(&actor_key(&other)).as_deref(), Some("b"));
    assert!(
        stored_on(&b).await.contains(&digest),
        "b keeps what it fetched"
    );
    let status = b.admin_get("/status").await.json();
    assert_eq!(
        (
            &status["images"]["fetched"],
            &status["images"]["fetched_bytes"]
        ),
        (&Value::from(1), &Value::from(size)),
        "b fetched it once, for both: {}",
        status["images"]
    );
    let bytes = std::fs::read(
        node_dir_path("images-run", "b")
            .join("images")
            .join(format!("{}.wasm", digest.trim_start_matches("sha256:"))),
    )
    .unwrap();
    assert_eq!(
        bytes,
        std::fs::read(cmdprobe()).unwrap(),
        "what b stored is the image, byte for byte"
    );

    // A node that joins later catches up by itself: it fetches the image
    // and compiles it, as a push would, before any turn names it.
    let c = runner_node(&pg, "c", &node_dir("images-run", "c"), &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let compiled = node_dir_path("images-run", "c")
        .join("images")
        .join("compiled");
    let hex = digest.trim_start_matches("sha256:").to_string();
    loop {
        let has_code = std::fs::read_dir(&compiled).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&hex))
        });
        if stored_on(&c).await.contains(&digest) && has_code {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "c did not fetch and compile the shared image"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Naming an image nobody pushed is what it is on one node.
    let missing = format!("sha256:{}", "0".repeat(64));
    let ran = run_cat(&b, &on_b, &missing, "").await;
    assert_eq!(
        guest_error(&ran),
        (
            404,
            "image".into(),
            format!("image_not_found: no image {missing} in the store")
        )
    );
}

/// Where [`node_dir`] put a node's data (not emptied).
fn node_dir_path(test: &str, node: &str) -> std::path::PathBuf {
    common::cluster::node_path(test, node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_cut_or_oversized_shared_copy_is_refused_and_leaves_nothing() {
    let pg = Postgres::start();
    let a = runner_node(&pg, "a", &node_dir("images-bad", "a"), &[]);
    let pushed = push_cmdprobe(&a).await;
    assert_eq!(pushed.status, 201, "{}", pushed.text());
    let digest = pushed.json()["digest"].as_str().unwrap().to_string();
    let size = pushed.json()["bytes"].as_u64().unwrap();
    let piece = format!("digest = '{digest}' AND piece = 0");

    // One byte of the shared copy flipped, before b ever saw it.
    pg.psql(
        "weir",
        &format!(
            "UPDATE weir_image_pieces SET data = set_byte(data, 100, (get_byte(data, 100) + 1) % 256) WHERE {piece}"
        ),
    );
    let b = runner_node(&pg, "b", &node_dir("images-bad", "b"), &[]);
    let on_b = placed_on("b", &["a", "b"]);
    let ran = run_cat(&b, &on_b, &digest, "x").await;
    let (status, error, message) = guest_error(&ran);
    assert_eq!((status, error), (404, Value::from("image")), "{message}");
    assert!(
        message.starts_with(&format!(
            "image_corrupt: image {digest} is corrupt: its {size} bytes hash to sha256:"
        )),
        "{message}"
    );
    assert_eq!(pg.owner(&actor_key(&on_b)).as_deref(), Some("b"));
    assert!(!stored_on(&b).await.contains(&digest), "nothing kept");
    let refused = b.admin_get("/status").await.json()["images"]["fetches_refused"].clone();
    assert!(refused.as_u64().unwrap() >= 1, "{refused}");

    // Pushing again mends the shared copy.
    let again = push_cmdprobe(&a).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json()["shared"], true);
    let ran = run_cat(&b, &on_b, &digest, "mended").await;
    assert_eq!(ran.status, 200, "{}", ran.text());
    assert_eq!(ran.json()["stdout"], "mended");

    // Cut short: the shared copy ends early. (A node's lease may outlive
    // it a while: each newcomer gets a name it owns among all so far.)
    drop(b);
    pg.psql(
        "weir",
        &format!(
            "UPDATE weir_image_pieces SET data = substring(data from 1 for 100) WHERE {piece}"
        ),
    );
    let cut = format!(
        "image_corrupt: image {digest} is corrupt: the cluster's copy ends at byte 100 of its {size}; push it again"
    );
    refused_by_a_newcomer(&pg, "b2", &["a", "b", "b2"], &[], &digest, &cut).await;
    assert_eq!(push_cmdprobe(&a).await.status, 200);

    // Grown: a piece longer than the image.
    pg.psql(
        "weir",
        &format!("UPDATE weir_image_pieces SET data = data || '\\x00'::bytea WHERE {piece}"),
    );
    let grown = format!(
        "image_corrupt: image {digest} is corrupt: the cluster's copy is longer than its {size} bytes; push it again"
    );
    refused_by_a_newcomer(&pg, "b3", &["a", "b", "b2", "b3"], &[], &digest, &grown).await;
    assert_eq!(push_cmdprobe(&a).await.status, 200);

    // A node whose own max_image_bytes is smaller refuses to fetch it.
    let over = format!("image_too_large: the image is {size} bytes; max_image_bytes is 1024");
    refused_by_a_newcomer(
        &pg,
        "small",
        &["a", "b", "b2", "b3", "small"],
        &["--limit", "max_image_bytes=1024"],
        &digest,
        &over,
    )
    .await;
}

/// Starts node `name` (with `extra` arguments) and runs `digest` from an
/// actor it owns among `nodes`: the run is refused with `message`, and
/// the node keeps nothing of the image.
async fn refused_by_a_newcomer(
    pg: &Postgres,
    name: &str,
    nodes: &[&str],
    extra: &[&str],
    digest: &str,
    message: &str,
) {
    let node = runner_node(pg, name, &node_dir("images-bad", name), extra);
    let ran = run_cat(&node, &placed_on(name, nodes), digest, "x").await;
    assert_eq!(
        guest_error(&ran),
        (404, "image".into(), message.to_string())
    );
    assert!(
        !stored_on(&node).await.contains(&digest.to_string()),
        "nothing kept"
    );
}

/// Waits (at most 30 s) until `what` holds of `node`'s own store.
async fn until_stored(node: &Weir, what: &str, holds: impl Fn(&[String]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !holds(&stored_on(node).await) {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_a_node_joins_with_are_shared_and_a_removal_reaches_every_node() {
    let mut pg = Postgres::start();
    // Leases long enough that the nodes still serve for a while once
    // PostgreSQL is down.
    let lease = ["--limit", "cluster_lease_ms=10000"];
    let a = runner_node(&pg, "a", &node_dir("images-rm", "a"), &lease);
    let b = runner_node(&pg, "b", &node_dir("images-rm", "b"), &lease);
    let pushed = push_cmdprobe(&a).await;
    let digest = pushed.json()["digest"].as_str().unwrap().to_string();
    let on_b = placed_on("b", &["a", "b", "d", "e"]);
    let ran = run_cat(&b, &on_b, &digest, "before").await;
    assert_eq!(ran.status, 200, "{}", ran.text());

    // d joins with images of its own (pushed into its store offline): it
    // shares the one that reads back whole, and b runs it; one whose file
    // was damaged on d's disk is never shared, and stays for the operator.
    let d_dir = node_dir("images-rm", "d");
    let wc = push_offline(&d_dir, common::guest("wc").to_str().unwrap());
    let hello = push_offline(&d_dir, common::guest("hello").to_str().unwrap());
    let damaged = image_file(&d_dir, &hello);
    let mut bytes = std::fs::read(&damaged).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&damaged, &bytes).unwrap();
    let d = runner_node(&pg, "d", &d_dir, &lease);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let images = d.admin_get("/status").await.json()["images"].clone();
        if images["shared_kept"] == 1 && images["kept_unshareable"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "d did not go through its own images: {images}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let shared = |digest: &str| {
        pg.psql(
            "weir",
            &format!("SELECT count(*) FROM weir_images WHERE digest = '{digest}'"),
        )
    };
    assert_eq!((shared(&wc), shared(&hello)), ("1".into(), "0".into()));
    assert!(
        damaged.exists(),
        "a damaged image is the operator's to remove"
    );
    let ran = call(
        &a,
        "POST",
        &format!("/r/{on_b}/run/{wc}?arg=notes.txt"),
        b"one two\nthree\n",
    )
    .await;
    assert_eq!(ran.status, 200, "{}", ran.text());
    assert_eq!(
        ran.json()["stdout"],
        "2 3 14 fnv1a64:b1b9f9a7fa44b82f notes.txt\n"
    );
    drop(d);

    // e was away when the image was removed, holding a copy of it.
    let e_dir = node_dir("images-rm", "e");
    assert_eq!(push_offline(&e_dir, &cmdprobe()), digest);
    let removed = admin(&a, "DELETE", &format!("/images/{digest}"), Vec::new(), true).await;
    assert_eq!(removed.status, 200, "{}", removed.text());
    assert_eq!(removed.json()["deleted"], true);
    assert_eq!(removed.json()["shared_deleted"], true);
    assert_eq!(
        pg.psql(
            "weir",
            &format!("SELECT count(*) FROM weir_image_pieces WHERE digest = '{digest}'")
        ),
        "0",
        "its pieces went with it"
    );
    // b drops its copy when it next catches up (every 2 s), and so does
    // e when it comes back: it does not share the removed image again.
    until_stored(&b, "b still has the removed image", |s| {
        !s.contains(&digest)
    })
    .await;
    let ran = run_cat(&b, &on_b, &digest, "after").await;
    assert_eq!(guest_error(&ran).0, 404, "{}", ran.text());
    let e = runner_node(&pg, "e", &e_dir, &lease);
    until_stored(&e, "e still has the removed image", |s| {
        !s.contains(&digest)
    })
    .await;
    assert_eq!(
        pg.psql(
            "weir",
            &format!("SELECT count(*) FROM weir_images WHERE digest = '{digest}'")
        ),
        "0",
        "e did not share it again"
    );
    let status = e.admin_get("/status").await.json();
    assert_eq!(
        (
            &status["images"]["dropped"],
            &status["images"]["shared_kept"]
        ),
        (&Value::from(1), &Value::from(0)),
        "{}",
        status["images"]
    );
    drop(e);

    // With the database down, a node cannot tell whether the cluster has
    // an image it lacks: it says so, and does not say "not found".
    pg.stop("INT");
    let unknown = format!("sha256:{}", "1".repeat(64));
    let ran = run_cat(&b, &on_b, &unknown, "x").await;
    let (status, error, message) = guest_error(&ran);
    assert_eq!((status, error), (404, Value::from("image")), "{message}");
    assert!(
        message.starts_with(
            "images_unavailable: the cluster's images cannot be reached: the cluster database is unavailable: "
        ),
        "{message}"
    );

    // Nor can it list, remove or sweep by the cluster's images.
    for (method, path) in [
        ("GET", "/images".to_string()),
        ("DELETE", format!("/images/{digest}")),
        ("POST", "/images/sweep".to_string()),
    ] {
        let refused = admin(&a, method, &path, Vec::new(), true).await;
        assert_eq!(
            (refused.status.as_u16(), refused.json()["error"].clone()),
            (503, Value::from("images_unavailable")),
            "{method} {path}: {}",
            refused.text()
        );
    }

    // A push that reaches a's store but not the cluster is not done.
    let refused = push_cmdprobe(&a).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.json()["error"], "images_unavailable");
    let message = refused.json()["message"].as_str().unwrap().to_string();
    assert!(
        message.starts_with(&format!(
            "the cluster's images cannot be reached: {digest} could not be shared with the other nodes; push it again: "
        )),
        "{message}"
    );
    // The operator's push brings a removed image back.
    pg.run();
    let again = push_cmdprobe(&a).await;
    assert_eq!(again.json()["shared"], true, "{}", again.text());
    assert_eq!(
        pg.psql(
            "weir",
            &format!(
                "SELECT (SELECT count(*) FROM weir_images WHERE digest = '{digest}') || ',' || \
                 (SELECT count(*) FROM weir_images_removed WHERE digest = '{digest}')"
            )
        ),
        "1,0"
    );
    until_stored(&b, "b did not fetch the image pushed again", |s| {
        s.contains(&digest)
    })
    .await;
}
