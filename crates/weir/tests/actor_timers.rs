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
    // Room for a two-second turn.
    let weir = start(&dir, &["--limit", "event_limit_ms=5000"]);
    let r = post(
        &weir,
        "/probe/brief/schedule?reason=late&in_ms=1000",
        Vec::new(),
    )
    .await;
    assert_eq!(r.status, 200);
    // A turn holds the actor past the alarm's deadline; the deletion
    // queues behind it first (sent once the turn holds the actor, well
    // before the alarm is due), then the alarm's delivery, due meanwhile.
    let sleeping = {
        let weir_addr = weir.addr;
        tokio::spawn(async move {
            common::send_to(
                weir_addr,
                http::Request::post("/probe/brief/sleep?ms=2000")
                    .header("host", weir_addr.to_string())
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap(),
            )
            .await
        })
    };
    weir.first_logged("weir::guest", |r| {
        r["name"] == "brief" && r["line"] == "sleeping 2000 ms"
    })
    .await;
    let r = weir.admin_send("DELETE", "/actors/probe/brief").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["deleted"], true);
    assert_eq!(sleeping.await.unwrap().status, 200);
    // The delivery that waited found its actor gone: no alarm ran, and
    // nothing of that name exists again (looked at once a timer due
    // after it fired elsewhere).
    after_a_later_timer(&weir, 300).await;
    weir.log_flushed("/probe/flush/get?key=x").await;
    assert!(
        weir.actor_receipts()
            .iter()
            .all(|r| !(r["name"] == "brief" && r["turn"] == "alarm")),
        "{:#?}",
        weir.actor_receipts()
    );
    let r = weir.admin_get("/actors/probe/brief").await;
    assert_eq!(r.status, 404, "{:?}", r.body);
    // Listed: only the marker's actor.
    let listed = weir.admin_get("/actors/probe").await.json();
    let names: Vec<&str> = listed["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert!(
        !names.contains(&"brief")
            && names
                .iter()
                .all(|n| n.starts_with("marker") || *n == "flush"),
        "{listed}"
    );
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
    // Every timer fires, once: counted again after a later timer fired.
    for i in (0..200).step_by(4) {
        wait_log(&weir, &format!("a{i}"), |l| !l.is_empty()).await;
    }
    after_a_later_timer(&weir, 500).await;
    for i in (0..200).step_by(4) {
        let log = alarm_log(&weir, &format!("a{i}")).await;
        assert_eq!(log.len(), 1, "a{i}: {log:?}");
        assert!(log[0].starts_with("tick@"), "a{i}: {log:?}");
    }
    assert_eq!(alarm_log(&weir, "a1").await.len(), 0, "no timer, no alarm");
}

/// `/probe/NAME/get?key=K` as text (the actor's own counters).
async fn value(weir: &common::Weir, actor: &str, key: &str) -> String {
    weir.get(&format!("/probe/{actor}/get?key={key}"))
        .await
        .text()
}

