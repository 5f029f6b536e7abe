//! `weir run` from outside: real command components, their arguments,
//! environment, stdin, output and exit code; each limit provoked; the doors
//! a command must not open; and `programs.run` from an actor. The image
//! store is `tests/images.rs`'s.

mod common;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::programs::{
    admin, call, cmdprobe, data_dir, push as push_offline, serve_runner, weir_in as weir,
};
use common::{guest, weir_command};

#[test]
fn a_command_gets_its_arguments_its_environment_and_nothing_of_weirs() {
    let data = data_dir("args");
    let ran = weir(
        &data,
        &[
            "run",
            "--env",
            "GREETING=hi there",
            "--env",
            "EMPTY=",
            &cmdprobe(),
            "--",
            "args",
            "two words",
            "--not-a-weir-flag",
        ],
        b"",
    );
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(
        ran.out(),
        "arg cmdprobe.wasm\narg args\narg two words\narg --not-a-weir-flag\n\
         env EMPTY=\nenv GREETING=hi there\n",
        "argv[0] is the program's name; the environment is exactly what --env gave \
         (WEIR_TEST_SECRET, set for weir itself, is not in it)"
    );
    assert_eq!(ran.stderr, "", "nothing of Weir's own on a clean run");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn stdin_reaches_the_command_and_its_output_comes_back_byte_for_byte() {
    let data = data_dir("cat");
    let input: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let ran = weir(&data, &["run", &cmdprobe(), "--", "cat"], &input);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert!(
        ran.stdout == input,
        "stdout is stdin, all {} bytes",
        input.len()
    );
    assert_eq!(ran.stderr, "cat: 300000 bytes\n");

    let wc = guest("wc");
    let ran = weir(
        &data,
        &["run", wc.to_str().unwrap(), "--", "notes.txt"],
        b"one two\nthree\n",
    );
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(ran.out(), "2 3 14 fnv1a64:b1b9f9a7fa44b82f notes.txt\n");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn the_exit_status_says_how_the_command_ended() {
    let data = data_dir("exit");
    let probe = cmdprobe();
    let ran = weir(&data, &["run", &probe, "--", "exit", "0"], b"");
    assert_eq!(
        (ran.code, ran.out().as_str()),
        (Some(0), "exiting with 0\n")
    );
    // Rust's std on wasip2 ends a non-zero exit with `exit(err)`: status 1.
    let ran = weir(&data, &["run", &probe, "--", "exit", "7"], b"");
    assert_eq!(
        (ran.code, ran.out().as_str()),
        (Some(1), "exiting with 7\n")
    );
    assert_eq!(ran.stderr, "", "a command's own failure is not Weir's");
    let ran = weir(&data, &["run", &probe, "--", "unknown-mode"], b"");
    assert_eq!(ran.code, Some(1));
    assert_eq!(ran.stderr, "cmdprobe: unknown mode `unknown-mode`\n");
    let ran = weir(&data, &["run", &probe, "--", "panic"], b"");
    assert_eq!(ran.code, Some(134), "a trap exits like wasmtime run's");
    assert!(
        ran.stderr.contains("cmdprobe was told to panic")
            && ran.stderr.ends_with(
                "weir: run_trapped: wasm trap: wasm `unreachable` instruction executed\n"
            ),
        "{}",
        ran.stderr
    );
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn a_runaway_command_ends_at_its_time_limit() {
    let data = data_dir("spin");
    let started = Instant::now();
    let ran = weir(
        &data,
        &[
            "run",
            "--limit",
            "run_time_limit_ms=300",
            "--receipt",
            &cmdprobe(),
            "--",
            "spin",
        ],
        b"",
    );
    let took = started.elapsed();
    assert_eq!(ran.code, Some(124), "{}", ran.stderr);
    assert!(
        ran.stderr
            .contains("weir: run_time_limit_exceeded: run_time_limit_ms is 300\n"),
        "{}",
        ran.stderr
    );
    let receipt: serde_json::Value = serde_json::from_str(
        ran.stderr
            .lines()
            .find(|l| l.starts_with('{'))
            .expect("a receipt line"),
    )
    .unwrap();
    let fields = &receipt["fields"];
    assert_eq!(receipt["target"], "weir::run");
    assert_eq!(fields["outcome"], "deadline");
    assert_eq!(fields["error"], "run_time_limit_exceeded");
    assert_eq!(fields["exit_code"], 124);
    assert_eq!(fields["program"], "cmdprobe.wasm");
    assert!(
        fields["cpu_us"].as_u64().unwrap() >= 250_000,
        "it burned its time: {fields}"
    );
    assert!(took < Duration::from_secs(30), "ended, not hung: {took:?}");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn a_memory_bomb_ends_at_its_memory_limit() {
    let data = data_dir("grow");
    let ran = weir(
        &data,
        &[
            "run",
            "--limit",
            "memory_limit_bytes=33554432",
            "--receipt",
            &cmdprobe(),
            "--",
            "grow",
        ],
        b"",
    );
    assert_eq!(ran.code, Some(124), "{}", ran.stderr);
    assert!(
        ran.stderr.contains("weir: memory_limit_exceeded: "),
        "{}",
        ran.stderr
    );
    let receipt = ran.stderr.lines().find(|l| l.starts_with('{')).unwrap();
    let receipt: serde_json::Value = serde_json::from_str(receipt).unwrap();
    let peak = receipt["fields"]["peak_memory_bytes"].as_u64().unwrap();
    assert!(
        (16 << 20..=32 << 20).contains(&peak),
        "it grew to its limit and no further: {peak}"
    );
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn output_past_its_limit_is_cut_there_and_fails_the_run() {
    let data = data_dir("flood");
    let probe = cmdprobe();
    // A program that ignores its failed writes is stopped at its time
    // limit, and still reported for its output.
    let ran = weir(
        &data,
        &[
            "run",
            "--limit",
            "max_run_output_bytes=100000",
            "--limit",
            "run_time_limit_ms=1000",
            &probe,
            "--",
            "flood",
        ],
        b"",
    );
    assert_eq!(ran.code, Some(124), "{}", ran.stderr);
    assert_eq!(ran.stdout.len(), 100_000, "exactly the limit, no more");
    assert!(
        ran.stderr
            .ends_with("weir: run_output_too_large: max_run_output_bytes is 100000\n"),
        "{}",
        ran.stderr
    );
    // A program whose write fails and that stops (panics) on it.
    let ran = weir(
        &data,
        &[
            "run",
            "--limit",
            "max_run_output_bytes=1000",
            &probe,
            "--",
            "write",
            "5000",
        ],
        b"",
    );
    assert_eq!(ran.code, Some(124), "{}", ran.stderr);
    assert_eq!(ran.stdout, vec![b'y'; 1000]);
    assert!(
        ran.stderr
            .ends_with("weir: run_output_too_large: max_run_output_bytes is 1000\n"),
        "{}",
        ran.stderr
    );
    // Within the limit, the same program is whole and ends well.
    let ran = weir(&data, &["run", &probe, "--", "write", "5000"], b"");
    assert_eq!((ran.code, ran.stdout.len()), (Some(0), 5000));
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn a_command_reaches_no_host_file_socket_or_name() {
    let data = data_dir("doors");
    let cwd = data_dir("doors-cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    // A port that is listening, so a refusal is Weir's, not the network's.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let probe = cmdprobe();
    let mut child = weir_command()
        .current_dir(&cwd)
        .args(["run", "--data-dir"])
        .arg(&data)
        .args([probe.as_str(), "--", "files"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut files = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut files)
        .unwrap();
    assert!(child.wait().unwrap().success());
    for line in files.lines() {
        assert!(
            line.ends_with(": NotFound"),
            "no file or directory of the host is there: {files}"
        );
    }
    assert_eq!(files.lines().count(), 11, "{files}");
    assert!(!cwd.join("escape.txt").exists(), "nothing was written");
    let ran = weir(&data, &["run", &probe, "--", "sockets", &addr], b"");
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(
        ran.out(),
        format!(
            "tcp {addr}: PermissionDenied\nlisten: PermissionDenied\n\
             udp: PermissionDenied\nlookup: Uncategorized\n"
        )
    );
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "no connection arrived");
    let _ = std::fs::remove_dir_all(&data);
    let _ = std::fs::remove_dir_all(&cwd);
}

#[test]
fn a_component_that_is_not_a_command_is_refused_before_it_runs() {
    let data = data_dir("notcmd");
    let hello = guest("hello");
    let ran = weir(&data, &["run", hello.to_str().unwrap()], b"");
    assert_eq!(ran.code, Some(126), "{}", ran.stderr);
    assert!(
        ran.stderr.starts_with(
            "weir: not_a_command: hello.wasm is not a command (it does not export wasi:cli/run)"
        ),
        "{}",
        ran.stderr
    );
    let _ = std::fs::remove_dir_all(&data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_first_runs_of_an_image_at_once_compile_it_once_and_both_run() {
    // Stored without a push through the server, so nothing compiled it.
    let data = data_dir("first-runs");
    let digest = push_offline(&data, &cmdprobe());
    let weir = serve_runner(&data, &["memory_limit_bytes=33554432"]);
    let (first, second) = (
        format!("/r/one/run/{digest}?arg=cat"),
        format!("/r/two/run/{digest}?arg=cat"),
    );
    let (one, two) = tokio::join!(
        call(&weir, "POST", &first, b"first"),
        call(&weir, "POST", &second, b"second")
    );
    assert_eq!(one.status, 200, "{}", one.text());
    assert_eq!(two.status, 200, "{}", two.text());
    assert_eq!(
        (one.json()["stdout"].clone(), two.json()["stdout"].clone()),
        ("first".into(), "second".into())
    );
    let compiled: Vec<String> = std::fs::read_dir(data.join("images").join("compiled"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        compiled.len(),
        1,
        "one artifact, no partial left: {compiled:?}"
    );
    // And one compile: the second run waited for the first's, rather than
    // compiling the same bytes again over it. (Counted once a request
    // made after both runs has its receipt in the log, which is written
    // in batches: every line before it is there then.)
    weir.log_flushed("/").await;
    let hex = digest.trim_start_matches("sha256:");
    assert_eq!(weir.compiles_of(hex), 1, "{}", weir.log());
    drop(weir);
    let _ = std::fs::remove_dir_all(&data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_runs_a_stored_command_bounded_by_its_turn_and_a_worker_cannot() {
    let data = data_dir("actor-run");
    let weir = serve_runner(&data, &["memory_limit_bytes=33554432"]);
    let bytes = std::fs::read(cmdprobe()).unwrap();
    let pushed = admin(&weir, "PUT", "/images", bytes, true).await;
    let digest = pushed.json()["digest"].as_str().unwrap().to_string();

    let ran = call(
        &weir,
        "POST",
        &format!("/r/a/run/{digest}?arg=cat"),
        b"hello, program",
    )
    .await;
    assert_eq!(ran.status, 200, "{}", ran.text());
    let body = ran.json();
    assert_eq!(body["exit_code"], 0);
    assert_eq!(body["stopped"], serde_json::Value::Null);
    assert_eq!(body["stdout"], "hello, program");
    assert_eq!(body["stderr"], "cat: 14 bytes\n");

    let ran = call(
        &weir,
        "POST",
        &format!("/r/a/run/{digest}?arg=args&arg=two%20words&env=K=V"),
        b"",
    )
    .await;
    assert_eq!(
        ran.json()["stdout"],
        format!("arg {digest}\narg args\narg two words\nenv K=V\n").as_str(),
        "argv[0] is the digest; the environment is exactly what the actor gave"
    );

    // The same component as a worker is no actor: nothing is loaded.
    let worker = call(&weir, "POST", &format!("/run/{digest}?arg=cat"), b"x").await;
    assert_eq!(worker.status, 400);
    assert_eq!(worker.json()["error"], "not-an-actor");

    let missing = format!("sha256:{}", "0".repeat(64));
    let ran = call(&weir, "POST", &format!("/r/a/run/{missing}"), b"").await;
    assert_eq!(ran.status, 404);
    assert_eq!(
        ran.json()["message"],
        format!("image_not_found: no image {missing} in the store").as_str()
    );
    let ran = call(&weir, "POST", "/r/a/run/not-a-digest", b"").await;
    assert_eq!(ran.json()["error"], "image");
    assert!(
        ran.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("image_digest_invalid: "),
        "{}",
        ran.text()
    );
    let hello = std::fs::read(guest("hello")).unwrap();
    let hello = admin(&weir, "PUT", "/images", hello, true).await.json()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let ran = call(&weir, "POST", &format!("/r/a/run/{hello}"), b"").await;
    assert_eq!(ran.status, 422, "{}", ran.text());
    assert!(
        ran.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("not_a_command: ")
    );

    // A memory bomb ends at memory_limit_bytes, inside the turn.
    let ran = call(&weir, "POST", &format!("/r/a/run/{digest}?arg=grow"), b"").await;
    assert_eq!(ran.status, 200, "{}", ran.text());
    assert_eq!(ran.json()["exit_code"], 124);
    assert_eq!(ran.json()["stopped"], "memory_limit_exceeded");

    // A runaway cannot hold its owner past the turn's deadline
    // (event_limit_ms, 1 s): the turn fails, and the actor's next turn
    // runs at once.
    let started = Instant::now();
    let ran = call(&weir, "POST", &format!("/r/a/run/{digest}?arg=spin"), b"").await;
    ran.assert_weir_error(503, "event_deadline_exceeded");
    assert!(started.elapsed() < Duration::from_secs(10));
    let count = call(&weir, "POST", "/r/a/count", b"").await;
    assert_eq!(count.status, 200, "{}", count.text());
    assert_eq!(count.json()["n"], 1);

    let receipt = weir
        .first_logged("weir::run", |r| r["error"] == "memory_limit_exceeded")
        .await;
    assert_eq!(receipt["image"], digest.as_str());
    assert_eq!(receipt["exit_code"], 124);
    assert!(receipt["peak_memory_bytes"].as_u64().unwrap() <= 32 << 20);
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn a_bad_limit_or_env_is_a_usage_error_and_nothing_runs() {
    let data = data_dir("usage");
    let probe = cmdprobe();
    for (args, needle) in [
        (
            vec!["run", "--limit", "run_time_limit_ms=0", probe.as_str()],
            "limit `run_time_limit_ms` must be an integer from 1 to 86400000, got `0`",
        ),
        (
            vec!["run", "--limit", "bogus=1", probe.as_str()],
            "unknown limit `bogus` (known limits: run_time_limit_ms,",
        ),
        (
            vec!["run", "--env", "NOEQUALS", probe.as_str()],
            "--env `NOEQUALS` is not of the form NAME=VALUE",
        ),
    ] {
        let ran = weir(&data, &args, b"");
        assert_eq!(ran.code, Some(2), "{args:?}: {}", ran.stderr);
        assert!(ran.stderr.contains(needle), "{args:?}: {}", ran.stderr);
        assert_eq!(ran.stderr.lines().count(), 1, "one line: {}", ran.stderr);
        assert_eq!(ran.stdout, b"", "nothing ran");
    }
    let _ = std::fs::remove_dir_all(&data);
}
