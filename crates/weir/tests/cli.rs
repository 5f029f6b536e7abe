//! The command line: refused configurations, refused components, the admin
//! endpoints, and `weir build`.

mod common;

use common::{Weir, probe, root, run_weir, run_weir_with_env};

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = weir_scratch::dir(&format!("cli-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn out_of_range_and_unknown_limits_are_usage_errors() {
    let app = probe();
    let app = app.to_str().unwrap();
    for (limit, needle) in [
        (
            "retirement_admission_limit=0",
            "limit `retirement_admission_limit` must be an integer from 1 to 96, got `0`",
        ),
        (
            "retirement_admission_limit=97",
            "limit `retirement_admission_limit` must be an integer from 1 to 96, got `97`",
        ),
        (
            "max_concurrent=0",
            "limit `max_concurrent` must be an integer from 1 to 1024, got `0`",
        ),
        ("max_bogus=3", "unknown limit `max_bogus`"),
        ("max_concurrent", "is not of the form NAME=VALUE"),
    ] {
        let out = run_weir(&["serve", app, "--limit", limit]);
        assert_eq!(out.code, Some(2), "{limit}: {}", out.stderr);
        assert!(out.stderr.contains(needle), "{limit}: {}", out.stderr);
        assert_eq!(
            out.stderr.lines().count(),
            1,
            "one clear line: {}",
            out.stderr
        );
    }
}

#[tokio::test]
async fn worker_threads_follow_tokio_worker_threads_and_a_bad_value_is_a_usage_error() {
    let app = probe();
    let app = app.to_str().unwrap();
    for bad in ["0", "two", ""] {
        let out = run_weir_with_env(&["serve", app], &[("TOKIO_WORKER_THREADS", bad)]);
        assert_eq!(out.code, Some(2), "{bad:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(&format!(
                "TOKIO_WORKER_THREADS must be a whole number of worker threads, at least 1 (got {bad:?})"
            )),
            "{bad:?}: {}",
            out.stderr
        );
        assert_eq!(
            out.stderr.lines().count(),
            1,
            "one clear line: {}",
            out.stderr
        );
    }
    for n in [1, 3] {
        let weir = Weir::start_with_env(&[app], &[("TOKIO_WORKER_THREADS", &n.to_string())]);
        assert_eq!(
            weir.status().await["worker_threads"],
            n,
            "TOKIO_WORKER_THREADS={n}"
        );
        assert_eq!(weir.get("/counter").await.status, 200);
    }
}

