//! A start without opening every actor's database, from outside: owners
//! of resident processes are found by their launch marks (a file beside
//! the database, made before the first journal row), and a data dir from
//! a build before the marks is searched once by opening each database,
//! and marked. (The timers of the actors on disk: `actor_timers.rs`.)

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::programs::{call, kill, push_image, serve_runner, wait_running};
use common::{Weir, guest};
use serde_json::Value;

fn data_dir(name: &str) -> PathBuf {
    weir_scratch::dir(&format!("marks-{name}"))
}

fn mark(data: &Path, owner: &str) -> PathBuf {
    data.join(format!("actors/runner/{owner}.sqlite3-launches"))
}

fn marks_kept(data: &Path) -> PathBuf {
    data.join("actors/.launch-marks")
}

async fn spawn(weir: &Weir, owner: &str, image: &str) -> u64 {
    let r = call(weir, "POST", &format!("/r/{owner}/spawn/{image}"), b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["pid"].as_u64().unwrap()
}

/// Waits until `path` is gone.
async fn until_gone(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while path.exists() {
        assert!(Instant::now() < deadline, "{} stayed", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_are_found_by_their_marks_and_an_older_data_dir_by_opening_each_database_once() {
    let data = data_dir("found");
    let weir = serve_runner(&data, &[]);
    let image = push_image(&weir, &guest("resident")).await;
    let pid = spawn(&weir, "owner", &image).await;
    // An owner that killed its process in a turn: no row, its mark kept.
    let gone = spawn(&weir, "quitter", &image).await;
    let r = call(&weir, "POST", &format!("/r/quitter/kill/{gone}"), b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Actors that never spawned anything have no mark.
    for i in 0..20 {
        let r = call(&weir, "POST", &format!("/r/plain{i}/count"), b"").await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(mark(&data, "owner").is_file());
    assert!(mark(&data, "quitter").is_file());
    assert!(!mark(&data, "plain0").exists());
    assert!(marks_kept(&data).is_file(), "a new data dir keeps marks");
    kill(weir);

    let weir = serve_runner(&data, &[]);
    let back = wait_running(&weir, 1).await;
    assert_eq!(back[0]["owner"]["name"], "owner");
    let first = back[0]["pid"].as_u64().unwrap();
    assert!(first > pid, "re-driven under a new pid: {first}");
    // The owner whose journal was empty is unmarked, with no recovery.
    until_gone(&mark(&data, "quitter")).await;
    assert!(mark(&data, "owner").is_file(), "its process runs");
    let recovered = weir
        .first_logged("weir::process", |r| r["outcome"] == "recovered")
        .await;
    assert_eq!(recovered["name"], "owner");
    let told: Vec<Value> = weir
        .logged("weir::process")
        .into_iter()
        .filter(|r| r["outcome"] == "recovered" || r["outcome"] == "lost")
        .collect();
    assert_eq!(told.len(), 1, "nothing of the quitter: {told:?}");
    kill(weir);

    // A data dir as a build before the marks left it: no mark, and no
    // record that they are kept. Its owners are found all the same.
    std::fs::remove_file(mark(&data, "owner")).unwrap();
    std::fs::remove_file(marks_kept(&data)).unwrap();
    let weir = serve_runner(&data, &[]);
    let back = wait_running(&weir, 1).await;
    assert_eq!(back[0]["owner"]["name"], "owner");
    assert!(back[0]["pid"].as_u64().unwrap() > first, "re-driven again");
    assert!(mark(&data, "owner").is_file(), "marked as it was found");
    assert!(marks_kept(&data).is_file());
    assert!(!mark(&data, "plain0").exists());
    kill(weir);

    // A database the search cannot open may hold rows: the search is not
    // recorded as done, and the next start searches again.
    std::fs::remove_file(marks_kept(&data)).unwrap();
    let broken = data.join("actors/runner/broken.sqlite3");
    std::fs::write(&broken, vec![0xA5u8; 8192]).unwrap();
    let weir = serve_runner(&data, &[]);
    wait_running(&weir, 1).await;
    assert!(!marks_kept(&data).exists());
    kill(weir);
    std::fs::remove_file(&broken).unwrap();
    let weir = serve_runner(&data, &[]);
    wait_running(&weir, 1).await;
    assert!(marks_kept(&data).is_file());
    kill(weir);
    let _ = std::fs::remove_dir_all(&data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_owner_leaves_no_mark() {
    let data = data_dir("deleted");
    let weir = serve_runner(&data, &[]);
    let image = push_image(&weir, &guest("resident")).await;
    spawn(&weir, "owner", &image).await;
    assert!(mark(&data, "owner").is_file());
    let r = weir.admin_send("DELETE", "/actors/runner/owner").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!mark(&data, "owner").exists(), "gone with its database");
    kill(weir);
    let weir = serve_runner(&data, &[]);
    assert_eq!(wait_running(&weir, 0).await.len(), 0);
    kill(weir);
    let _ = std::fs::remove_dir_all(&data);
}

/// What a build from before the marks does to a data dir it starts on: it
/// takes the lock, writing its pid alone into the lock file, and its
/// owners' first journal rows get no mark.
fn as_an_older_build_left_it(data: &Path, owner: &str) {
    std::fs::write(data.join("weir.lock"), "4242\n").unwrap();
    std::fs::remove_file(mark(data, owner)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_of_an_older_build_in_between_is_noticed_and_its_unmarked_owners_found() {
    let data = data_dir("older-between");
    let weir = serve_runner(&data, &[]);
    let image = push_image(&weir, &guest("resident")).await;
    let pid = spawn(&weir, "owner", &image).await;
    kill(weir);
    let kept = std::fs::read_to_string(marks_kept(&data)).unwrap();
    let lock = std::fs::read_to_string(data.join("weir.lock")).unwrap();
    let nonce = kept
        .lines()
        .find_map(|l| l.strip_prefix("nonce "))
        .expect("the marks file names its nonce");
    assert!(
        lock.lines()
            .skip(1)
            .any(|l| l == format!("launch-marks actors {nonce}")),
        "the lock file stamps it: {lock}"
    );

    // Back to an older build and forward again: the marks file is still
    // there, but the stamp is gone, so every database is searched.
    as_an_older_build_left_it(&data, "owner");
    let weir = serve_runner(&data, &[]);
    let back = wait_running(&weir, 1).await;
    assert_eq!(back[0]["owner"]["name"], "owner");
    assert!(back[0]["pid"].as_u64().unwrap() > pid, "re-driven");
    assert!(mark(&data, "owner").is_file(), "marked as it was found");
    let renewed = std::fs::read_to_string(marks_kept(&data)).unwrap();
    assert_ne!(renewed, kept, "a new nonce");
    kill(weir);

    // Without that, a missing mark is trusted: nothing opens the owner's
    // database, and its rows wait (the older build's caveat this closes).
    std::fs::remove_file(mark(&data, "owner")).unwrap();
    let weir = serve_runner(&data, &[]);
    // A turn of the owner runs after any recovery of it (which holds it).
    let r = call(&weir, "POST", "/r/owner/count", b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(wait_running(&weir, 0).await.len(), 0);
    kill(weir);
    let _ = std::fs::remove_dir_all(&data);
}
