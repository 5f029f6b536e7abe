//! The images launch journals name, from outside: what a crash left in
//! the journals is owed work, so its images are kept against every way of
//! removing them. A sweep through the admin address spares what a booting
//! spawn and, at a start after a crash, what recovery is about to start
//! again; `weir images sweep`, `rm` and `list` on a stopped server's data
//! dir read the journals (only the marked databases), and with a server
//! running they are refused, naming it. A dry run removes nothing.

mod common;

use std::path::{Path, PathBuf};

use common::programs::{admin, call, kill, push_image, serve_runner, spawn_slowly, wait_running};
use common::{Weir, guest};

fn data_dir(name: &str) -> PathBuf {
    weir_scratch::dir(&format!("journaled-{name}"))
}

fn images(data: &Path, args: &[&str]) -> std::process::Output {
    common::output_within(
        common::weir_command()
            .arg("images")
            .args(args)
            .arg("--data-dir")
            .arg(data),
        common::EXITS_WITHIN,
    )
}

/// `POST path` (a sweep) through the admin address: its report.
async fn admin_sweep_at(weir: &Weir, path: &str) -> serde_json::Value {
    admin(weir, "POST", path, Vec::new(), true).await.json()
}

/// `POST /images/sweep` through the admin address: its report.
async fn admin_sweep(weir: &Weir) -> serde_json::Value {
    admin_sweep_at(weir, "/images/sweep").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_spares_what_a_booting_spawn_and_a_launch_journal_hold() {
    let data = data_dir("sweep");
    let weir = serve_runner(&data, &["event_limit_ms=10000"]);
    let image = push_image(&weir, &guest("resident")).await;
    let orphan = push_image(&weir, &guest("cmdprobe")).await;
    // A spawn whose start takes 3 s: swept while it boots.
    let spawning = spawn_slowly(&weir, &data, &image).await;
    // A dry run says what a sweep would remove, and removes nothing.
    let dry = admin_sweep_at(&weir, "/images/sweep?dry_run=1").await;
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert_eq!(dry["removed"], serde_json::json!([orphan]), "{dry}");
    assert!(dry["bytes_freed"].as_u64().unwrap() > 0, "{dry}");
    let swept = admin_sweep(&weir).await;
    assert_eq!(swept["dry_run"], false, "{swept}");
    assert_eq!(swept["removed"], serde_json::json!([orphan]), "{swept}");
    assert_eq!(swept["bytes_freed"], dry["bytes_freed"], "{swept}");
    assert_eq!(
        swept["rooted"],
        serde_json::json!([image]),
        "the booting spawn holds its image"
    );
    let spawned = spawning.await.unwrap();
    assert_eq!(spawned.status, 200, "{}", spawned.text());
    // A second process, of another image: after a crash it is re-driven
    // after the first, whose start takes 3 s again.
    let second = push_image(&weir, &guest("hello")).await;
    let r = call(&weir, "POST", &format!("/r/owner/spawn/{second}"), b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let mut journaled = [image.clone(), second.clone()];
    journaled.sort();

    // With the server running, the CLI does not sweep its store: it names
    // the server and where to sweep instead, and removes nothing.
    let pushed = images(&data, &["push", guest("cmdprobe").to_str().unwrap()]);
    assert!(
        pushed.status.success(),
        "the store is shared with a running server"
    );
    let orphan = String::from_utf8_lossy(&pushed.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let out = images(&data, &["sweep"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("is in use by another weir (pid {})", weir.pid()))
            && stderr.contains("sweep through its admin address instead (POST /images/sweep)"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing swept");

    // Down after a crash, the journal names the image: spared for recovery.
    // Only databases with a launch mark are opened: an unmarked file that
    // is not even a database is not read, while a marked one that cannot
    // be read stops the sweep, since what it names cannot be known.
    kill(weir);
    // Nor does `rm` remove what a journal names, with the others asked
    // for in the same command (all or nothing).
    let out = images(&data, &["rm", &orphan, &second]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "weir: image {second} is in use: the launch journal of actor runner/owner names it (the server's next start runs its process again); nothing was removed"
        )
    );
    assert!(out.stdout.is_empty(), "nothing removed");
    // The list says why.
    let listed = common::stdout_of(images(&data, &["list"]));
    for digest in &journaled {
        assert!(
            listed
                .lines()
                .any(|l| l.starts_with(digest.as_str())
                    && l.ends_with("  journaled by runner/owner")),
            "{listed}"
        );
    }
    let class_dir = data.join("actors").join("runner");
    let garbage = class_dir.join("garbage.sqlite3");
    std::fs::write(&garbage, b"not a database, and no launch mark").unwrap();
    let mark = class_dir.join("garbage.sqlite3-launches");
    std::fs::write(&mark, b"").unwrap();
    let out = images(&data, &["sweep"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("weir: cannot read the launch journal of actor runner/garbage: ")
            && stderr.trim_end().ends_with("; nothing was swept"),
        "the actor named as operators name it: {stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing swept");
    // The list still lists, and says what it cannot tell.
    let out = images(&data, &["list"]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(
            "weir: which images the launch journals name is not known: cannot read the launch journal of actor runner/garbage: "
        ),
        "{stderr}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        5,
        "header, 3 images, totals"
    );
    std::fs::remove_file(&mark).unwrap();
    let kept = format!(
        "{}  kept (a launch journal names it)\n{}  kept (a launch journal names it)\n",
        journaled[0], journaled[1]
    );
    let out = images(&data, &["sweep", "--dry-run"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{orphan}  would be removed\n{kept}")
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).ends_with("(nothing was removed)\n"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = images(&data, &["sweep"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout,
        format!("{orphan}  removed\n{kept}"),
        "the dry run kept it"
    );
    std::fs::remove_file(&garbage).unwrap();
    // Swept through the server the moment it serves: recovery holds both
    // images already, the second's while the first's start still runs.
    let weir = serve_runner(&data, &["event_limit_ms=10000"]);
    let swept = admin_sweep(&weir).await;
    assert_eq!(swept["removed"], serde_json::json!([]), "{swept}");
    assert_eq!(swept["rooted"], serde_json::json!(journaled), "{swept}");
    let mut running: Vec<String> = wait_running(&weir, 2)
        .await
        .iter()
        .map(|p| p["image"].as_str().unwrap().to_string())
        .collect();
    running.sort();
    assert_eq!(running, journaled, "both came back");
    kill(weir);
    let _ = std::fs::remove_dir_all(&data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_sweep_and_rm_read_the_journals_of_every_declared_app() {
    use common::apps::{app_section, config_file, toml_path};

    let data = data_dir("apps");
    let runner = guest("runner");
    // An app declared as `[apps.jobs]` keeps its actors under
    // `apps/jobs/actors`, not `actors`.
    let config = config_file(
        "journaled-apps",
        &(app_section("jobs", &runner, &["/"], "")
            + &format!(
                "[apps.jobs.actors.runner]\ncomponent = {}\nroute = \"/r\"\n",
                toml_path(&runner)
            )),
    );
    let weir = Weir::start_with(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    let image = push_image(&weir, &guest("resident")).await;
    let r = call(&weir, "POST", &format!("/r/owner/spawn/{image}"), b"").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(data.join("apps/jobs/actors/runner").is_dir());
    // Down after a crash, its journal names the image: kept.
    kill(weir);
    let out = images(&data, &["sweep"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{image}  kept (a launch journal names it)\n")
    );
    let out = images(&data, &["rm", &image]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("the launch journal of actor runner/owner names it"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And the next start finds it to run again.
    let weir = Weir::start_with(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    let running = wait_running(&weir, 1).await;
    assert_eq!(running[0]["image"], image.as_str());
    kill(weir);
    let _ = std::fs::remove_dir_all(&data);
}
