//! `weir:sql` batches: atomicity, limits, types, and the path where a
//! batch outlives its event (outcome unknown to the client, lane
//! quarantined until it ends).

mod common;

use std::io::Write;
use std::path::PathBuf;

use bytes::Bytes;
use common::{Weir, guest};
use http::Request;
use http_body_util::Full;
use serde_json::{Value, json};

fn data_dir(name: &str) -> PathBuf {
    weir_scratch::dir(&format!("sql-{name}"))
}

fn start(dir: &std::path::Path, extra: &[&str]) -> Weir {
    let mut args = vec!["--data-dir", dir.to_str().unwrap(), "--sql-database", "app"];
    args.extend_from_slice(extra);
    Weir::start(&guest("sqlprobe"), &args)
}

async fn batch(weir: &Weir, db: &str, statements: Value) -> Value {
    let body = json!({ "db": db, "statements": statements }).to_string();
    let resp = weir
        .send(
            Request::post("/batch")
                .body(Full::new(Bytes::from(body)))
                .unwrap(),
        )
        .await;
    assert_eq!(resp.status, 200, "{:?}", resp.body);
    resp.json()
}

fn s(sql: &str, params: Value) -> Value {
    json!({ "sql": sql, "params": params })
}

/// A statement that never ends by itself.
fn runaway() -> Value {
    s(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c",
        json!([]),
    )
}

#[tokio::test]
async fn a_failing_statement_rolls_back_the_whole_batch() {
    let dir = data_dir("atomic");
    let weir = start(&dir, &[]);
    batch(
        &weir,
        "app",
        json!([s(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)",
            json!([])
        )]),
    )
    .await;
    let failed = batch(
        &weir,
        "app",
        json!([
            s("INSERT INTO t (v) VALUES (?1)", json!(["kept?"])),
            s("INSERT INTO t (v) VALUES (?1)", json!([null])),
        ]),
    )
    .await;
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.starts_with("Error::StatementFailed(StatementError { index: 1,"),
        "{error}"
    );
    assert!(error.contains("NOT NULL constraint failed"), "{error}");
    let count = batch(
        &weir,
        "app",
        json!([s("SELECT count(*) FROM t", json!([]))]),
    )
    .await;
    assert_eq!(
        count["results"][0]["rows"],
        json!([[0]]),
        "nothing of the batch stayed"
    );
}

#[tokio::test]
async fn over_limit_batches_are_refused_before_touching_the_database() {
    let dir = data_dir("limits");
    let weir = start(&dir, &[]);
    let empty = batch(&weir, "app", json!([])).await;
    assert_eq!(empty["error"], "Error::BatchSize(0)");
    let mut many = vec![s("CREATE TABLE created_by_a_refused_batch (x)", json!([]))];
    many.extend((0..128).map(|_| s("SELECT 1", json!([]))));
    let refused = batch(&weir, "app", Value::Array(many)).await;
    assert_eq!(refused["error"], "Error::BatchSize(129)");
    let params: Vec<Value> = (0..101).map(|i| json!(i)).collect();
    let too_many = batch(&weir, "app", json!([s("SELECT 1", Value::Array(params))])).await;
    assert!(
        too_many["error"]
            .as_str()
            .unwrap()
            .starts_with("Error::TooManyParams(StatementError { index: 0,"),
        "{too_many}"
    );
    let tables = batch(
        &weir,
        "app",
        json!([s(
            "SELECT count(*) FROM sqlite_master WHERE name = 'created_by_a_refused_batch'",
            json!([])
        )]),
    )
    .await;
    assert_eq!(tables["results"][0]["rows"], json!([[0]]));
    // At the limits it runs.
    let max: Vec<Value> = (0..128).map(|_| s("SELECT 1", json!([]))).collect();
    assert_eq!(
        batch(&weir, "app", Value::Array(max)).await["results"]
            .as_array()
            .unwrap()
            .len(),
        128
    );
    let params: Vec<Value> = (0..100).map(|i| json!(i)).collect();
    let ok = batch(
        &weir,
        "app",
        json!([s("SELECT ?100", Value::Array(params))]),
    )
    .await;
    assert_eq!(ok["results"][0]["rows"], json!([[99]]));
    let undeclared = batch(&weir, "other", json!([s("SELECT 1", json!([]))])).await;
    assert_eq!(undeclared["error"], "Error::NoSuchDatabase(\"other\")");
}

#[tokio::test]
async fn types_and_counts_round_trip() {
    let dir = data_dir("types");
    let weir = start(&dir, &[]);
    let out = batch(
        &weir,
        "app",
        json!([
            s("CREATE TABLE t (a, b, c, d, e)", json!([])),
            s(
                "INSERT INTO t VALUES (?1, ?2, ?3, ?4, ?5)",
                json!([null, i64::MIN, {"real": 2.0}, "tëxt ☃", {"blob": [0, 1, 255]}])
            ),
            s("INSERT INTO t VALUES (1, 2, 3, 4, 5)", json!([])),
            s("SELECT * FROM t ORDER BY rowid", json!([])),
        ]),
    )
    .await;
    let r = &out["results"];
    assert_eq!(r[1]["rows_written"], 1);
    assert_eq!(r[2]["last_insert_id"], 2);
    assert_eq!(r[3]["columns"], json!(["a", "b", "c", "d", "e"]));
    assert_eq!(r[3]["rows_read"], 2);
    assert_eq!(
        r[3]["rows"][0],
        json!([null, i64::MIN, {"real": 2.0}, "tëxt ☃", {"blob": [0, 1, 255]}])
    );
}

