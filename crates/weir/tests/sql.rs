//! `weir:sql` batches: atomicity, limits, types, and the path where a
//! batch outlives its event (outcome unknown to the client, lane
//! quarantined until it ends).

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use common::{Weir, guest};
use http::Request;
use http_body_util::Full;
use serde_json::{Value, json};

fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-sql-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
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

/// A statement that keeps SQLite busy for about two seconds.
fn slow() -> Value {
    s(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 6000000) SELECT count(*) FROM c",
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

/// A server with one lane, a short cleanup budget and a `marks` table, and
/// the body of a slow batch that ends by writing `mark`.
async fn slow_batch_setup(name: &str, limit: &str, mark: &str) -> (Weir, String) {
    let dir = data_dir(name);
    let weir = start(
        &dir,
        &[
            "--limit",
            "max_concurrent=1",
            "--limit",
            limit,
            "--limit",
            "cleanup_timeout_ms=100",
        ],
    );
    batch(
        &weir,
        "app",
        json!([s("CREATE TABLE marks (m TEXT)", json!([]))]),
    )
    .await;
    let body = json!({
        "db": "app",
        "statements": [slow(), s("INSERT INTO marks VALUES (?1)", json!([mark]))],
    })
    .to_string();
    (weir, body)
}

/// After the batch ends the lane comes back, and the batch's outcome can
/// be read: it committed.
async fn lane_returns_with(weir: &Weir, mark: &str) {
    weir.wait_health(200).await;
    let marks = batch(weir, "app", json!([s("SELECT m FROM marks", json!([]))])).await;
    assert_eq!(marks["results"][0]["rows"], json!([[mark]]));
}

#[tokio::test]
async fn a_batch_that_outlives_its_event_is_unconfirmed_and_quarantines_the_lane() {
    let (weir, body) = slow_batch_setup("unknown", "event_limit_ms=300", "committed late").await;
    // The client stays; the event deadline passes while the batch runs.
    let resp = weir
        .send(
            Request::post("/batch")
                .body(Full::new(Bytes::from(body)))
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
    lane_returns_with(&weir, "committed late").await;
}

#[tokio::test]
async fn a_batch_outliving_a_departed_client_is_waited_for_not_cut() {
    let (weir, body) = slow_batch_setup(
        "departed",
        "cancellation_limit_ms=100",
        "after the client left",
    )
    .await;
    {
        let mut client = std::net::TcpStream::connect(weir.addr).unwrap();
        write!(
            client,
            "POST /batch HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    let receipt = weir
        .receipt_where(|r| r["error"] == "storage_cleanup_unconfirmed")
        .await;
    assert_eq!(receipt["outcome"], "cancelled");
    lane_returns_with(&weir, "after the client left").await;
}
