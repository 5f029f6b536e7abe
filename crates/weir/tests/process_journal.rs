//! The launch journal and pids under failure, from outside, on one
//! machine: a real `weir serve` whose actor class `runner` spawns the
//! `resident` server and the `cmdprobe` command. Pids never repeat for an
//! owner, even while a re-drive under a newer incarnation runs beside its
//! live instance; a process its owner saw end by itself, or killed in a
//! turn that was then cut, is not started again after a crash; and a
//! launch owed a take-over keeps its image from a sweep.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::programs::{admin, call, kill, push_image, running, serve_runner};
use common::strace::Strace;
use common::{Weir, guest};
use serde_json::Value;

fn data_dir(name: &str) -> PathBuf {
    weir_scratch::dir(&format!("journal-{name}"))
}

/// The owners a spawn left owed a take-over (cut at its deadline after
/// its launch row was written), as the server logged them.
fn owed(weir: &Weir) -> BTreeSet<String> {
    weir.logged("weir_programs::process_host")
        .into_iter()
        .filter(|r| {
            r["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("a spawn ended before its process was up"))
        })
        .filter_map(|r| {
            r["owner"]
                .as_str()
                .map(|o| o.trim_start_matches("runner/").to_string())
        })
        .collect()
}

/// The recovery receipt of `owner`'s re-drive, once it is written.
async fn recovery(weir: &Weir, owner: &str) -> Value {
    weir.first_logged("weir::process", |r| {
        r["message"] == "recovery" && r["name"] == owner
    })
    .await
}

/// The recovery receipts written so far.
fn recoveries(weir: &Weir) -> Vec<Value> {
    weir.logged("weir::process")
        .into_iter()
        .filter(|r| r["message"] == "recovery")
        .collect()
}

/// `owner`'s launches, as an operator's inspection shows them.
async fn launches(weir: &Weir, owner: &str) -> Vec<Value> {
    let r = weir.admin_get(&format!("/actors/runner/{owner}")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["launches"].as_array().unwrap().clone()
}

/// How often a command started over its owner's durable slot `app`
/// (`cmdprobe` counts each start in `/data/starts`).
fn command_starts(data: &std::path::Path) -> usize {
    let owners = std::fs::read_dir(data.join("slots/durable/runner")).unwrap();
    owners
        .flatten()
        .filter_map(|o| std::fs::read_to_string(o.path().join("app/starts")).ok())
        .map(|text| text.lines().count())
        .sum()
}

async fn spawned_pid(weir: &Weir, path: &str) -> u64 {
    let r = call(weir, "POST", path, b"").await;
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()["pid"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pids_never_repeat_while_a_re_drive_runs_beside_the_owners_live_instance() {
    let data = data_dir("pids");
    let weir = serve_runner(&data, &[]);
    let image = push_image(&weir, &guest("resident")).await;
    // Whether a spawn cut at its deadline leaves its launch owed (the
    // turn's deadline came first) or deletes its row (the boot's did) is
    // a race: rounds go on until some owner was owed.
    let mut checked = 0;
    for round in 0..6 {
        let owners: Vec<String> = (0..4).map(|i| format!("p{round}x{i}")).collect();
        let mut first = std::collections::BTreeMap::new();
        for owner in &owners {
            // Its boot outlasts its turn: cut, its launch perhaps owed.
            let r = call(
                &weir,
                "POST",
                &format!("/r/{owner}/spawn/{image}?slot=scratch&start=slow-first"),
                b"",
            )
            .await;
            r.assert_weir_error(503, "event_deadline_exceeded");
            // At once, on the owner's next instance, before any take-over.
            first.insert(
                owner.clone(),
                spawned_pid(&weir, &format!("/r/{owner}/spawn/{image}")).await,
            );
        }
        tokio::time::sleep(common::SETTLE).await;
        let owed = owed(&weir);
        for owner in owners.iter().filter(|o| owed.contains(*o)) {
            // The take-over re-drives the cut launch under a newer
            // incarnation, beside the live one.
            let recovered = recovery(&weir, owner).await;
            let again = spawned_pid(&weir, &format!("/r/{owner}/spawn/{image}")).await;
            let mut pids = vec![first[owner], again];
            pids.extend(recovered["new_pid"].as_u64());
            let unique: BTreeSet<u64> = pids.iter().copied().collect();
            assert_eq!(
                unique.len(),
                pids.len(),
                "{owner} was given one pid twice: {pids:?} ({recovered})"
            );
            let listed = call(&weir, "GET", &format!("/r/{owner}/list"), b"")
                .await
                .json();
            let listed: Vec<u64> = listed
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["pid"].as_u64().unwrap())
                .collect();
            assert!(
                listed.contains(&first[owner]) && listed.contains(&again),
                "{owner}: both run, each under its own pid: {listed:?}"
            );
            checked += 1;
        }
        if checked > 0 {
            break;
        }
    }
    assert!(checked > 0, "no spawn was left owed: nothing was checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_its_owner_saw_end_by_itself_is_not_started_again_after_a_crash() {
    let data = data_dir("ended");
    // Turns long enough to wait for the process's end.
    let limits = ["event_limit_ms=10000"];
    let weir = serve_runner(&data, &limits);
    let command = push_image(&weir, &guest("cmdprobe")).await;
    let pid = spawned_pid(
        &weir,
        &format!(
            "/r/owner/spawn/{command}?contract=lifetime&arg=sleep-exit&arg=1500&slot=app&durable=1&on_crash=restart"
        ),
    )
    .await;
    // The owner's wait, traced: when it tells the owner that the process
    // exited, the process's launch row must already be deleted (a commit:
    // a write into the owner's WAL), or a crash right after the answer
    // runs again what the owner saw end.
    let strace = Strace::attach(&weir, "pwrite64,pwritev,write,writev,sendto", || async {
        let _ = call(&weir, "GET", "/", b"").await;
    })
    .await;
    let waited = call(
        &weir,
        "POST",
        &format!("/r/owner/wait/{pid}?timeout=8000"),
        b"",
    )
    .await;
    assert_eq!(waited.status, 200, "{}", waited.text());
    assert_eq!(waited.json()["exited"]["exit_code"], 0, "{}", waited.text());
    // The owner saw it exit 0: a crash now must not run it again.
    kill(weir);
    let lines = strace.finish();
    // The wait's answer is the last one (the trace's pokes were answered
    // 404, before it).
    let answered = lines
        .iter()
        .rposition(|l| l.contains("HTTP/1.1 200"))
        .unwrap_or_else(|| panic!("no answer traced:\n{}", lines.join("\n")));
    assert!(
        lines[..answered]
            .iter()
            .any(|l| l.contains("runner/owner.sqlite3-wal>")),
        "the wait answered before the launch's deletion was committed:\n{}",
        lines[..=answered].join("\n")
    );
    let weir = serve_runner(&data, &limits);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        recoveries(&weir),
        Vec::<Value>::new(),
        "neither re-driven nor lost"
    );
    assert_eq!(command_starts(&data), 1, "started once");
    assert_eq!(launches(&weir, "owner").await, Vec::<Value>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_whose_turn_is_cut_still_deletes_the_launch() {
    let data = data_dir("kill-cut");
    let weir = serve_runner(&data, &["max_slot_bytes=1073741824"]);
    let image = push_image(&weir, &guest("resident")).await;
    let pid = spawned_pid(&weir, &format!("/r/k/spawn/{image}?slot=scratch")).await;
    // Its ephemeral slot holds thousands of files, which its end removes:
    // longer than what the kill's turn has left. Made 100 at a time, each
    // call well inside the default one-second deadline on a loaded machine
    // (500 at a time missed it under two busy-loop hogs).
    for round in 0..50 {
        let from = round * 100;
        let r = call(
            &weir,
            "POST",
            &format!("/r/k/proc/{pid}/fill?how=files&n=100&from={from}"),
            b"",
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["done"], 100, "{}", r.text());
    }
    assert_eq!(launches(&weir, "k").await.len(), 1);
    // The kill comes with 980 ms of its turn's second spent: the turn is
    // cut while the process ends.
    call(&weir, "POST", &format!("/r/k/kill/{pid}?after_ms=980"), b"")
        .await
        .assert_weir_error(503, "event_deadline_exceeded");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !running(&weir).await.is_empty() {
        assert!(Instant::now() < deadline, "the killed process never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        launches(&weir, "k").await,
        Vec::<Value>::new(),
        "its launch is gone"
    );
    // And a crash brings nothing back.
    kill(weir);
    let weir = serve_runner(&data, &["max_slot_bytes=1073741824"]);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(recoveries(&weir), Vec::<Value>::new());
    assert!(running(&weir).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_owed_a_take_over_keeps_its_image_from_a_sweep() {
    let data = data_dir("owed-root");
    let weir = serve_runner(&data, &[]);
    let mut checked = 0;
    for round in 0..6 {
        let mut swept = Vec::new();
        for i in 0..4 {
            // Pushed again each time: a sweep after a spawn that owes
            // nothing takes it, rightly.
            let image = push_image(&weir, &guest("resident")).await;
            let owner = format!("o{round}x{i}");
            let r = call(
                &weir,
                "POST",
                &format!("/r/{owner}/spawn/{image}?slot=scratch&start=slow-first"),
                b"",
            )
            .await;
            r.assert_weir_error(503, "event_deadline_exceeded");
            // A sweep at once, before any take-over.
            let report = admin(&weir, "POST", "/images/sweep", Vec::new(), true)
                .await
                .json();
            swept.push((owner, image, report));
        }
        tokio::time::sleep(common::SETTLE).await;
        let owed = owed(&weir);
        for (owner, image, report) in swept.iter().filter(|(o, _, _)| owed.contains(o)) {
            let removed: Vec<&str> = report["removed"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .collect();
            assert!(
                !removed.contains(&image.as_str()),
                "{owner}: the sweep removed what its owed take-over is about to start: {report}"
            );
            // Its take-over found the image (its start then outlasts its
            // deadline again, and it is lost for that, loudly).
            let recovered = recovery(&weir, owner).await;
            let detail = recovered["detail"].as_str().unwrap_or_default();
            assert!(
                !detail.contains("image") || detail.contains("start failed"),
                "{recovered}"
            );
            checked += 1;
        }
        if checked > 0 {
            return;
        }
    }
    panic!("no spawn was left owed: nothing was checked");
}
