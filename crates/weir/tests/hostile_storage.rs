//! A hostile tenant fills its storage, from outside: the `hostile` guest
//! (as the app and as an actor class) writes into its key-value store, its
//! SQL database and its actors' storage until `max_database_bytes` refuses
//! it, against a real `weir serve`. What must hold: every refusal is named,
//! no file outgrows the bound, a turn that lost its transaction keeps
//! nothing, a full actor still wakes and can be emptied, and other tenants
//! are untouched. Made-up actor names stop at `max_actors`: a refusal is
//! named and leaves no file, and the actors that exist still answer. All
//! of an app's actors together stop at `max_actor_storage_bytes`.

mod common;

use serde_json::{Value, json};

use common::hostile::*;

/// The size of a file, 0 when there is none.
fn file_bytes(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

#[tokio::test]
async fn no_guest_can_grow_a_database_past_max_database_bytes_and_a_full_turn_keeps_nothing() {
    const BOUND: u64 = 1 << 20;
    let dir = data_dir("disk-fill");
    let bound = format!("max_database_bytes={BOUND}");
    let weir = start(&dir, &["--limit", &bound]);
    assert_eq!(weir.get("/p/victim/incr").await.text(), "1");

    // An actor's turn writes a mark, then 20 KB values until one is
    // refused, then another mark. SQLite takes the whole transaction with
    // the refused write, so the turn may not go on or answer: it keeps
    // nothing, and its caller is told the commit failed, naming why.
    weir.get("/h/f1/fill?bytes=20000")
        .await
        .assert_weir_error(503, "storage_commit_failed");
    let r = weir
        .actor_receipt_where(|r| r["error"] == "storage_commit_failed")
        .await;
    let detail = r["detail"].as_str().unwrap();
    assert!(detail.contains("database_full"), "{r}");
    assert!(detail.contains("nothing of the turn was kept"), "{r}");
    for key in ["mark:a", "fill:000000", "mark:b"] {
        let r = weir.get(&format!("/h/f1/get?key={key}")).await.json();
        assert_eq!(r, json!({ "bytes": null }), "{key}");
    }
    let actor_db = dir.join("actors/hostile/f1.sqlite3");
    assert!(file_bytes(&actor_db) <= BOUND, "{}", file_bytes(&actor_db));
    // The actor goes on: a turn that fits commits.
    assert_eq!(
        weir.get("/h/f1/put-big?n=3&bytes=20000").await.json(),
        json!({ "put": 3 })
    );
    assert_eq!(
        weir.get("/h/f1/get?key=big:000002").await.json(),
        json!({ "bytes": 20000 })
    );

    // A statement SQLite can undo alone is refused alone: the turn keeps
    // what came before and after it.
    let grow = "INSERT INTO t SELECT randomblob(50000) FROM \
                (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100) SELECT x FROM c)";
    let answers = exec(
        &weir,
        "f2",
        &[
            "CREATE TABLE t (b)",
            "INSERT INTO t VALUES (1)",
            grow,
            "INSERT INTO t VALUES (2)",
        ],
    )
    .await;
    let refused = answers[2]["error"].as_str().unwrap_or_default();
    assert!(refused.contains("database_full"), "{answers:?}");
    assert!(answers[3]["rows"].is_array(), "{answers:?}");
    let r = exec(&weir, "f2", &["SELECT count(*) FROM t"]).await;
    assert_eq!(r[0]["rows"], json!([[2]]), "{r:?}");
    let actor_db = dir.join("actors/hostile/f2.sqlite3");
    assert!(file_bytes(&actor_db) <= BOUND, "{}", file_bytes(&actor_db));

    // The worker's key-value store: every write before the refused one is
    // its own commit and stays; the refusal names the bound.
    let r = weir.get("/kv-fill?bytes=20000").await.json();
    let filled = r["filled"].as_u64().unwrap();
    assert!(filled > 10, "{r}");
    let refused = r["refused"].as_str().unwrap_or_default();
    assert!(refused.contains("database_full"), "{r}");
    let kv_file = dir.join("kv/main.sqlite3");
    assert!(file_bytes(&kv_file) <= BOUND, "{}", file_bytes(&kv_file));
    // A key deleted makes room again.
    let r = weir
        .get("/kv-fill?bytes=5000&n=1&tag=again&delete=fill::000000")
        .await
        .json();
    assert_eq!(r["filled"], 1, "{r}");
    assert_eq!(r["refused"], Value::Null, "{r}");

    // The worker's SQL database: the batch that would grow past the bound
    // is refused at that statement and rolled back whole.
    let r = sql(
        &weir,
        &[
            "CREATE TABLE big (b)",
            grow.replace(" t ", " big ").as_str(),
        ],
    )
    .await;
    let error = r["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("StatementFailed(StatementError { index: 1,"),
        "{r}"
    );
    assert!(error.contains("database_full"), "{r}");
    let r = sql(
        &weir,
        &["SELECT count(*) FROM sqlite_master WHERE name = 'big'"],
    )
    .await;
    assert_eq!(r["rows"][0], json!([[0]]), "{r}");
    assert!(file_bytes(&dir.join("sql/app.sqlite3")) <= BOUND);

    // An actor filled to its bound one committed turn at a time: the turn
    // that no longer fits fails, and the full actor still wakes (its
    // database reopened, its incarnation bumped), reads, and can be
    // emptied, so no actor is left stuck at its bound.
    assert!(exec(&weir, "f3", &["CREATE TABLE t (b)"]).await[0]["rows"].is_array());
    let mut committed = 0;
    loop {
        let r = post_json(
            &weir,
            "/h/f3/exec",
            json!(["INSERT INTO t VALUES (randomblob(20000))"]),
        )
        .await;
        if r.status == 200 {
            committed += 1;
            assert!(committed < 100, "the bound refused no turn");
            continue;
        }
        r.assert_weir_error(503, "storage_commit_failed");
        break;
    }
    assert!(committed > 10, "{committed}");
    let r = exec(&weir, "f3", &["SELECT count(*) FROM t"]).await;
    assert_eq!(r[0]["rows"], json!([[committed]]), "{r:?}");
    let r = exec(
        &weir,
        "f3",
        &["DELETE FROM t", "INSERT INTO t VALUES (randomblob(20000))"],
    )
    .await;
    assert!(r[1]["rows"].is_array(), "{r:?}");
    let actor_db = dir.join("actors/hostile/f3.sqlite3");
    assert!(file_bytes(&actor_db) <= BOUND, "{}", file_bytes(&actor_db));

    // Everyone else is untouched.
    assert_eq!(weir.get("/p/victim/incr").await.text(), "2");
    assert_eq!(weir.get("/hello").await.json(), json!("still here"));
}

/// The actors with a database under `dir`, by `class/name`.
fn actor_files(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    let classes = std::fs::read_dir(dir.join("actors")).unwrap().flatten();
    for class in classes.filter(|c| c.path().is_dir()) {
        for file in std::fs::read_dir(class.path()).unwrap().flatten() {
            let file = file.file_name().into_string().unwrap();
            if let Some(name) = file.strip_suffix(".sqlite3") {
                found.push(format!("{}/{name}", class.file_name().to_str().unwrap()));
            }
        }
    }
    found.sort();
    found
}

#[tokio::test]
async fn made_up_actor_names_stop_at_max_actors_and_the_actors_that_exist_still_answer() {
    const MAX: u64 = 4;
    let dir = data_dir("actor-census");
    let max = format!("max_actors={MAX}");
    // No actor hibernates while the test counts the live ones, however
    // slow the machine.
    let limits = ["--limit", &max, "--limit", "actor_idle_ms=600000"];
    let weir = start(&dir, &limits);
    assert_eq!(weir.get("/p/victim/incr").await.text(), "1");

    // A worker makes up names: three more actors are made (the limit is
    // the app's, across its classes), and every call past them is refused
    // by name, without a file.
    let r = weir.get("/names?n=6&prefix=n").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let answer = r.json();
    assert_eq!(
        answer["statuses"],
        json!([200, 200, 200, 507, 507, 507]),
        "{answer}"
    );
    let refusal: Value = serde_json::from_str(answer["refusal"].as_str().unwrap()).unwrap();
    assert_eq!(refusal, json!({ "error": "too_many_actors" }));
    // A client of the actor route is refused the same way.
    weir.get("/h/stranger/hello")
        .await
        .assert_weir_error(507, "too_many_actors");
    assert_eq!(
        actor_files(&dir),
        ["hostile/n0", "hostile/n1", "hostile/n2", "probe/victim"]
    );
    let r = weir
        .actor_receipt_where(|r| r["error"] == "too_many_actors" && r["name"] == "stranger")
        .await;
    assert!(r["detail"].as_str().unwrap().contains("max_actors"), "{r}");
    let status = weir.admin_get("/actors").await.json()["status"].clone();
    assert_eq!(status["actors"], MAX, "{status}");
    assert_eq!(status["max_actors"], MAX, "{status}");
    assert_eq!(status["refused_new"], 4, "{status}");
    // A refused name holds no place in memory either: only the actors
    // that exist are live.
    assert_eq!(status["live"], MAX, "{status}");
    assert_eq!(status["hibernations"], 0, "{status}");

    // The actors that exist still answer, with their data.
    assert_eq!(weir.get("/p/victim/incr").await.text(), "2");
    assert_eq!(weir.get("/h/n2/hello").await.text(), "\"still here\"");

    // Deleting one gives its place back, to one newcomer only.
    let r = weir.admin_send("DELETE", "/actors/hostile/n0").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(weir.get("/h/stranger/hello").await.status, 200);
    weir.get("/h/another/hello")
        .await
        .assert_weir_error(507, "too_many_actors");

    // After a restart the census is counted again from the disk: a full
    // app stays full, and every actor on disk still wakes.
    drop(weir);
    let weir = start(&dir, &limits);
    let status = weir.admin_get("/actors").await.json()["status"].clone();
    assert_eq!(status["actors"], MAX, "{status}");
    weir.get("/h/another/hello")
        .await
        .assert_weir_error(507, "too_many_actors");
    assert_eq!(weir.get("/p/victim/incr").await.text(), "3");
    for name in ["n1", "n2", "stranger"] {
        assert_eq!(
            weir.get(&format!("/h/{name}/hello")).await.status,
            200,
            "{name}"
        );
    }
    assert_eq!(
        actor_files(&dir),
        [
            "hostile/n1",
            "hostile/n2",
            "hostile/stranger",
            "probe/victim"
        ]
    );
}

/// What the actor files under `dir` take on disk, databases and WALs.
fn actor_disk_bytes(dir: &std::path::Path) -> u64 {
    actor_files(dir)
        .iter()
        .map(|actor| {
            let db = dir.join(format!("actors/{actor}.sqlite3"));
            file_bytes(&db) + file_bytes(&db.with_extension("sqlite3-wal"))
        })
        .sum()
}

#[tokio::test]
async fn actors_together_stop_at_max_actor_storage_bytes_and_a_deleted_actor_gives_room_back() {
    const ROOM: u64 = 2 << 20;
    let dir = data_dir("storage-room");
    let room = format!("max_actor_storage_bytes={ROOM}");
    // No actor hibernates while the test counts, however slow the machine.
    let limits = ["--limit", &room, "--limit", "actor_idle_ms=600000"];
    let weir = start(&dir, &limits);
    assert_eq!(weir.get("/p/victim/incr").await.text(), "1");

    // Actors far under max_database_bytes (512 MiB) fill the app's room
    // together, 200 KB a turn, in statements SQLite undoes alone.
    let grow = |rows: u32, bytes: u32| {
        format!(
            "INSERT INTO t SELECT randomblob({bytes}) FROM \
             (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {rows}) \
             SELECT x FROM c)"
        )
    };
    let big = grow(10, 20_000);
    let mut made = Vec::new();
    for i in 0..40 {
        let name = format!("r{i}");
        let r = post_json(
            &weir,
            &format!("/h/{name}/exec"),
            json!(["CREATE TABLE t (b)", big]),
        )
        .await;
        if r.status == 507 {
            r.assert_weir_error(507, "actor_storage_full");
            break;
        }
        assert_eq!(r.status, 200, "{:?}", r.body);
        made.push(name);
    }
    assert!(made.len() >= 3, "{made:?}");
    assert!(made.len() < 40, "the room refused no new actor");
    // An actor that exists fills what is left with small writes, to the
    // page, in one turn: each refused one is refused alone, named, and the
    // turn goes on; the turn grows by what was free, however many writes
    // it makes.
    let small = grow(2, 1_000);
    let mut statements = vec!["CREATE TABLE IF NOT EXISTS t (b)"];
    statements.extend(vec![small.as_str(); 200]);
    let last = made.last().unwrap();
    let answers = exec(&weir, last, &statements).await;
    let kept = answers.iter().filter(|a| a["rows"].is_array()).count();
    assert!(kept < 201, "the room refused no small write: {answers:?}");
    let error = answers[kept]["error"].as_str().unwrap_or_default();
    assert!(error.contains("database_full"), "{error}");
    assert!(error.contains("max_actor_storage_bytes"), "{error}");
    assert!(
        answers[kept..].iter().all(|a| a["error"]
            .as_str()
            .is_some_and(|e| e.contains("database_full"))),
        "{answers:?}"
    );
    // Every actor's files are counted, to the byte, once its turns ended.
    let status = weir.admin_get("/actors").await.json()["status"].clone();
    let used = status["storage_bytes"].as_u64().unwrap();
    assert_eq!(status["max_storage_bytes"], ROOM, "{status}");
    assert_eq!(used, actor_disk_bytes(&dir), "{status}");
    // One writer at a time passes the bound only by its last turn's WAL
    // frames of pages it rewrote (the header page, the B-tree's inner
    // pages) and the frames' own headers: a few KiB.
    assert!(used <= ROOM + 16 * 1024, "{status}");
    assert!(used > ROOM - 64 * 1024, "{status}");

    // A new actor is refused by name and leaves no file; the actors that
    // exist read, rewrite their pages, and reuse what their deletes free.
    weir.get("/h/newcomer/hello")
        .await
        .assert_weir_error(507, "actor_storage_full");
    let r = weir
        .actor_receipt_where(|r| r["error"] == "actor_storage_full")
        .await;
    assert!(
        r["detail"]
            .as_str()
            .unwrap()
            .contains("max_actor_storage_bytes"),
        "{r}"
    );
    assert!(!dir.join("actors/hostile/newcomer.sqlite3").exists());
    let status = weir.admin_get("/actors").await.json()["status"].clone();
    // Both refusals of a new actor are counted (the fill's and this one).
    assert_eq!(status["refused_new"], 2, "{status}");
    assert_eq!(weir.get("/p/victim/incr").await.text(), "2");
    let r = exec(&weir, "r0", &["SELECT count(*) FROM t"]).await;
    assert_eq!(r[0]["rows"], json!([[10]]), "{r:?}");
    let r = exec(
        &weir,
        "r0",
        &["DELETE FROM t", &big, "SELECT count(*) FROM t"],
    )
    .await;
    assert_eq!(r[2]["rows"], json!([[10]]), "{r:?}");
    assert!(
        exec(&weir, "r1", &[&big]).await[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("database_full"))
    );

    // Deleting actors gives their bytes back: a newcomer is made, and
    // grows into them.
    let status = weir.admin_get("/actors").await.json()["status"].clone();
    let used = status["storage_bytes"].as_u64().unwrap();
    assert_eq!(used, actor_disk_bytes(&dir), "{status}");
    for name in ["r1", "r2"] {
        let r = weir
            .admin_send("DELETE", &format!("/actors/hostile/{name}"))
            .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let status = weir.admin_get("/actors").await.json()["status"].clone();
    let freed = used - status["storage_bytes"].as_u64().unwrap();
    assert!(freed > 400_000, "{status}");
    assert_eq!(status["storage_bytes"], actor_disk_bytes(&dir), "{status}");
    let r = exec(&weir, "newcomer", &["CREATE TABLE t (b)", &big]).await;
    assert!(r[1]["rows"].is_array(), "{r:?}");

    // After a restart the room is counted again from the disk, to the
    // byte, and every actor still has its rows.
    drop(weir);
    let weir = start(&dir, &limits);
    let status = weir.admin_get("/actors").await.json()["status"].clone();
    assert_eq!(status["storage_bytes"], actor_disk_bytes(&dir), "{status}");
    for name in ["r0", "newcomer"] {
        let r = exec(&weir, name, &["SELECT count(*) FROM t"]).await;
        assert_eq!(r[0]["rows"], json!([[10]]), "{name}: {r:?}");
    }
    assert_eq!(weir.get("/p/victim/incr").await.text(), "3");
}