/// A server with one lane, a short cleanup budget and a `marks` table.
async fn marks_setup(name: &str, extra: &[&str]) -> (Weir, PathBuf) {
    let dir = data_dir(name);
    let mut args = vec![
        "--limit",
        "max_concurrent=1",
        "--limit",
        "cleanup_timeout_ms=100",
    ];
    args.extend_from_slice(extra);
    let weir = start(&dir, &args);
    batch(
        &weir,
        "app",
        json!([s("CREATE TABLE marks (m TEXT)", json!([]))]),
    )
    .await;
    (weir, dir)
}

fn body(statements: Value) -> Full<Bytes> {
    Full::new(Bytes::from(
        json!({ "db": "app", "statements": statements }).to_string(),
    ))
}

async fn marks(weir: &Weir) -> Value {
    batch(weir, "app", json!([s("SELECT m FROM marks", json!([]))])).await["results"][0]["rows"]
        .clone()
}

#[tokio::test]
async fn a_runaway_batch_ends_at_the_event_deadline_rolled_back_and_nothing_stays_quarantined() {
    let (weir, _dir) = marks_setup("runaway", &["--limit", "event_limit_ms=300"]).await;
    let resp = weir
        .send(
            Request::post("/batch")
                .body(body(json!([
                    s("INSERT INTO marks VALUES ('never')", json!([])),
                    runaway()
                ])))
                .unwrap(),
        )
        .await;
    resp.assert_weir_error(503, "event_deadline_exceeded");
    let receipt = weir
        .receipt_where(|r| r["error"] == "event_deadline_exceeded")
        .await;
    assert_eq!(receipt["outcome"], "deadline");
    // The statement stopped with its event: nothing waits for it, no lane
    // is held out of admission, and the batch rolled back.
    assert_eq!(weir.admin_get("/healthz").await.status, 200);
    let lanes = weir.status().await["apps"][0]["lanes"].clone();
    assert!(
        lanes
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["state"] != "quarantined"),
        "{lanes}"
    );
    assert_eq!(marks(&weir).await, json!([]));
}

#[tokio::test]
async fn a_batch_sqlite_cannot_interrupt_is_unconfirmed_and_quarantines_the_lane_until_it_ends() {
    let (weir, dir) = marks_setup("locked", &["--limit", "event_limit_ms=300"]).await;
    // Another process holds the database's write lock: the batch waits in
    // SQLite's busy handler, where no progress check can stop it.
    let holder = rusqlite::Connection::open(dir.join("sql/app.sqlite3")).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let resp = weir
        .send(
            Request::post("/batch")
                .body(body(json!([s(
                    "INSERT INTO marks VALUES ('late')",
                    json!([])
                )])))
                .unwrap(),
        )
        .await;
    resp.assert_weir_error(503, "storage_cleanup_unconfirmed");
    let receipt = weir
        .receipt_where(|r| r["error"] == "storage_cleanup_unconfirmed")
        .await;
    assert_eq!(receipt["outcome"], "deadline");
    // The lane admits nothing until the batch has ended.
    let status = weir.status().await;
    assert_eq!(
        status["apps"][0]["lanes"][0]["state"], "quarantined",
        "{status}"
    );
    assert_eq!(weir.admin_get("/healthz").await.status, 503);
    holder.execute_batch("COMMIT").unwrap();
    drop(holder);
    // Once the lock is free the batch goes on, finds its event gone, and
    // rolls back; the lane comes back.
    weir.wait_health(200).await;
    assert_eq!(marks(&weir).await, json!([]));
}

#[tokio::test]
async fn a_client_that_leaves_stops_its_runaway_batch_at_the_cancellation_deadline() {
    let (weir, _dir) = marks_setup(
        "departed",
        &[
            "--limit",
            "event_limit_ms=60000",
            "--limit",
            "cancellation_limit_ms=100",
        ],
    )
    .await;
    let statements = json!({
        "db": "app",
        "statements": [s("INSERT INTO marks VALUES ('gone')", json!([])), runaway()],
    })
    .to_string();
    {
        let mut client = std::net::TcpStream::connect(weir.addr).unwrap();
        write!(
            client,
            "POST /batch HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{statements}",
            statements.len()
        )
        .unwrap();
        weir.wait_busy(1).await;
    }
    let receipt = weir.receipt_where(|r| r["outcome"] == "cancelled").await;
    assert_eq!(receipt["error"], "request_cancelled");
    weir.wait_health(200).await;
    assert_eq!(marks(&weir).await, json!([]));
}
