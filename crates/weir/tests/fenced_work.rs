//! Fenced work from outside: resident processes survive `SIGKILL` of the
//! server through their owners' launch journals, and a graceful stop ends
//! them with a receipt each and brings them back at the next start. A durable app comes back
//! under a new pid with no request arriving; a re-drive cut short by
//! another `SIGKILL` is abandoned loudly, never run twice; many kill
//! cycles start the program exactly once per cycle and lose nothing; a
//! held owner delays no other actor's timers. (What the journals' images
//! are kept against: `journaled_images.rs`.)

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::programs::{
    call, kill, push_image, running, serve_runner, serve_runner_with, spawn_slow_redrive,
    spawn_slowly, starts, wait_running,
};
use common::{Weir, guest};
use serde_json::Value;

fn data_dir(name: &str) -> PathBuf {
    weir_scratch::dir(&format!("fenced-{name}"))
}

fn serve(data: &Path, limits: &[&str]) -> Weir {
    serve_runner(data, limits)
}

async fn push(weir: &Weir, component: &Path) -> String {
    push_image(weir, component).await
}

/// The launch journal of `owner` of the `runner` class, as an operator's
/// inspection shows it.
async fn launches_of(weir: &Weir, owner: &str) -> Vec<Value> {
    let r = weir.admin_get(&format!("/actors/runner/{owner}")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["launches"].as_array().unwrap().clone()
}

/// The owner's journal rows (pid, attempt), read from its database with
/// the server stopped.
fn journal(data: &Path, owner: &str) -> Vec<(u64, u32)> {
    let db =
        rusqlite::Connection::open(data.join(format!("actors/runner/{owner}.sqlite3"))).unwrap();
    let mut stmt = db
        .prepare("SELECT pid, attempt FROM _weir_journal ORDER BY pid")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Spawns `image` for owner `owner` over its durable slot `app`: the pid.
async fn spawn_durable(weir: &Weir, image: &str) -> u64 {
    let spawned = call(
        weir,
        "POST",
        &format!("/r/owner/spawn/{image}?slot=app&durable=1"),
        b"",
    )
    .await;
    assert_eq!(spawned.status, 200, "{}", spawned.text());
    spawned.json()["pid"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_a_durable_app_is_back_under_a_new_pid_without_a_request() {
    let data = data_dir("back");
    let weir = serve(&data, &[]);
    let image = push(&weir, &guest("resident")).await;
    let pid = spawn_durable(&weir, &image).await;
    assert_eq!(pid, 1_000_001);
    call(
        &weir,
        "PUT",
        &format!("/r/owner/proc/{pid}/files/notes.txt"),
        b"written before the crash",
    )
    .await;
    let reported = call(
        &weir,
        "POST",
        &format!("/r/other/spawn/{image}?on_crash=report"),
        b"",
    )
    .await;
    assert_eq!(reported.status, 200);
    // An operator sees what a restart would bring back.
    let launches = launches_of(&weir, "owner").await;
    assert_eq!(launches.len(), 1, "{launches:?}");
    assert_eq!(
        (launches[0]["pid"].as_u64(), launches[0]["attempt"].as_u64()),
        (Some(pid), Some(0))
    );
    assert_eq!(launches[0]["spec"]["image"], image.as_str());
    assert_eq!(
        launches[0]["spec"]["storage"],
        serde_json::json!(["app", true])
    );
    assert_eq!(launches[0]["spec"]["on_crash"], "restart_once");
    kill(weir);
    assert_eq!(
        journal(&data, "owner"),
        [(pid, 0)],
        "a row for the running process"
    );

    let weir = serve(&data, &[]);
    let back = wait_running(&weir, 1).await;
    let new_pid = back[0]["pid"].as_u64().unwrap();
    assert!(
        new_pid > 2_000_000,
        "a pid of the owner's new incarnation: {new_pid}"
    );
    assert_eq!(
        back[0]["owner"]["name"], "owner",
        "the report-on-crash one stayed down"
    );
    assert_eq!(
        starts(&data),
        2,
        "started once, then once again after the crash"
    );
    let lost = weir
        .first_logged("weir::process", |r| r["outcome"] == "lost")
        .await;
    assert_eq!(
        (lost["name"].as_str(), lost["old_pid"].as_u64()),
        (Some("other"), Some(1_000_001))
    );
    assert_eq!(lost["detail"], "its on_crash is report");
    let recovered = weir
        .first_logged("weir::process", |r| r["outcome"] == "recovered")
        .await;
    assert_eq!(recovered["old_pid"], pid);
    assert_eq!(recovered["new_pid"], new_pid);
    let launches = launches_of(&weir, "owner").await;
    assert_eq!(launches.len(), 1, "{launches:?}");
    assert_eq!(launches[0]["pid"].as_u64(), Some(new_pid));
    assert_eq!(
        launches_of(&weir, "other").await,
        Vec::<Value>::new(),
        "the lost one's row is gone"
    );

    // Its slot still holds what it wrote; its owner reaches it.
    let read = call(
        &weir,
        "GET",
        &format!("/r/owner/proc/{new_pid}/files/notes.txt"),
        b"",
    )
    .await;
    assert_eq!(read.text(), "written before the crash");
    kill(weir);
    assert_eq!(
        journal(&data, "owner"),
        [(new_pid, 0)],
        "the row names the new pid, its re-drive settled"
    );
    assert_eq!(journal(&data, "other"), [], "the lost one's row is gone");
    let _ = std::fs::remove_dir_all(&data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_ends_each_process_with_a_receipt_and_the_next_start_brings_it_back() {
    let data = data_dir("graceful");
    let mut weir = serve(&data, &[]);
    let image = push(&weir, &guest("resident")).await;
    let pid = spawn_durable(&weir, &image).await;
    weir.signal("TERM");
    assert!(weir.wait_exit(Duration::from_secs(30)).is_some());
    // It ended with the server, and said so: not killed, not failed.
    let ended = weir
        .first_logged("weir::process", |r| r["message"] == "process")
        .await;
    assert_eq!(ended["pid"], pid, "{ended}");
    assert_eq!(ended["outcome"], "stopped", "{ended}");
    assert_eq!(
        ended["detail"],
        "stopped: the server shut down; its launch is kept for the server's next start"
    );
    assert_eq!(journal(&data, "owner"), [(pid, 0)], "its launch is kept");
    // The next start brings it back, over its slot, before any request.
    let weir = serve(&data, &[]);
    let back = wait_running(&weir, 1).await;
    let new_pid = back[0]["pid"].as_u64().unwrap();
    assert!(new_pid > 2_000_000, "{new_pid}");
    let recovered = weir
        .first_logged("weir::process", |r| r["outcome"] == "recovered")
        .await;
    assert_eq!(recovered["old_pid"], pid);
    assert_eq!(recovered["new_pid"], new_pid);
    assert_eq!(starts(&data), 2, "started once, then once with the server");
    kill(weir);
    let _ = std::fs::remove_dir_all(&data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_during_a_spawn_answers_it_and_then_stops_the_process_with_a_receipt() {
    let data = data_dir("graceful-boot");
    let mut weir = serve(&data, &["event_limit_ms=10000"]);
    let image = push(&weir, &guest("resident")).await;
    // A spawn whose start takes 3 s, in flight when the stop begins.
    let spawning = spawn_slowly(&weir, &data, &image).await;
    weir.signal("TERM");
    // The request in flight is answered: its process started.
    let spawned = spawning.await.unwrap();
    assert_eq!(spawned.status, 200, "{}", spawned.text());
    let pid = spawned.json()["pid"].as_u64().unwrap();
    // Then it ends with the server, with its receipt, its launch kept.
    assert!(weir.wait_exit(Duration::from_secs(30)).is_some());
    let ended = weir
        .first_logged("weir::process", |r| r["message"] == "process")
        .await;
    assert_eq!(
        (ended["pid"].as_u64(), ended["outcome"].as_str()),
        (Some(pid), Some("stopped"))
    );
    assert_eq!(journal(&data, "owner"), [(pid, 0)]);
    let _ = std::fs::remove_dir_all(&data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_during_the_re_drive_abandons_the_launch_loudly_not_twice() {
    let data = data_dir("redrive");
    // The re-drive's start sleeps 3 s: room to kill the server during it.
    let limits = ["event_limit_ms=10000"];
    let weir = serve(&data, &limits);
    let image = push(&weir, &guest("resident")).await;
    spawn_slow_redrive(&weir, &image).await;
    kill(weir);
    assert_eq!(starts(&data), 1);

    let weir = serve(&data, &limits);
    let deadline = Instant::now() + Duration::from_secs(30);
    while starts(&data) < 2 {
        assert!(Instant::now() < deadline, "the re-drive did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    kill(weir);
    let rows = journal(&data, "owner");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(
        rows[0].0 > 2_000_000 && rows[0].1 == 1,
        "the re-drive was spent before it ran: {rows:?}"
    );

    let weir = serve(&data, &limits);
    let lost = weir
        .first_logged("weir::process", |r| r["outcome"] == "lost")
        .await;
    assert_eq!(lost["old_pid"], rows[0].0);
    assert_eq!(
        lost["detail"],
        "it was re-driven once already and did not come back"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(running(&weir).await.len(), 0, "not started again");
    assert_eq!(starts(&data), 2, "no third start");
    kill(weir);
    assert_eq!(journal(&data, "owner"), [], "abandoned, and its row gone");
    let _ = std::fs::remove_dir_all(&data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_kill_cycles_start_the_program_once_each_and_lose_nothing() {
    let cycles: usize = std::env::var("WEIR_KILL_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50);
    let data = data_dir("cycles");
    let weir = serve(&data, &[]);
    let image = push(&weir, &guest("resident")).await;
    let mut weir = weir;
    let mut pids = vec![spawn_durable(&weir, &image).await];
    for cycle in 1..=cycles {
        kill(weir);
        weir = serve(&data, &[]);
        let back = wait_running(&weir, 1).await;
        let pid = back[0]["pid"].as_u64().unwrap();
        assert!(
            pid > *pids.last().unwrap(),
            "cycle {cycle}: a new pid each time"
        );
        pids.push(pid);
        assert_eq!(
            starts(&data),
            cycle + 1,
            "cycle {cycle}: exactly one start per cycle"
        );
    }
    let last = *pids.last().unwrap();
    let answer = call(&weir, "GET", &format!("/r/owner/proc/{last}/starts"), b"").await;
    assert_eq!(answer.json()["starts"], 1, "the last one booted once");
    kill(weir);
    assert_eq!(journal(&data, "owner"), [(last, 0)]);
    let _ = std::fs::remove_dir_all(&data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_that_cannot_be_written_refuses_the_spawn_and_nothing_starts() {
    let data = data_dir("journal-fails");
    let weir = serve(&data, &[]);
    let image = push(&weir, &guest("resident")).await;
    // The owner's turn holds a broken deferred foreign key: the commit that
    // would make the journal row durable fails.
    // The spawn is refused with that cause, and since the turn's writes
    // cannot commit, the turn cannot answer either: the owner is reset.
    let refused = call(
        &weir,
        "POST",
        &format!("/r/owner/broken-spawn/{image}"),
        b"",
    )
    .await;
    refused.assert_weir_error(503, "storage_commit_failed");
    let turn = weir
        .actor_receipt_where(|r| r["error"] == "storage_commit_failed")
        .await;
    assert!(
        turn["detail"]
            .as_str()
            .unwrap()
            .contains("FOREIGN KEY constraint failed"),
        "{turn}"
    );
    assert_eq!(running(&weir).await.len(), 0, "nothing runs");
    let status = weir.status().await;
    assert_eq!(status["processes"]["slots"], 0, "its slot was given back");
    // The actor itself goes on: its turn was rolled back, not its future.
    let fresh = call(&weir, "POST", &format!("/r/owner/spawn/{image}"), b"").await;
    assert_eq!(fresh.status, 200, "{}", fresh.text());
    kill(weir);
    let rows = journal(&data, "owner");
    assert_eq!(
        rows.len(),
        1,
        "only the spawn that started has a row: {rows:?}"
    );
    let _ = std::fs::remove_dir_all(&data);
}

/// `weir serve --config` with the runner as app and class `runner` (at
/// /r), whose secret `token` is read from `token.txt` beside the config,
/// and the same component as class `plain` (at /p), which has no secrets.
fn serve_with_secret(data: &Path) -> Weir {
    let runner = guest("runner");
    let config = data.join("weir.toml");
    std::fs::create_dir_all(data).unwrap();
    std::fs::write(
        &config,
        format!(
            "app = {runner:?}\n\n[actors.runner]\ncomponent = {runner:?}\nroute = \"/r\"\n\n[actors.runner.secrets]\ntoken = {{ file = \"token.txt\" }}\n\n[actors.plain]\ncomponent = {runner:?}\nroute = \"/p\"\n"
        ),
    )
    .unwrap();
    Weir::start_with(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ])
}

/// Reads `owner`'s process `pid`'s stdout until it holds `want` (at most
/// 30 s).
async fn output_until(weir: &Weir, owner: &str, pid: u64, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let read = call(
            weir,
            "GET",
            &format!("/r/{owner}/output/{pid}?offset=0&timeout=1000"),
            b"",
        )
        .await;
        let text = read.json()["data"].as_str().unwrap_or_default().to_string();
        if text.contains(want) {
            return text;
        }
        assert!(Instant::now() < deadline, "no `{want}` in {text:?}");
    }
}

/// The files under `data` holding `needle`, as bytes anywhere in them.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_holding(&path, needle));
        } else if path.file_name().is_some_and(|n| n != "token.txt")
            && std::fs::read(&path)
                .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
        {
            found.push(path);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifetime_launches_recover_by_their_on_crash_with_secrets_re_resolved_and_owners_told() {
    let data = data_dir("secrets");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("token.txt"), "first-secret\n").unwrap();
    let weir = serve_with_secret(&data);
    let image = push(&weir, &guest("cmdprobe")).await;
    let spawn = |owner: &'static str, query: &'static str| {
        let (weir, image) = (&weir, &image);
        async move {
            call(
                weir,
                "POST",
                &format!("/r/{owner}/spawn/{image}?contract=lifetime&arg=hold&{query}"),
                b"",
            )
            .await
        }
    };
    let kept = spawn(
        "owner",
        "secret=TOKEN=token&on_crash=restart_once&slot=app&durable=1",
    )
    .await;
    assert_eq!(kept.status, 200, "{}", kept.text());
    let pid = kept.json()["pid"].as_u64().unwrap();
    output_until(&weir, "owner", pid, "env TOKEN=first-secret\n").await;
    // A secret the class does not have: refused, and nothing starts.
    let missing = spawn("owner", "secret=X=missing").await;
    assert_eq!(missing.status, 500, "{}", missing.text());
    assert_eq!(
        missing.json()["message"],
        "secret `missing` is not configured for actor class `runner`"
    );
    // Nor can another class name this class's secret.
    let foreign = call(
        &weir,
        "POST",
        &format!("/p/x/spawn/{image}?contract=lifetime&arg=hold&secret=TOKEN=token"),
        b"",
    )
    .await;
    assert_eq!(foreign.status, 500, "{}", foreign.text());
    assert_eq!(
        foreign.json()["message"],
        "secret `token` is not configured for actor class `plain`"
    );
    // A lifetime launch reports a crash unless it asks for a restart.
    let reported = spawn("other", "").await;
    assert_eq!(reported.status, 200, "{}", reported.text());
    assert_eq!(running(&weir).await.len(), 2);
    kill(weir);
    assert_eq!(journal(&data, "owner"), [(pid, 0)]);
    assert_eq!(journal(&data, "other"), [(1_000_001, 0)]);
    assert_eq!(
        files_holding(&data, b"first-secret"),
        Vec::<PathBuf>::new(),
        "the secret's value is in no file Weir wrote"
    );
    assert_eq!(
        files_holding(&data, br#"["TOKEN","token"]"#).len(),
        1,
        "its name is journaled"
    );

    // The operator rotates the secret; the re-drive reads it anew.
    std::fs::write(data.join("token.txt"), "second-secret\n").unwrap();
    let weir = serve_with_secret(&data);
    let back = wait_running(&weir, 1).await;
    let new_pid = back[0]["pid"].as_u64().unwrap();
    assert_eq!(back[0]["owner"]["name"], "owner");
    assert_eq!(back[0]["contract"], "lifetime");
    output_until(&weir, "owner", new_pid, "env TOKEN=second-secret\n").await;
    let slot_starts = files_holding(&data.join("slots"), b"start\n");
    assert_eq!(slot_starts.len(), 1, "{slot_starts:?}");
    assert_eq!(
        std::fs::read_to_string(&slot_starts[0]).unwrap(),
        "start\nstart\n",
        "run once, then once again after the crash"
    );

    // Each owner heard what recovery did, in a turn of its own.
    let told = call(&weir, "GET", "/r/owner/recovered", b"").await.json();
    assert_eq!(
        told,
        serde_json::json!([{ "old": pid, "new": new_pid, "outcome": "restarted" }])
    );
    let told = call(&weir, "GET", "/r/other/recovered", b"").await.json();
    assert_eq!(
        told,
        serde_json::json!([{ "old": 1_000_001, "new": null, "outcome": "lost: its on_crash is report" }])
    );
    let turns = weir.actor_receipts_where(2, |r| r["turn"] == "call").await;
    for turn in &turns {
        assert_eq!(turn["reason"], "weir:process/supervisor@0.1.0#recovered");
        assert_eq!(turn["outcome"], "ok", "{turn}");
    }
    kill(weir);
    assert_eq!(journal(&data, "owner"), [(new_pid, 0)]);
    assert_eq!(journal(&data, "other"), []);
    let _ = std::fs::remove_dir_all(&data);
}

/// The runner (at /r) and the actor-probe as class `timers` (at /t),
/// which the timer pass reads after the runner's actors.
fn serve_with_timers(data: &Path, limits: &[&str]) -> Weir {
    let timers = format!("timers={}", guest("actor_probe").display());
    serve_runner_with(
        data,
        limits,
        &["--actor", &timers, "--actor-route", "timers=/t"],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_under_recovery_delays_no_other_actors_timer() {
    let data = data_dir("pass-recovery");
    let limits = ["event_limit_ms=10000"];
    let weir = serve_with_timers(&data, &limits);
    let image = push(&weir, &guest("resident")).await;
    // Its re-drive's start sleeps 3 s: the owner is held that long by its
    // recovery after the next start.
    spawn_slow_redrive(&weir, &image).await;
    let r = call(&weir, "POST", "/t/x/schedule?reason=tick&in_ms=300", b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    kill(weir);

    // The pass comes to the held owner first, and reads it last: the
    // timer fires while the owner's recovery still runs.
    let weir = serve_with_timers(&data, &limits);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = call(&weir, "GET", "/t/x/log", b"").await;
        assert_eq!(r.status, 200, "{}", r.text());
        let log: Vec<String> = serde_json::from_value(r.json()).unwrap();
        if !log.is_empty() {
            assert!(log[0].starts_with("tick@"), "{log:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the timer did not fire");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let recovered = |weir: &Weir| {
        weir.logged("weir::process")
            .into_iter()
            .any(|r| r["outcome"] == "recovered")
    };
    assert!(!recovered(&weir), "fired before the owner's recovery ended");
    let status = weir.status_after_timer_pass().await;
    assert_eq!(status["actors"]["timer_pass"]["read"], 2, "{status}");
    weir.first_logged("weir::process", |r| r["outcome"] == "recovered")
        .await;
    assert_eq!(wait_running(&weir, 1).await[0]["image"], image.as_str());
    kill(weir);
    let _ = std::fs::remove_dir_all(&data);
}

/// The pids of `owner`'s processes running on `weir`.
async fn running_of(weir: &Weir, owner: &str) -> Vec<u64> {
    running(weir)
        .await
        .iter()
        .filter(|p| p["owner"]["name"] == owner)
        .map(|p| p["pid"].as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawn_cut_at_its_deadline_mid_boot_leaves_no_launch_running_nowhere() {
    let data = data_dir("cut-boot");
    let weir = serve(&data, &[]);
    let image = push(&weir, &guest("resident")).await;
    // Each boot outlasts its turn (an ephemeral slot is new each time, so
    // every start of `slow-first` is a first): the turn ends at its
    // deadline with the launch row written and no process up. Where the
    // boot's own deadline wins, the spawn deletes its row in the turn;
    // where the turn's wins, the spawn is cut, and its launch is owed.
    const OWNERS: usize = 6;
    for i in 0..OWNERS {
        let r = call(
            &weir,
            "POST",
            &format!("/r/cut{i}/spawn/{image}?slot=scratch&start=slow-first"),
            b"",
        )
        .await;
        r.assert_weir_error(503, "event_deadline_exceeded");
    }
    // With no call and no restart, every owner's journal comes to name
    // exactly what runs: a cut launch is re-driven once, by the rules of
    // a crash (here its re-drive outlasts its deadline too, and it is
    // lost, loudly), and its owner is told; a deleted one runs nowhere.
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..OWNERS {
        let owner = format!("cut{i}");
        loop {
            let launches: Vec<u64> = launches_of(&weir, &owner)
                .await
                .iter()
                .map(|l| l["pid"].as_u64().unwrap())
                .collect();
            let runs = running_of(&weir, &owner).await;
            if launches == runs {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{owner} journals {launches:?} and runs {runs:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let cut: Vec<Value> = weir
        .logged("weir_programs::process_host")
        .into_iter()
        .filter(|r| {
            r["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("a spawn ended before its process was up"))
        })
        .collect();
    println!(
        "{OWNERS} spawns cut at their deadline: {} mid-launch, the rest deleted in their turn",
        cut.len()
    );
    let recoveries = loop {
        let recoveries: Vec<Value> = weir
            .logged("weir::process")
            .into_iter()
            .filter(|r| r["message"] == "recovery")
            .collect();
        if recoveries.len() >= cut.len() {
            break recoveries;
        }
        assert!(Instant::now() < deadline, "{recoveries:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for c in &cut {
        let owner = c["owner"].as_str().unwrap().trim_start_matches("runner/");
        let recovery = recoveries
            .iter()
            .find(|r| r["name"] == owner)
            .unwrap_or_else(|| panic!("{owner} was not re-driven: {recoveries:#?}"));
        assert_eq!(recovery["old_pid"], c["pid"], "{recovery}");
        let told = loop {
            let told = call(&weir, "GET", &format!("/r/{owner}/recovered"), b"")
                .await
                .json();
            if told.as_array().is_some_and(|t| !t.is_empty()) {
                break told;
            }
            assert!(Instant::now() < deadline, "{owner} was not told: {told}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(told.as_array().unwrap().len(), 1, "{told}");
        assert_eq!(told[0]["old"], c["pid"], "{told}");
    }
    // Once each: a moment later nothing more was re-driven, and what runs
    // is what was re-driven and came up.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let recoveries: Vec<Value> = weir
        .logged("weir::process")
        .into_iter()
        .filter(|r| r["message"] == "recovery")
        .collect();
    assert_eq!(recoveries.len(), cut.len(), "{recoveries:#?}");
    let runs = running(&weir).await;
    assert_eq!(
        runs.len(),
        recoveries
            .iter()
            .filter(|r| r["outcome"] == "recovered")
            .count(),
        "{runs:?}"
    );
}