#[tokio::test]
async fn an_alarm_that_calls_out_and_then_fails_is_delivered_again_until_it_succeeds() {
    let dir = data_dir("callout");
    let upstream = common::HoldServer::start(Some(1));
    let allow = format!("http://127.0.0.1:{}", upstream.port);
    let weir = start(&dir, &["--allow-outbound", &allow]);
    // Its first run counts itself, calls out (a commit point: the count
    // and the timer's taking are committed there), then fails.
    let r = post(
        &weir,
        &format!("/probe/co/callout?port={}&for_ms=1500", upstream.port),
        Vec::new(),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let failed = weir
        .actor_receipt_where(|r| r["name"] == "co" && r["reason"] == "callout")
        .await;
    assert_eq!(failed["outcome"], "retrying", "{failed}");
    assert_eq!(failed["attempt"], 1, "{failed}");
    let timers = inspect(&weir, "co").await["timers"].clone();
    assert_eq!(timers.as_array().unwrap().len(), 1, "{timers}");
    assert_eq!(timers[0]["reason"], "callout", "{timers}");
    assert_eq!(timers[0]["attempt"], 1, "{timers}");
    // Retried after its backoff, it succeeds: delivered until then.
    let log = wait_log(&weir, "co", |l| l.iter().any(|e| e.starts_with("callout@"))).await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(value(&weir, "co", "callout-runs").await, "2");
    weir.actor_receipt_where(|r| {
        r["name"] == "co" && r["reason"] == "callout" && r["outcome"] == "ok"
    })
    .await;
    assert!(
        inspect(&weir, "co").await["timers"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alarm_cut_by_sigkill_after_its_call_out_is_delivered_after_the_restart() {
    use std::io::Read;

    let dir = data_dir("callout-kill");
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = upstream.local_addr().unwrap().port();
    let allow = format!("http://127.0.0.1:{port}");
    let weir = start(&dir, &["--allow-outbound", &allow]);
    // The moment the alarm's call out arrives, the server is killed: the
    // turn's commit point has made the timer's taking durable.
    let pid = weir.pid();
    let killer = std::thread::spawn(move || {
        let (mut stream, _) = upstream.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut head = [0u8; 1024];
        let n = stream.read(&mut head).unwrap();
        assert!(String::from_utf8_lossy(&head[..n]).starts_with("GET / HTTP/1.1"));
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
        upstream
    });
    let r = post(
        &weir,
        &format!("/probe/ck/callout?port={port}&for_ms=0"),
        Vec::new(),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let upstream = tokio::task::spawn_blocking(move || killer.join().unwrap())
        .await
        .unwrap();
    let mut weir = weir;
    assert!(weir.wait_exit(Duration::from_secs(10)).is_some(), "killed");
    drop(weir);
    // The call out answers from now on.
    std::thread::spawn(move || {
        for stream in upstream.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut head = [0u8; 1024];
            let _ = stream.read(&mut head);
            let _ = std::io::Write::write_all(
                &mut stream,
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
            );
        }
    });
    let weir = start(&dir, &["--allow-outbound", &allow]);
    let log = wait_log(&weir, "ck", |l| l.iter().any(|e| e.starts_with("callout@"))).await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(
        value(&weir, "ck", "callout-runs").await,
        "2",
        "its first run was cut, its second delivered"
    );
}

#[tokio::test]
async fn a_timer_an_earlier_handler_cancels_or_moves_does_not_fire_in_the_same_dispatch() {
    let dir = data_dir("dispatch-rule");
    let weir = start(&dir, &[]);
    // Both due when the dispatch reads its due set; the first handler
    // cancels the second's timer: it does not fire.
    let r = post(&weir, "/probe/dc/dispatch?first=cancels-victim", Vec::new()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    weir.actor_receipt_where(|r| {
        r["name"] == "dc" && r["reason"] == "cancels-victim" && r["outcome"] == "ok"
    })
    .await;
    // Moved an hour later: it does not fire now, and its new timer stays.
    let r = post(&weir, "/probe/dm/dispatch?first=moves-victim", Vec::new()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    weir.actor_receipt_where(|r| {
        r["name"] == "dm" && r["reason"] == "moves-victim" && r["outcome"] == "ok"
    })
    .await;
    tokio::time::sleep(common::SETTLE).await;
    assert_eq!(alarm_log(&weir, "dc").await, ["cancels-victim"]);
    assert_eq!(alarm_log(&weir, "dm").await, ["moves-victim"]);
    assert!(
        weir.actor_receipts()
            .iter()
            .all(|r| r["reason"] != "victim"),
        "{:#?}",
        weir.actor_receipts()
    );
    assert!(
        inspect(&weir, "dc").await["timers"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let timers = inspect(&weir, "dm").await["timers"].clone();
    assert_eq!(timers.as_array().unwrap().len(), 1, "{timers}");
    assert_eq!(timers[0]["reason"], "victim", "{timers}");
    assert!(
        timers[0]["at_ms"].as_u64().unwrap() > now_ms() + 3_500_000,
        "{timers}"
    );
}

#[tokio::test]
async fn an_alarm_turn_whose_commit_fails_is_dispatched_again_later_and_its_actors_timers_fire() {
    let dir = data_dir("commit-fails");
    let weir = start(&dir, &[]);
    // Its commit fails for 1.5 s: the actor is reset each time, and its
    // timers (that one and a `tick` due 50 ms later) stay as they were.
    let r = post(&weir, "/probe/cf/commit-fails?for_ms=1500", Vec::new()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let failed = weir
        .actor_receipt_where(|r| r["name"] == "cf" && r["reason"] == "commit-fails")
        .await;
    assert_eq!(failed["outcome"], "failed", "{failed}");
    assert_eq!(failed["error"], "storage_commit_failed", "{failed}");
    // Dispatched again later, both fire once the commit goes through.
    wait_log(&weir, "cf", |l| l.len() == 2).await;
    after_a_later_timer(&weir, 500).await;
    let log = alarm_log(&weir, "cf").await;
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(log[0].starts_with("commit-fails@"), "{log:?}");
    assert!(log[1].starts_with("tick@"), "{log:?}");
    // Later each time: a failure that repeats does not spin.
    let failures: Vec<serde_json::Value> = weir
        .actor_receipts()
        .into_iter()
        .filter(|r| r["name"] == "cf" && r["outcome"] == "failed")
        .collect();
    assert!(
        (1..=3).contains(&failures.len()),
        "{} failed dispatches in 1.5 s: {failures:#?}",
        failures.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarms_that_call_out_and_fail_are_delivered_until_they_succeed_across_sigkill_cycles() {
    const ACTORS: usize = 6;
    let dir = data_dir("callout-soak");
    let upstream = common::HoldServer::start(Some(1));
    let allow = format!("http://127.0.0.1:{}", upstream.port);
    let names: Vec<String> = (0..ACTORS).map(|i| format!("s{i}")).collect();
    // Each alarm calls out (a commit point) and then fails for 5 s: its
    // runs fall at 0, 2 and 6 s, whatever the kills between them.
    let weir = start(&dir, &["--allow-outbound", &allow]);
    for name in &names {
        let r = post(
            &weir,
            &format!("/probe/{name}/callout?port={}&for_ms=5000", upstream.port),
            Vec::new(),
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    // SIGKILL at uneven moments, many times, across those runs.
    let mut weir = weir;
    for cycle in 0..12u64 {
        tokio::time::sleep(Duration::from_millis(300 + (cycle * 397) % 900)).await;
        weir.signal("KILL");
        assert!(weir.wait_exit(Duration::from_secs(10)).is_some());
        drop(weir);
        weir = start(&dir, &["--allow-outbound", &allow]);
    }
    // Every alarm is delivered until it succeeds, once (counted again
    // after a later timer fired).
    for name in &names {
        wait_log(&weir, name, |l| l.iter().any(|e| e.starts_with("callout@"))).await;
    }
    after_a_later_timer(&weir, 500).await;
    for name in &names {
        let log = alarm_log(&weir, name).await;
        assert_eq!(log.len(), 1, "{name}: {log:?}");
        let runs: u64 = value(&weir, name, "callout-runs").await.parse().unwrap();
        assert!(
            runs >= 2,
            "{name} ran {runs} times: its failures were retried"
        );
        assert!(
            inspect(&weir, name).await["timers"]
                .as_array()
                .unwrap()
                .is_empty(),
            "{name}"
        );
    }
}
