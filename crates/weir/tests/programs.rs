//! Programs from outside: `weir run` of real command components (its
//! arguments, environment, stdin, output and exit code; each limit
//! provoked; the doors a command must not open), and the image store
//! through `weir images` (digests, corrupt and truncated images, roots
//! that hold across processes, the sweep).

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Resp, Weir, guest, send_to, weir_command};
use http::Request;
use http_body_util::Full;

/// What a finished `weir` printed and exited with.
struct Ran {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
}

impl Ran {
    fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// A data dir of its own.
fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-programs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn spawn(data: &Path, args: &[&str], stdin: Stdio) -> Child {
    weir_command()
        .args(args.first().copied())
        .arg("--data-dir")
        .arg(data)
        .args(&args[1..])
        .env("WEIR_TEST_SECRET", "host-only")
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("weir runs")
}

/// Runs `weir <args>` (the data dir goes right after the subcommand) with
/// `input` on its stdin, and waits at most a minute.
fn weir(data: &Path, args: &[&str], input: &[u8]) -> Ran {
    let mut child = spawn(data, args, Stdio::piped());
    let mut stdin = child.stdin.take().expect("piped");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("weir {args:?} did not exit within a minute");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = writer.join();
    Ran {
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn cmdprobe() -> String {
    guest("cmdprobe").to_str().unwrap().to_string()
}

/// The digest `weir images push` printed for `file`.
fn push(data: &Path, file: &str) -> String {
    let ran = weir(data, &["images", "push", file], b"");
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let out = ran.out();
    let digest = out.split_whitespace().next().expect("a digest").to_string();
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{out}");
    digest
}

fn image_file(data: &Path, digest: &str) -> PathBuf {
    data.join("images")
        .join(format!("{}.wasm", digest.trim_start_matches("sha256:")))
}

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
fn an_image_runs_by_digest_and_a_corrupt_or_truncated_one_is_refused_by_digest() {
    let data = data_dir("digest");
    let probe = cmdprobe();
    let bytes = std::fs::read(&probe).unwrap();
    let digest = push(&data, &probe);
    assert_eq!(
        digest,
        format!("sha256:{}", sha256_hex(&bytes)),
        "named by the SHA-256 of its bytes"
    );
    let again = weir(&data, &["images", "push", &probe], b"");
    assert!(again.out().contains("already stored"), "{}", again.out());
    let ran = weir(&data, &["run", &digest, "--", "exit", "0"], b"");
    assert_eq!(
        (ran.code, ran.out().as_str()),
        (Some(0), "exiting with 0\n")
    );
    let compiled = || {
        std::fs::read_dir(data.join("images/compiled"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(digest.trim_start_matches("sha256:"))
            })
            .count()
    };
    assert_eq!(compiled(), 1, "its compiled code is cached by digest");

    let file = image_file(&data, &digest);
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x01;
    std::fs::write(&file, &flipped).unwrap();
    let ran = weir(&data, &["run", &digest, "--", "exit", "0"], b"");
    assert_eq!(ran.code, Some(126), "{}", ran.stderr);
    assert!(
        ran.stderr.starts_with(&format!(
            "weir: image_corrupt: image {digest} is corrupt: its {} bytes hash to sha256:",
            bytes.len()
        )),
        "{}",
        ran.stderr
    );
    assert_eq!(ran.stdout, b"", "nothing of it ran");

    std::fs::write(&file, &bytes[..bytes.len() - 1]).unwrap();
    let ran = weir(&data, &["run", &digest, "--", "exit", "0"], b"");
    assert_eq!(ran.code, Some(126));
    assert!(
        ran.stderr.starts_with(&format!(
            "weir: image_corrupt: image {digest} is corrupt: its {} bytes hash to",
            bytes.len() - 1
        )),
        "{}",
        ran.stderr
    );

    let ran = weir(&data, &["images", "rm", &digest], b"");
    assert_eq!(
        (ran.code, ran.out()),
        (Some(0), format!("{digest}  removed\n"))
    );
    assert_eq!(compiled(), 0, "its compiled code went with it");
    let ran = weir(&data, &["run", &digest], b"");
    assert_eq!(ran.code, Some(126));
    assert_eq!(
        ran.stderr,
        format!("weir: image_not_found: no image {digest} in the store\n")
    );
    let ran = weir(&data, &["run", "sha256:1234"], b"");
    assert_eq!(ran.code, Some(126), "{}", ran.stderr);
    let _ = std::fs::remove_dir_all(&data);
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

#[test]
fn the_sweep_spares_what_a_run_in_another_process_holds_and_removes_orphans() {
    let data = data_dir("sweep");
    let held = push(&data, &cmdprobe());
    let orphan = push(&data, guest("wc").to_str().unwrap());
    // An abandoned push: a partial file whose writer is gone.
    let partial = data.join("images/.partial-abandoned");
    std::fs::write(&partial, b"half an image").unwrap();

    // A run in its own process holds the probe's image while it spins.
    let mut running = spawn(
        &data,
        &[
            "run",
            "--limit",
            "run_time_limit_ms=60000",
            &held,
            "--",
            "spin",
        ],
        Stdio::null(),
    );
    wait_until("the run holds its image", || {
        let list = weir(&data, &["images", "list", "--json"], b"");
        let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
        list["images"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["digest"] == held.as_str() && i["rooted"] == true)
    });
    let ran = weir(&data, &["images", "rm", &held], b"");
    assert_eq!(ran.code, Some(1));
    assert_eq!(
        ran.stderr,
        format!("weir: image {held} is in use (a run or process holds it)\n")
    );

    let ran = weir(&data, &["images", "sweep"], b"");
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(
        ran.out(),
        format!("{orphan}  removed\n{held}  kept (in use)\n")
    );
    assert!(
        ran.stderr
            .contains("swept 1 images and 1 unfinished pushes")
    );
    assert!(image_file(&data, &held).exists());
    assert!(!image_file(&data, &orphan).exists());
    assert!(!partial.exists());

    // Its holder gone (killed, not ended: the kernel drops the root).
    running.kill().unwrap();
    running.wait().unwrap();
    let ran = weir(&data, &["images", "sweep", "--keep", &orphan], b"");
    assert_eq!(ran.out(), format!("{held}  removed\n"));
    let list = weir(&data, &["images", "list"], b"");
    assert_eq!(list.out(), "", "the store is empty");
    let _ = std::fs::remove_dir_all(&data);
}

/// Polls `check` until it holds, for at most a minute.
fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within a minute");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An admin request with `body`, bearing the token or not.
async fn admin(weir: &Weir, method: &str, path: &str, body: Vec<u8>, token: bool) -> Resp {
    let addr = weir.admin.expect("admin listener");
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    if token {
        req = req.header(
            "authorization",
            format!("Bearer {}", weir.token.as_ref().unwrap()),
        );
    }
    send_to(addr, req.body(Full::new(Bytes::from(body))).unwrap()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_address_pushes_lists_removes_and_sweeps_images_for_the_token_holder_only() {
    let data = data_dir("admin");
    let weir = Weir::start(
        &guest("hello"),
        &[
            "--data-dir",
            data.to_str().unwrap(),
            "--limit",
            "max_image_bytes=262144",
        ],
    );
    let bytes = std::fs::read(cmdprobe()).unwrap();
    let digest = format!("sha256:{}", sha256_hex(&bytes));

    let refused = admin(&weir, "PUT", "/images", bytes.clone(), false).await;
    assert_eq!(refused.status, 401);
    assert_eq!(refused.json()["error"], "admin_token_required");
    assert_eq!(
        admin(&weir, "GET", "/images", vec![], false).await.status,
        401
    );
    assert!(
        !data
            .join("images")
            .read_dir()
            .unwrap()
            .any(|e| { e.unwrap().file_name().to_string_lossy().ends_with(".wasm") })
    );

    let pushed = admin(&weir, "PUT", "/images", bytes.clone(), true).await;
    assert_eq!(pushed.status, 201, "{:?}", pushed.body);
    assert_eq!(pushed.json()["digest"], digest.as_str());
    assert_eq!(pushed.json()["bytes"], bytes.len());
    let again = admin(&weir, "PUT", "/images", bytes.clone(), true).await;
    assert_eq!(
        (again.status.as_u16(), &again.json()["stored"]),
        (200, &false.into())
    );

    let big = admin(&weir, "PUT", "/images", vec![0u8; 300_000], true).await;
    assert_eq!(big.status, 413);
    assert_eq!(big.json()["error"], "image_too_large");

    let list = admin(&weir, "GET", "/images", vec![], true).await.json();
    assert_eq!(list["images"].as_array().unwrap().len(), 1);
    assert_eq!(list["images"][0]["digest"], digest.as_str());
    assert_eq!(list["images"][0]["bytes"], bytes.len());

    // The store is shared: `weir run` of what the server stored, while the
    // server runs.
    let ran = self::weir(&data, &["run", &digest, "--", "exit", "0"], b"");
    assert_eq!(
        (ran.code, ran.out().as_str()),
        (Some(0), "exiting with 0\n"),
        "{}",
        ran.stderr
    );

    let bad = admin(&weir, "DELETE", "/images/sha256:xyz", vec![], true).await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"], "image_digest_invalid");
    let gone = admin(&weir, "DELETE", &format!("/images/{digest}"), vec![], true).await;
    assert_eq!(gone.json()["deleted"], true, "{:?}", gone.body);
    let gone = admin(&weir, "DELETE", &format!("/images/{digest}"), vec![], true).await;
    assert_eq!(gone.json()["deleted"], false);

    admin(&weir, "PUT", "/images", bytes.clone(), true).await;
    let swept = admin(&weir, "POST", "/images/sweep", vec![], true)
        .await
        .json();
    assert_eq!(swept["removed"][0], digest.as_str(), "{swept}");
    assert_eq!(swept["bytes_freed"], bytes.len());
    drop(weir);
    let _ = std::fs::remove_dir_all(&data);
}

/// A POST to the server's listen address.
async fn post(weir: &Weir, path: &str, body: &[u8]) -> Resp {
    weir.send(
        Request::post(path)
            .body(Full::new(Bytes::copy_from_slice(body)))
            .unwrap(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_runs_a_stored_command_bounded_by_its_turn_and_a_worker_cannot() {
    let data = data_dir("actor-run");
    let runner = guest("runner");
    let runner = runner.to_str().unwrap();
    let actor = format!("runner={runner}");
    let weir = Weir::start(
        Path::new(runner),
        &[
            "--data-dir",
            data.to_str().unwrap(),
            "--actor",
            &actor,
            "--actor-route",
            "runner=/r",
            "--limit",
            "memory_limit_bytes=33554432",
        ],
    );
    let bytes = std::fs::read(cmdprobe()).unwrap();
    let pushed = admin(&weir, "PUT", "/images", bytes, true).await;
    let digest = pushed.json()["digest"].as_str().unwrap().to_string();

    let ran = post(
        &weir,
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

    let ran = post(
        &weir,
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
    let worker = post(&weir, &format!("/run/{digest}?arg=cat"), b"x").await;
    assert_eq!(worker.status, 400);
    assert_eq!(worker.json()["error"], "not-an-actor");

    let missing = format!("sha256:{}", "0".repeat(64));
    let ran = post(&weir, &format!("/r/a/run/{missing}"), b"").await;
    assert_eq!(ran.status, 404);
    assert_eq!(
        ran.json()["message"],
        format!("image_not_found: no image {missing} in the store").as_str()
    );
    let ran = post(&weir, "/r/a/run/not-a-digest", b"").await;
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
    let ran = post(&weir, &format!("/r/a/run/{hello}"), b"").await;
    assert_eq!(ran.status, 422, "{}", ran.text());
    assert!(
        ran.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("not_a_command: ")
    );

    // A memory bomb ends at memory_limit_bytes, inside the turn.
    let ran = post(&weir, &format!("/r/a/run/{digest}?arg=grow"), b"").await;
    assert_eq!(ran.status, 200, "{}", ran.text());
    assert_eq!(ran.json()["exit_code"], 124);
    assert_eq!(ran.json()["stopped"], "memory_limit_exceeded");

    // A runaway cannot hold its owner past the turn's deadline
    // (event_limit_ms, 1 s): the turn fails, and the actor's next turn
    // runs at once.
    let started = Instant::now();
    let ran = post(&weir, &format!("/r/a/run/{digest}?arg=spin"), b"").await;
    ran.assert_weir_error(503, "event_deadline_exceeded");
    assert!(started.elapsed() < Duration::from_secs(10));
    let count = post(&weir, "/r/a/count", b"").await;
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
