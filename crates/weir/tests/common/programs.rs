//! Helpers of the programs' tests: `weir` commands run to their end on a
//! data dir of their own, a server whose app and actor class `runner` are
//! the runner guest (actor NAME at /r/NAME/…), images pushed through the
//! CLI or the admin address, and plain calls.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::Value;

use super::{Resp, Weir, exit_within, guest, send_to, weir_command};

/// `weir serve runner.wasm --actor runner=runner.wasm --actor-route
/// runner=/r` on `data`, with `limits` (`NAME=VALUE`).
pub fn serve_runner(data: &Path, limits: &[&str]) -> Weir {
    serve_runner_with(data, limits, &[])
}

/// [`serve_runner`] with more arguments for `weir serve`.
pub fn serve_runner_with(data: &Path, limits: &[&str], extra: &[&str]) -> Weir {
    let runner = guest("runner");
    let actor = format!("runner={}", runner.display());
    let mut args = vec![
        "--data-dir",
        data.to_str().unwrap(),
        "--actor",
        &actor,
        "--actor-route",
        "runner=/r",
    ];
    for limit in limits {
        args.extend(["--limit", limit]);
    }
    args.extend_from_slice(extra);
    Weir::start(&runner, &args)
}

/// Pushes `component` through the admin address; its digest.
pub async fn push_image(weir: &Weir, component: &Path) -> String {
    let addr = weir.admin.unwrap();
    let req = Request::put("/images")
        .header("host", addr.to_string())
        .header(
            "authorization",
            format!("Bearer {}", weir.token.as_ref().unwrap()),
        )
        .body(Full::new(Bytes::from(std::fs::read(component).unwrap())))
        .unwrap();
    send_to(addr, req).await.json()["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

/// One request with `body` to the server's listen address.
pub async fn call(weir: &Weir, method: &str, path: &str, body: &[u8]) -> Resp {
    weir.send(
        Request::builder()
            .method(method)
            .uri(path)
            .body(Full::new(Bytes::copy_from_slice(body)))
            .unwrap(),
    )
    .await
}

/// What a finished `weir` printed and exited with.
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Ran {
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// A data dir of its own.
pub fn data_dir(name: &str) -> PathBuf {
    weir_scratch::dir(&format!("programs-{name}"))
}

pub fn spawn(data: &Path, args: &[&str], stdin: Stdio) -> Child {
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
pub fn weir_in(data: &Path, args: &[&str], input: &[u8]) -> Ran {
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
    let Some(status) = exit_within(&mut child, Duration::from_secs(60)) else {
        panic!("weir {args:?} did not exit within a minute");
    };
    let _ = writer.join();
    Ran {
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

pub fn cmdprobe() -> String {
    guest("cmdprobe").to_str().unwrap().to_string()
}

/// The digest `weir images push` printed for `file`.
pub fn push(data: &Path, file: &str) -> String {
    let ran = weir_in(data, &["images", "push", file], b"");
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let out = ran.out();
    let digest = out.split_whitespace().next().expect("a digest").to_string();
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{out}");
    digest
}

pub fn image_file(data: &Path, digest: &str) -> PathBuf {
    data.join("images")
        .join(format!("{}.wasm", digest.trim_start_matches("sha256:")))
}

/// Polls `check` until it holds, for at most a minute.
pub fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within a minute");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An admin request with `body`, bearing the token or not.
pub async fn admin(weir: &Weir, method: &str, path: &str, body: Vec<u8>, token: bool) -> Resp {
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

/// A server whose app and actor class `runner` are the runner guest
/// (clients reach actor NAME at /r/NAME/…), with `resident` and `cmdprobe`
/// pushed to its image store.
pub struct Owners {
    pub weir: Weir,
    pub resident: String,
    pub cmdprobe: String,
    pub data: std::path::PathBuf,
    /// Removes the data dir when dropped (not when a restart follows).
    pub remove_data: bool,
}

impl Owners {
    pub async fn start(name: &str, limits: &[&str]) -> Owners {
        let data = weir_scratch::dir(&format!("processes-{name}"));
        Self::start_in(data, limits).await
    }

    /// A server on `data` as it is (a restart keeps what is there).
    pub async fn start_in(data: std::path::PathBuf, limits: &[&str]) -> Owners {
        Self::start_with(data, limits, &[]).await
    }

    /// [`Owners::start_in`] with more arguments for `weir serve`.
    pub async fn start_with(data: std::path::PathBuf, limits: &[&str], extra: &[&str]) -> Owners {
        let weir = serve_runner_with(&data, limits, extra);
        let resident = push_image(&weir, &guest("resident")).await;
        let cmdprobe = push_image(&weir, &guest("cmdprobe")).await;
        Owners {
            weir,
            resident,
            cmdprobe,
            data,
            remove_data: true,
        }
    }

    pub async fn call(&self, method: &str, path: &str, body: &[u8]) -> Resp {
        call(&self.weir, method, path, body).await
    }

    /// Spawns the resident server for actor `owner`: its pid and payload.
    pub async fn spawn(&self, owner: &str, query: &str) -> (u64, String) {
        let spawned = self
            .call(
                "POST",
                &format!("/r/{owner}/spawn/{}?{query}", self.resident),
                b"",
            )
            .await;
        assert_eq!(spawned.status, 200, "{}", spawned.text());
        let body = spawned.json();
        (
            body["pid"].as_u64().unwrap(),
            body["payload"].as_str().unwrap().to_string(),
        )
    }
}

impl Drop for Owners {
    fn drop(&mut self) {
        if self.remove_data {
            let _ = std::fs::remove_dir_all(&self.data);
        }
    }
}

/// Ends the server at once (`SIGKILL`), as a crash would.
pub fn kill(mut weir: Weir) {
    weir.signal("KILL");
    weir.wait_exit(Duration::from_secs(10));
}

/// The running processes, as the admin address lists them.
pub async fn running(weir: &Weir) -> Vec<Value> {
    weir.admin_get("/processes").await.json()["processes"]
        .as_array()
        .unwrap()
        .clone()
}

/// Waits (at most a minute) until `n` processes run, asking only the admin
/// address: nothing reaches the app or its owner.
pub async fn wait_running(weir: &Weir, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = running(weir).await;
        if now.len() == n {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{n} processes did not come up: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a spawn of `image` for `owner` over its durable slot `app` whose
/// start takes 3 s, and returns once that start began: the request's
/// answer, to come.
pub async fn spawn_slowly(weir: &Weir, data: &Path, image: &str) -> tokio::task::JoinHandle<Resp> {
    let (addr, path) = (
        weir.addr,
        format!("/r/owner/spawn/{image}?slot=app&durable=1&start=slow"),
    );
    let spawning = tokio::spawn(async move {
        let req = Request::post(path)
            .header("host", addr.to_string())
            .body(Full::new(Bytes::new()))
            .unwrap();
        send_to(addr, req).await
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while starts(data) < 1 {
        assert!(Instant::now() < deadline, "the start did not begin");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    spawning
}

/// Spawns a process for `owner` whose start sleeps 3 s when it is a
/// re-drive (it finds its durable slot `app` written by an earlier start).
pub async fn spawn_slow_redrive(weir: &Weir, image: &str) {
    let spawned = call(
        weir,
        "POST",
        &format!("/r/owner/spawn/{image}?slot=app&durable=1&start=slow-redrive"),
        b"",
    )
    .await;
    assert_eq!(spawned.status, 200, "{}", spawned.text());
}

/// How often the program's `start` ran over the owner's durable slot `app`
/// (it appends a line each time).
pub fn starts(data: &Path) -> usize {
    let slots = data.join("slots/durable/runner");
    let Ok(owners) = std::fs::read_dir(&slots) else {
        return 0;
    };
    owners
        .flatten()
        .map(|o| o.path().join("app/starts.log"))
        .filter_map(|log| std::fs::read_to_string(log).ok())
        .map(|text| text.lines().count())
        .sum()
}