#[test]
fn config_file_limits_apply_and_unknown_keys_are_refused() {
    let dir = tempdir("config");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[limits]\nmax_concurrent = 0\n").unwrap();
    let out = run_weir(&[
        "serve",
        probe().to_str().unwrap(),
        "--config",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("max_concurrent"), "{}", out.stderr);

    let typo = dir.join("typo.toml");
    std::fs::write(&typo, "lisen = \"127.0.0.1:1\"\n").unwrap();
    let out = run_weir(&[
        "serve",
        probe().to_str().unwrap(),
        "--config",
        typo.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("lisen"), "{}", out.stderr);
}

#[tokio::test]
async fn config_file_sets_limits_and_the_command_line_overrides_them() {
    let dir = tempdir("config-ok");
    let file = dir.join("weir.toml");
    std::fs::write(
        &file,
        format!(
            "app = {:?}\nreceipt_headers = true\n[limits]\nmax_concurrent = 3\nretirement_admission_limit = 5\n",
            probe().to_str().unwrap()
        ),
    )
    .unwrap();
    let weir = Weir::start_with(&[
        "--config",
        file.to_str().unwrap(),
        "--limit",
        "max_concurrent=2",
    ]);
    let status = weir.status().await;
    assert_eq!(status["apps"][0]["lanes"].as_array().unwrap().len(), 2);
    let first = weir.get("/counter").await;
    for _ in 0..4 {
        weir.get("/counter").await;
    }
    let sixth = weir.get("/counter").await;
    assert_eq!(
        sixth.text(),
        "1",
        "retired after 5 events from the config file"
    );
    assert_ne!(sixth.generation(), first.generation());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while weir.status().await["apps"][0]["generations"]["retired"] != 1 {
        assert!(std::time::Instant::now() < deadline, "no retirement");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[test]
fn paths_in_a_config_file_are_named_from_its_directory_without_dot_dots() {
    use std::io::BufRead;
    let dir = tempdir("config-paths");
    std::fs::create_dir_all(dir.join("conf")).unwrap();
    std::fs::copy(probe(), dir.join("app.wasm")).unwrap();
    std::fs::write(
        dir.join("conf/weir.toml"),
        "app = \"../app.wasm\"\ndata_dir = \"./../data\"\nadmin = \"127.0.0.1:0\"\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    // Reached through `..`, its own paths going up: what the server names
    // is where the system finds it.
    let roundabout = dir.join("conf/../conf/weir.toml");
    let mut child = common::weir_command()
        .arg("serve")
        .arg("--config")
        .arg(&roundabout)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = Vec::new();
    for line in std::io::BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let serving = line.starts_with("weir: serving ");
        said.push(line);
        if serving {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let said = said.join("\n");
    let dir = std::fs::canonicalize(&dir).unwrap();
    let token = dir.join("data/admin-token");
    assert!(
        said.contains(&format!("(token in {})", token.display())),
        "{said}"
    );
    assert!(token.exists(), "the token is where the line says");
    assert!(
        said.contains(&format!(
            "weir: serving {} on",
            dir.join("app.wasm").display()
        )),
        "{said}"
    );
}

#[test]
fn a_component_with_a_missing_import_is_refused_at_start() {
    let dir = tempdir("link");
    let path = dir.join("missing.wasm");
    let bytes = wat::parse_str(
        r#"(component (import "weir:missing/thing" (instance (export "f" (func)))))"#,
    )
    .unwrap();
    std::fs::write(&path, bytes).unwrap();
    let out = run_weir(&["serve", path.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("cannot be linked"), "{}", out.stderr);
    assert!(out.stderr.contains("weir:missing/thing"), "{}", out.stderr);

    let path = dir.join("empty.wasm");
    std::fs::write(&path, wat::parse_str("(component)").unwrap()).unwrap();
    let out = run_weir(&["serve", path.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr
            .contains("does not export wasi:http/incoming-handler"),
        "{}",
        out.stderr
    );

    let path = dir.join("core.wasm");
    std::fs::write(&path, wat::parse_str("(module)").unwrap()).unwrap();
    let out = run_weir(&["serve", path.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("not a component"), "{}", out.stderr);

    let out = run_weir(&["serve", "/nonexistent/app.wasm"]);
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("does not exist"), "{}", out.stderr);
}

#[test]
fn a_memory_limit_below_the_initial_memory_is_refused_at_start() {
    let out = run_weir(&[
        "serve",
        probe().to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--limit",
        "memory_limit_bytes=65536",
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("exceeds the limit"), "{}", out.stderr);
    assert!(
        out.stderr.contains("memory_limit_bytes is 65536"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn admin_endpoints_report_lanes_generations_and_metrics() {
    let weir = Weir::start(&probe(), &["--limit", "max_concurrent=2"]);
    assert_eq!(weir.get("/hello").await.status, 200);
    weir.get("/trap").await;
    let health = weir.admin_get("/healthz").await;
    assert_eq!(health.status, 200);
    let status = weir.status().await;
    let app = &status["apps"][0];
    assert_eq!(app["healthy"], true);
    // Lane 0 ran both events (the trap abandoned generation 1 for 2);
    // lane 1 was never needed, so it has no generation yet.
    assert_eq!(app["generations"]["created"], 2);
    assert_eq!(app["generations"]["abandoned"], 1);
    let lanes: Vec<_> = app["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["state"].clone(), l["generation"].as_u64().unwrap()))
        .collect();
    assert_eq!(lanes, [("idle".into(), 2), ("idle".into(), 0)], "{status}");
    let metrics = weir.admin_get("/metrics").await.text();
    assert!(
        metrics.contains("weir_events_total{app=\"probe\",outcome=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("weir_events_total{app=\"probe\",outcome=\"trap\"} 1"));
    assert!(metrics.contains("weir_generations_total{app=\"probe\",event=\"abandoned\"} 1"));
    assert!(metrics.contains("weir_queue_depth{app=\"probe\"} 0"));
    assert!(metrics.contains("weir_event_duration_seconds_bucket"));
}

#[tokio::test]
async fn build_produces_a_checked_component() {
    let out_dir = tempdir("build");
    let manifest = root().join("guests/Cargo.toml");
    let out = run_weir(&[
        "build",
        "--manifest",
        manifest.to_str().unwrap(),
        "--package",
        "hello",
        "--out-dir",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("weir: built"), "{}", out.stderr);
    // What it built serves.
    let weir = Weir::start(&out_dir.join("hello.wasm"), &[]);
    assert_eq!(weir.get("/").await.text(), "hello from weir\n");

    // A workspace of several guests and no --package has several artifacts:
    // the error names how many, and each one.
    let out = run_weir(&[
        "build",
        "--manifest",
        manifest.to_str().unwrap(),
        "--out-dir",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("expected exactly one .wasm artifact, found "),
        "{}",
        out.stderr
    );
}

#[test]
fn a_missing_command_is_a_usage_error_naming_the_commands_in_one_line() {
    let out = run_weir(&[]);
    assert_eq!(out.code, Some(2));
    assert_eq!(
        out.stderr.trim(),
        "weir: `weir` needs one of its commands: serve, build, actors, run, images, processes, apps, deploy (see `weir --help`)"
    );
    let out = run_weir(&["actors"]);
    assert_eq!(out.code, Some(2));
    assert_eq!(
        out.stderr.trim(),
        "weir: `weir actors` needs one of its commands: list, inspect, delete (see `weir actors --help`)"
    );
    let out = run_weir(&["apps", "--admin", "127.0.0.1:1"]);
    assert_eq!(out.code, Some(2));
    assert_eq!(
        out.stderr.trim(),
        "weir: `weir apps` needs one of its commands: list (see `weir apps --help`)"
    );
}

#[test]
fn build_usage_errors_exit_2_with_one_line() {
    let out = run_weir(&["build", "--manifest", "/nonexistent/Cargo.toml"]);
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr
            .contains("manifest /nonexistent/Cargo.toml does not exist")
    );
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);

    let out = run_weir(&["build", "--out-dir", "a", "--out-dir", "b"]);
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("--out-dir"), "{}", out.stderr);
    assert!(
        out.stderr.contains("cannot be used multiple times"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);

    let out = run_weir(&["build", "--bogus"]);
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("--bogus"), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);

    let out = run_weir(&[
        "serve",
        "--listen",
        "127.0.0.1:1",
        "--listen",
        "127.0.0.1:2",
    ]);
    assert_eq!(out.code, Some(2));
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);

    let help = run_weir(&["build", "--help"]);
    assert_eq!(help.code, Some(0));
}

#[tokio::test]
async fn serving_a_guest_crate_directory_builds_it_first() {
    let weir = Weir::start(&root().join("guests/hello"), &[]);
    let resp = weir.get("/").await;
    assert_eq!(resp.text(), "hello from weir\n");
}

/// `guests/wat/flaky-start.wat` whose instantiation fails in
/// [fail_from, fail_until) (Unix seconds) and whose handler holds its lane
/// for half a second.
fn flaky_start(name: &str, fail_from: u64, fail_until: u64) -> std::path::PathBuf {
    let wat = std::fs::read_to_string(root().join("guests/wat/flaky-start.wat"))
        .unwrap()
        .replace("FAIL_FROM", &fail_from.to_string())
        .replace("FAIL_UNTIL", &fail_until.to_string())
        .replace("HOLD_MS", "500")
        .replace("START_MS", "0");
    let path = tempdir(name).join("flaky.wasm");
    std::fs::write(&path, wat::parse_str(&wat).unwrap()).unwrap();
    path
}

#[tokio::test]
async fn a_lane_whose_first_generation_cannot_be_made_answers_503_host_unavailable() {
    let fail_from = unix_now() + 3;
    let fail_until = fail_from + 3;
    let path = flaky_start("flaky-cold", fail_from, fail_until);
    let weir = Weir::start(
        &path,
        &[
            "--limit",
            "max_concurrent=2",
            "--limit",
            "retirement_admission_limit=1",
        ],
    );
    // Only lane 0 was instantiated at start.
    let status = weir.status().await;
    let generations: Vec<_> = status["apps"][0]["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["state"].clone(), l["generation"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        generations,
        [("idle".into(), 1), ("idle".into(), 0)],
        "{status}"
    );
    assert_eq!(status["apps"][0]["generations"]["created"], 1);
    while unix_now() < fail_from {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Lane 0 serves, retires its generation and cannot replace it.
    weir.get("/")
        .await
        .assert_weir_error(502, "invalid_response");
    weir.wait_health(503).await;
    // Lane 1 is needed for the first time, and its generation cannot be made.
    weir.get("/")
        .await
        .assert_weir_error(503, "host_unavailable");
    let receipt = weir
        .receipt_where(|r| r["error"] == "host_unavailable")
        .await;
    assert_eq!(receipt["lane"], 1, "{receipt}");
    assert!(receipt["generation"].is_null(), "no guest ran: {receipt}");
    // Both lanes come back by themselves once instantiation works again.
    while unix_now() < fail_until {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    weir.wait_health(200).await;
    weir.get("/")
        .await
        .assert_weir_error(502, "invalid_response");
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn a_lane_that_cannot_instantiate_is_unavailable_and_the_others_serve() {
    // Instantiation fails from 5 s to 8 s from now (time enough for every
    // lane to start first, even on a loaded machine) and works outside that.
    let fail_from = unix_now() + 5;
    let fail_until = fail_from + 3;
    let path = flaky_start("flaky", fail_from, fail_until);
    let weir = Weir::start(
        &path,
        &[
            "--limit",
            "max_concurrent=3",
            "--limit",
            "retirement_admission_limit=1",
        ],
    );
    assert_eq!(weir.admin_get("/healthz").await.status, 200);
    // Lanes get their first generation when first needed: three requests
    // at once (each holds its lane for half a second) give every lane a
    // live one before the window opens.
    let (a, b, c) = tokio::join!(weir.get("/"), weir.get("/"), weir.get("/"));
    for warm in [a, b, c] {
        warm.assert_weir_error(502, "invalid_response");
    }
    // Each answered event retires its generation (the limit is 1); the
    // replacements are made after the answers, so wait for them.
    common::wait_for("every lane idle on a live generation", || async {
        let status = weir.status().await;
        let lanes = status["apps"][0]["lanes"].as_array().unwrap().clone();
        let live = lanes
            .iter()
            .all(|l| l["state"] == "idle" && l["generation"].as_u64().unwrap() >= 1);
        if live {
            Ok(())
        } else {
            Err(status.to_string())
        }
    })
    .await;
    while unix_now() < fail_from {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // This event retires its generation; the replacement cannot be made.
    weir.get("/")
        .await
        .assert_weir_error(502, "invalid_response");
    weir.wait_health(503).await;
    let status = weir.status().await;
    let lanes = status["apps"][0]["lanes"].as_array().unwrap().clone();
    let down: Vec<_> = lanes
        .iter()
        .filter(|l| l["state"] == "unavailable")
        .collect();
    assert_eq!(down.len(), 1, "{status}");
    assert_eq!(status["apps"][0]["healthy"], false);
    assert!(
        status["apps"][0]["generations"]["instantiation_failed"]
            .as_u64()
            .unwrap()
            >= 1
    );
    // The app keeps serving on its other lanes: the guest runs there.
    weir.get("/")
        .await
        .assert_weir_error(502, "invalid_response");
    let served = weir
        .receipt_where(|r| r["generation"].is_u64() && r["lane"] != down[0]["lane"])
        .await;
    assert_eq!(served["error"], "invalid_response");
    // Once instantiation works again, the lanes come back by themselves.
    while unix_now() < fail_until {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    weir.wait_health(200).await;
    weir.get("/")
        .await
        .assert_weir_error(502, "invalid_response");
}

#[tokio::test]
async fn compiled_code_is_cached_in_the_data_dir_reused_repaired_and_pruned() {
    let data = common::fresh_data_dir();
    let data_arg = data.to_str().unwrap().to_string();
    let code = data.join("code");
    let artifacts = || {
        let mut found: Vec<_> = std::fs::read_dir(&code)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        found.sort();
        found
    };
    // Serves once; returns what the code cache said it did.
    let serve_once = |app: std::path::PathBuf| {
        let data_arg = data_arg.clone();
        async move {
            let weir = Weir::start(&app, &["--data-dir", &data_arg]);
            assert_eq!(weir.get("/hello").await.status, 200);
            // Log lines go out in order: once the event's receipt is
            // there, so is everything logged at start.
            weir.receipt_where(|_| true).await;
            let said: Vec<String> = weir
                .logged("weir_runtime::compiled_code")
                .iter()
                .map(|l| l["message"].as_str().unwrap_or_default().to_string())
                .collect();
            said
        }
    };
    assert_eq!(serve_once(probe()).await, ["compiled"]);
    let first = artifacts();
    assert_eq!(first.len(), 1, "one artifact for one component: {first:?}");
    let compiled = std::fs::read(&first[0]).unwrap();
    let written = std::fs::metadata(&first[0]).unwrap().modified().unwrap();

    // A restart loads the artifact instead of compiling again.
    assert_eq!(serve_once(probe()).await, ["loaded compiled code"]);
    assert_eq!(artifacts(), first);
    assert_eq!(
        std::fs::metadata(&first[0]).unwrap().modified().unwrap(),
        written,
        "the artifact was not written again"
    );

    // A damaged artifact is compiled again, and the app serves.
    std::fs::write(&first[0], b"not machine code").unwrap();
    assert_eq!(
        serve_once(probe()).await,
        [
            "compiled artifact does not load; compiling again",
            "compiled"
        ]
    );
    assert_eq!(artifacts(), first);
    assert_eq!(std::fs::read(&first[0]).unwrap(), compiled);

    // Serving another component prunes the artifact no longer served.
    assert_eq!(serve_once(common::guest("hostile")).await, ["compiled"]);
    let second = artifacts();
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first);

    // Code that compiles but cannot be kept (here its temporary file's
    // name is taken by a directory; a full disk is the usual cause) stops
    // the start, and the message says it is the cache, not the component,
    // and says the cause once.
    std::fs::remove_file(&second[0]).unwrap();
    let blocked = second[0].with_extension("cwasm.partial");
    std::fs::create_dir(&blocked).unwrap();
    let hostile = common::guest("hostile");
    let out = common::run_weir(&[
        "serve",
        hostile.to_str().unwrap(),
        "--data-dir",
        &data_arg,
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let said = out.stderr.trim();
    let cause = format!("cannot write {}", second[0].display());
    assert!(
        said.starts_with(&format!(
            "weir: {}: its compiled code cannot be kept: {cause}: ",
            hostile.display()
        )),
        "{said}"
    );
    assert_eq!(said.matches(&cause).count(), 1, "{said}");
    assert!(!said.contains("does not compile"), "{said}");
    assert_eq!(said.lines().count(), 1, "{said}");
    // Once the cause is gone, the same component compiles and serves.
    std::fs::remove_dir(&blocked).unwrap();
    assert_eq!(serve_once(hostile).await, ["compiled"]);
    assert_eq!(artifacts(), second);
}

#[tokio::test]
async fn a_start_that_fails_names_its_cause_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = run_weir(&["serve", probe().to_str().unwrap(), "--listen", &addr]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let said = out.stderr.trim();
    assert!(
        said.starts_with(&format!("weir: cannot listen on {addr}: ")),
        "{said}"
    );
    // The operating system's words, once: "Address already in use (os
    // error 98)" (a walk of the error's chain used to say them twice).
    let os = said.rsplit(": ").next().unwrap();
    assert!(os.contains("(os error"), "{said}");
    assert_eq!(said.matches(os).count(), 1, "{said}");
}

#[test]
fn the_version_names_the_cluster_call_versions_it_speaks() {
    let out = common::output_within(
        common::weir_command().arg("--version"),
        common::EXITS_WITHIN,
    );
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!(
            "weir {} ({}; {})",
            env!("CARGO_PKG_VERSION"),
            weir_cluster::call_versions::VERSIONS_SPOKEN,
            weir_cluster::socket_relay::RELAYS_SPOKEN
        )
    );
}
