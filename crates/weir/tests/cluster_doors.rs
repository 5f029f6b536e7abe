//! The doors between nodes, from outside: real nodes on a real
//! PostgreSQL. A flood of idle and secret-less connections to a node's
//! cluster port keeps no other node's calls out; a call from a peer that
//! holds the secret runs only as long, and answers only as much, as the
//! node's own calls may; and the database's password is taken where libpq
//! users keep it, never from the command line.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use common::cluster::{Postgres, actor_key, incr, node, node_dir, node_that_stops_at_start};
use common::{Weir, try_send_to};
use http::Request;
use http_body_util::Full;
use weir_cluster::envelope::{self, Answer, Target};
use weir_cluster::store_wire::{self, Bounds};

/// A node's internal (cluster) address, as its `/status` names it.
async fn internal(node: &Weir) -> SocketAddr {
    node.admin_get("/status").await.json()["cluster"]["address"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_and_secretless_connections_keeps_no_node_from_another() {
    let pg = Postgres::start();
    let n1 = node(&pg, "n1", &node_dir("flood", "n1"), &[]);
    let n2 = node(&pg, "n2", &node_dir("flood", "n2"), &[]);
    // An actor n1 owns, made through n1: n2 has no connection to n1 yet.
    let mut name = None;
    for i in 0..32 {
        let candidate = format!("flood{i}");
        assert_eq!(incr(&n1, &candidate).await.status, 200);
        if pg.owner(&actor_key(&candidate)).as_deref() == Some("n1") {
            name = Some(candidate);
            break;
        }
    }
    let name = name.expect("an actor n1 owns");
    let port = internal(&n1).await;
    let before = open_fds(n1.pid());
    // 2,000 connections that say nothing, and 2,000 calls without the
    // secret whose connections are then kept.
    let mut held = Vec::new();
    for _ in 0..2000 {
        held.push(TcpStream::connect(port).unwrap());
    }
    for _ in 0..2000 {
        let mut s = TcpStream::connect(port).unwrap();
        s.write_all(
            format!(
                "POST /weir/cluster/v3/call HTTP/1.1\r\nhost: {port}\r\ncontent-length: 0\r\n\r\n"
            )
            .as_bytes(),
        )
        .unwrap();
        held.push(s);
    }
    // A call through n2 still reaches the actor on n1 (it opens a new
    // connection to n1 now).
    let r = tokio::time::timeout(Duration::from_secs(30), incr(&n2, &name))
        .await
        .expect("the call through n2 answered (a flooded node keeps it out for 60 s)");
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.text(), "2");
    let now = open_fds(n1.pid());
    assert!(
        now < before + 300,
        "{now} descriptors open with 4,000 connections held (before: {before})"
    );
    drop(held);
}

/// Posts `target`'s `body` to `node`'s cluster port as another node would.
async fn as_a_peer(node: &Weir, target: &Target, body: Bytes) -> Answer {
    let port = internal(node).await;
    let envelope =
        envelope::encode_request(target, &envelope::store_call(body)).expect("encodable");
    let r = try_send_to(
        port,
        Request::post(weir_cluster::call_versions::call_path(
            weir_cluster::call_versions::CALL_VERSION,
        ))
        .header("host", port.to_string())
        .header(
            weir_cluster::internal::SECRET_HEADER,
            common::cluster::SECRET,
        )
        .body(Full::new(envelope))
        .unwrap(),
    )
    .await
    .expect("an answer");
    assert_eq!(r.status, 200, "{:?}", r.body);
    envelope::decode_answer(r.body.unwrap()).expect("an answer envelope")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_call_runs_no_longer_and_answers_no_more_than_the_nodes_own() {
    let pg = Postgres::start();
    let n1 = node(
        &pg,
        "n1",
        &node_dir("peer-bounds", "n1"),
        &[
            "--sql-database",
            "app",
            "--limit",
            "session_limit_ms=2000",
            "--limit",
            "max_sql_result_bytes=65536",
        ],
    );
    let target = Target::Sql {
        app: "gateway".into(),
        database: "app".into(),
    };
    let statement = |sql: &str| weir_store::sql::Statement {
        sql: sql.into(),
        params: Vec::new(),
    };
    // A statement that never ends, sent with "no time limit": stopped
    // where the node's own calls would be.
    let forever = statement(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
    );
    let unbounded = Bounds {
        left: None,
        max_result_bytes: 1 << 30,
    };
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        as_a_peer(&n1, &target, store_wire::encode_sql(&[forever], unbounded)),
    )
    .await
    .expect("the node stopped the statement (it held an SQL thread for good)");
    let Answer::Answered(response) = answer else {
        panic!("not run")
    };
    let ran = store_wire::decode_sql_answer(response.into_body()).unwrap();
    let e = ran.expect_err("stopped");
    assert!(
        e.to_string().contains("interrupt") || e.to_string().contains("stopped"),
        "{e}"
    );
    // An answer larger than the node's own calls may hand back, asked
    // for with a larger bound: refused at the node's.
    let big = statement("SELECT zeroblob(200000)");
    let answer = as_a_peer(&n1, &target, store_wire::encode_sql(&[big], unbounded)).await;
    let Answer::Answered(response) = answer else {
        panic!("not run")
    };
    let ran = store_wire::decode_sql_answer(response.into_body()).unwrap();
    let e = ran.expect_err("over max_sql_result_bytes");
    assert!(e.to_string().contains("65536"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_password_comes_from_where_libpq_keeps_it_never_the_command_line() {
    let pg = Postgres::start();
    // A role that must give a password (scram), before the trust rules.
    pg.psql(
        "weir",
        "CREATE ROLE secretive LOGIN PASSWORD 's3cr:et' CREATEDB",
    );
    pg.psql("weir", "ALTER DATABASE weir OWNER TO secretive");
    pg.psql("weir", "GRANT ALL ON SCHEMA public TO secretive");
    pg.require_password("secretive");
    let url = format!("postgres://secretive@127.0.0.1:{}/weir", pg.port);
    // On the command line: refused before anything starts, naming why.
    let with_password = format!("postgres://secretive:s3cr:et@127.0.0.1:{}/weir", pg.port);
    let out = node_that_stops_at_start(&with_password, "n0", &node_dir("password", "n0"), &[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("/proc/*/cmdline"), "{}", out.stderr);
    // In a weir.toml others may read: refused too.
    let config = node_dir("password", "cfg").with_extension("toml");
    std::fs::write(
        &config,
        format!("[cluster]\ndatabase = {with_password:?}\nnode = \"n0\"\n"),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let gateway = common::guest("gateway");
    let out = common::run_weir_with_env(
        &[
            "serve",
            gateway.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        &[("WEIR_CLUSTER_SECRET", common::cluster::SECRET)],
    );
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("others may read it"), "{}", out.stderr);
    // Without one: the database refuses the node.
    let out = node_that_stops_at_start(&url, "n0", &node_dir("password", "n0b"), &[]);
    assert_ne!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("password"), "{}", out.stderr);
    // From PGPASSWORD, and from a password file (libpq's format, 0600).
    let dir = node_dir("password", "n1");
    let n1 = Weir::start_with_env(
        &[
            common::guest("gateway").to_str().unwrap(),
            "--data-dir",
            dir.to_str().unwrap(),
            "--cluster",
            &url,
            "--node",
            "n1",
            "--cluster-listen",
            "127.0.0.1:0",
        ],
        &[
            ("WEIR_CLUSTER_SECRET", common::cluster::SECRET),
            ("PGPASSWORD", "s3cr:et"),
        ],
    );
    drop(n1);
    let file = dir.with_extension("pgpass");
    std::fs::write(
        &file,
        format!("127.0.0.1:{}:weir:secretive:s3cr\\:et\n", pg.port),
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let dir = node_dir("password", "n2");
    let n2 = Weir::start_with_env(
        &[
            common::guest("gateway").to_str().unwrap(),
            "--data-dir",
            dir.to_str().unwrap(),
            "--cluster",
            &url,
            "--node",
            "n2",
            "--cluster-listen",
            "127.0.0.1:0",
        ],
        &[
            ("WEIR_CLUSTER_SECRET", common::cluster::SECRET),
            ("PGPASSFILE", file.to_str().unwrap()),
        ],
    );
    // Joined: the database took its password and gave it a session.
    let session = common::cluster::session(&n2).await;
    assert!(session.is_number(), "{session}");
}
