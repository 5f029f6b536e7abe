//! Actor timers from outside: re-arming, due sets, retries with backoff,
//! waking a hibernated actor, surviving SIGKILL, and the timer pass that
//! indexes the timers of the actors on disk after a start.

mod common;

use std::time::Duration;

use common::actors::*;

#[tokio::test]
async fn timers_keep_the_earliest_rearm_by_return_and_run_due_sets_as_snapshots() {
    let dir = data_dir("timers");
    let weir = start(&dir, &[]);
    // Earliest wins per reason.
    let schedule = |actor: &'static str, query: &'static str| {
        let weir = &weir;
        async move {
            let r = post(
                weir,
                &format!("/probe/{actor}/schedule?{query}"),
                Vec::new(),
            )
            .await;
            assert_eq!(r.status, 200, "{actor} {query}: {:?}", r.body);
            r.text()
        }
    };
    schedule("a", "reason=tick&in_ms=60000").await;
    let early = schedule("a", "reason=tick&in_ms=300").await;
    schedule("a", "reason=tick&in_ms=90000").await;
    let timers = weir.get("/probe/a/timers").await.json();
    assert_eq!(timers.as_array().unwrap().len(), 1);
    assert_eq!(timers[0]["at_ms"].to_string(), early);
    let log = wait_log(&weir, "a", |l| !l.is_empty()).await;
    assert!(log[0].starts_with("tick@"));
    let fired: u64 = log[0]["tick@".len()..].parse().unwrap();
    assert!(
        fired >= early.parse::<u64>().unwrap(),
        "not before its time"
    );
    assert!(
        weir.get("/probe/a/timers")
            .await
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );

    // A handler re-arms by what it returns (three runs, then none).
    schedule("b", "reason=rearm&in_ms=0").await;
    let log = wait_log(&weir, "b", |l| l.len() == 3).await;
    assert_eq!(log, ["rearm#1", "rearm#2", "rearm#3"]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(alarm_log(&weir, "b").await.len(), 3);
    assert!(
        weir.get("/probe/b/timers")
            .await
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );

    // A handler that schedules its own reason for "now" runs again, but
    // in a later dispatch, not the one that ran it.
    schedule("c", "reason=self-now&in_ms=0").await;
    let log = wait_log(&weir, "c", |l| l.len() == 2).await;
    assert!(log[0].starts_with("self-now#1") && log[1].starts_with("self-now#2"));
    let receipts = weir
        .actor_receipts_where(2, |r| r["name"] == "c" && r["reason"] == "self-now")
        .await;
    assert_ne!(receipts[0]["dispatch"], receipts[1]["dispatch"]);

    // A reason without a handler is consumed and ignored.
    schedule("d", "reason=other&in_ms=0").await;
    weir.actor_receipt_where(|r| {
        r["name"] == "d" && r["reason"] == "other" && r["outcome"] == "ok"
    })
    .await;
    assert!(
        weir.get("/probe/d/timers")
            .await
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_failing_alarm_is_retried_with_backoff_then_dropped() {
    let dir = data_dir("retry");
    let mut weir = start(&dir, &[]);
    let asked = now_ms();
    post(&weir, "/probe/f/flaky?for_ms=1000", Vec::new()).await;
    let failed = weir
        .actor_receipt_where(|r| r["reason"] == "flaky" && r["outcome"] == "retrying")
        .await;
    assert_eq!(failed["attempt"], 1);
    assert_eq!(failed["error"], "instance_abandoned");
    let timer = &inspect(&weir, "f").await["timers"][0];
    assert_eq!(timer["reason"], "flaky");
    assert_eq!(timer["attempt"], 1);
    let retry_at = timer["at_ms"].as_u64().unwrap();
    assert!(retry_at >= asked + 2000, "first retry backs off 2 s");
    let log = wait_log(&weir, "f", |l| !l.is_empty()).await;
    let ran: u64 = log[0]["flaky@".len()..].parse().unwrap();
    assert!(ran >= retry_at);
    weir.actor_receipt_where(|r| r["reason"] == "flaky" && r["outcome"] == "ok")
        .await;

    // A timer on its last retry that fails again is dropped, with an
    // error receipt. (Six real retries take two minutes; the test starts
    // from the sixth by editing the stopped actor's database.)
    post(
        &weir,
        "/probe/f/schedule?reason=always-fails&in_ms=600000",
        Vec::new(),
    )
    .await;
    weir.signal("KILL");
    weir.wait_exit(Duration::from_secs(10));
    let db = rusqlite::Connection::open(dir.join("actors/probe/f.sqlite3")).unwrap();
    db.execute(
        "UPDATE _weir_timers SET attempt = 6, at_ms = ?1 WHERE reason = 'always-fails'",
        [now_ms() as i64],
    )
    .unwrap();
    drop(db);
    let weir = start(&dir, &[]);
    let dropped = weir
        .actor_receipt_where(|r| r["reason"] == "always-fails")
        .await;
    assert_eq!(dropped["outcome"], "dropped");
    assert_eq!(dropped["attempt"], 7);
    assert_eq!(dropped["error"], "invalid_response");
    assert!(
        dropped["detail"]
            .as_str()
            .unwrap()
            .contains("never succeeds")
    );
    assert!(
        inspect(&weir, "f").await["timers"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_hibernated_actor_is_woken_by_its_timer() {
    let dir = data_dir("wake");
    let weir = start(&dir, &["--limit", "actor_idle_ms=200"]);
    let first = incarnation(&weir, "sleeper").await;
    let r = post(
        &weir,
        "/probe/sleeper/schedule?reason=tick&in_ms=5000",
        Vec::new(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(is_live(&weir, "sleeper").await);
    // It hibernates with its timer pending...
    wait_hibernated(&weir, "sleeper").await;
    assert!(
        weir.actor_receipts().iter().all(|r| r["turn"] != "alarm"),
        "the timer fired before the actor hibernated; the test proves nothing"
    );
    // ...and the timer wakes it: a fresh incarnation runs the alarm.
    let r = weir
        .actor_receipt_where(|r| r["name"] == "sleeper" && r["reason"] == "tick")
        .await;
    assert_eq!(r["outcome"], "ok");
    assert_eq!(r["woke"], true, "the timer woke a hibernated actor");
    assert!(r["incarnation"].as_u64().unwrap() > first, "{r}");
    assert_eq!(alarm_log(&weir, "sleeper").await.len(), 1);
}

#[tokio::test]
async fn timers_survive_sigkill() {
    let dir = data_dir("killed");
    let weir = start(&dir, &["--limit", "actor_idle_ms=200"]);
    let r = post(
        &weir,
        "/probe/killed/schedule?reason=tick&in_ms=800",
        Vec::new(),
    )
    .await;
    assert_eq!(r.status, 200);
    weir.signal("KILL");
    drop(weir);
    // After the restart the timer fires, indexed by the timer pass.
    let weir = start(&dir, &["--limit", "actor_idle_ms=200"]);
    let woke = weir
        .actor_receipt_where(|r| r["name"] == "killed" && r["reason"] == "tick")
        .await;
    assert_eq!(woke["outcome"], "ok");
    assert_eq!(alarm_log(&weir, "killed").await.len(), 1);
    // In-memory state lives until hibernation.
    assert_eq!(
        post(&weir, "/probe/killed/memory", Vec::new()).await.text(),
        "1"
    );
    assert_eq!(
        post(&weir, "/probe/killed/memory", Vec::new()).await.text(),
        "2"
    );
    // Touched by the calls above; idle again after actor_idle_ms.
    wait_hibernated(&weir, "killed").await;
    assert_eq!(
        post(&weir, "/probe/killed/memory", Vec::new()).await.text(),
        "1",
        "woken with a fresh instance"
    );
    assert_eq!(alarm_log(&weir, "killed").await.len(), 1, "and its storage");
}

#[tokio::test]
async fn an_alarm_due_while_its_actor_is_deleted_does_not_bring_it_back() {
    let dir = data_dir("deleted-alarm");
    let weir = start(&dir, &[]);
    let r = post(
        &weir,
        "/probe/brief/schedule?reason=late&in_ms=300",
        Vec::new(),
    )
    .await;
    assert_eq!(r.status, 200);
    // A turn holds the actor past the alarm's deadline; the deletion
    // queues behind it first, then the alarm's delivery, due meanwhile.
    let sleeping = {
        let weir_addr = weir.addr;
        tokio::spawn(async move {
            common::send_to(
                weir_addr,
                http::Request::post("/probe/brief/sleep?ms=700")
                    .header("host", weir_addr.to_string())
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap(),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = weir.admin_send("DELETE", "/actors/probe/brief").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["deleted"], true);
    assert_eq!(sleeping.await.unwrap().status, 200);
    // The delivery that waited found its actor gone: no alarm ran, and
    // nothing of that name exists again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        weir.actor_receipts()
            .iter()
            .all(|r| !(r["name"] == "brief" && r["turn"] == "alarm")),
        "{:#?}",
        weir.actor_receipts()
    );
    let r = weir.admin_get("/actors/probe/brief").await;
    assert_eq!(r.status, 404, "{:?}", r.body);
    let listed = weir.admin_get("/actors/probe").await.json();
    assert_eq!(listed["actors"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timers_of_actors_on_disk_are_indexed_by_a_pass_after_the_start_and_fire() {
    let dir = data_dir("pass");
    let weir = start(&dir, &[]);
    // 200 actors on disk, every fourth with a timer.
    for i in 0..200 {
        let path = if i % 4 == 0 {
            format!("/probe/a{i}/schedule?reason=tick&in_ms=1500")
        } else {
            format!("/probe/a{i}/incr")
        };
        assert_eq!(post(&weir, &path, Vec::new()).await.status, 200, "{path}");
    }
    weir.signal("KILL");
    drop(weir);
    let weir = start(&dir, &[]);
    // Called while the pass may still run: served, its timer kept.
    assert_eq!(post(&weir, "/probe/a8/incr", Vec::new()).await.text(), "1");
    let status = weir.status_after_timer_pass().await;
    assert_eq!(status["actors"]["timer_pass"]["of"], 200, "{status}");
    assert_eq!(status["actors"]["timer_pass"]["read"], 200, "{status}");
    // Every timer fires, once.
    for i in (0..200).step_by(4) {
        let log = wait_log(&weir, &format!("a{i}"), |l| !l.is_empty()).await;
        assert_eq!(log.len(), 1, "a{i}: {log:?}");
        assert!(log[0].starts_with("tick@"), "a{i}: {log:?}");
    }
    assert_eq!(alarm_log(&weir, "a1").await.len(), 0, "no timer, no alarm");
}
