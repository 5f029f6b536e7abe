//! Test harness: real guest components, a real `weir serve` process on
//! 127.0.0.1:0, and a real HTTP client.
#![allow(dead_code)]

pub mod actors;
pub mod apps;
pub mod autobahn;
pub mod chat;
pub mod cluster;
pub mod hostile;
pub mod netns;
pub mod postgres;
pub mod programs;
pub mod small_disk;
pub mod strace;
pub mod toolchains;
pub mod websocket;
pub mod write_stream;

mod commands;
mod hold_server;
mod process_stats;
// Not every test binary uses them.
#[allow(unused_imports)]
pub use commands::*;
#[allow(unused_imports)]
pub use hold_server::HoldServer;
#[allow(unused_imports)]
pub use process_stats::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// How long a count of log lines must stay put to count as final: several
/// times the log writer's 50 ms batch interval.
pub const SETTLE: Duration = Duration::from_millis(300);

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/weir sits two levels below the root")
        .to_path_buf()
}

/// Builds the guests once per test binary and returns the component path.
pub fn guest(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip2",
                "--manifest-path",
            ])
            .arg(root().join("guests/Cargo.toml"))
            // Explicit, so that a CARGO_TARGET_DIR in the environment does
            // not move the components away from where the tests read them.
            .arg("--target-dir")
            .arg(root().join("guests/target"));
        let status = status_within(&mut build, FETCHES_WITHIN);
        assert!(
            status.success(),
            "the guests under guests/ do not build (the README's test command \
             first runs `rustup target add wasm32-wasip2`)"
        );
    });
    let path = root().join(format!("guests/target/wasm32-wasip2/release/{name}.wasm"));
    assert!(path.is_file(), "{} exists", path.display());
    path
}

pub fn probe() -> PathBuf {
    guest("probe")
}

/// A running `weir serve`.
pub struct Weir {
    child: Child,
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    /// The admin token, read from where the server said it keeps it.
    pub token: Option<String>,
    lines: Arc<Mutex<Vec<String>>>,
}

/// A data dir of its own for a server whose test names none: one server
/// per data dir is enforced, and tests run in parallel.
pub fn fresh_data_dir() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    weir_scratch::dir(&format!("test-{n}"))
}

/// What `weir` printed before it exited or became ready.
pub struct Exited {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

pub fn weir_command() -> Command {
    Command::new(env!("CARGO_BIN_EXE_weir"))
}

/// The keys of an actor's dump (`GET /actors/CLASS/NAME?keys=1`), in
/// its order.
pub fn dumped_keys(detail: &Value) -> Vec<&str> {
    detail["keys"]
        .as_array()
        .expect("a dump of keys")
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect()
}

/// The stdout of a command that must have succeeded (its stderr says why
/// it did not).
pub fn stdout_of(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

impl Weir {
    /// Starts `weir serve <app> --listen 127.0.0.1:0 --admin 127.0.0.1:0 <args>`.
    pub fn start(app: &Path, args: &[&str]) -> Weir {
        let mut all = vec![app.to_str().expect("utf-8 path")];
        all.extend_from_slice(args);
        Self::start_with(&all)
    }

    /// Starts `weir serve <args> --listen 127.0.0.1:0 --admin 127.0.0.1:0`
    /// (and a fresh `--data-dir` unless `args` name one).
    pub fn start_with(args: &[&str]) -> Weir {
        Self::start_with_env(args, &[])
    }

    /// [`Weir::start_with`], with more environment variables.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Weir {
        let mut command = weir_command();
        command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .args(args);
        if !args.contains(&"--data-dir") {
            command.arg("--data-dir").arg(fresh_data_dir());
        }
        command.envs(env.iter().copied());
        Self::serving(command)
    }

    /// Runs `command`, a `weir serve` (perhaps wrapped, as in a network
    /// namespace), and waits until it serves.
    pub fn serving(mut command: Command) -> Weir {
        let mut child = command
            .env("WEIR_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("weir starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some((_, addr)) = line
                        .strip_prefix("weir: serving ")
                        .and_then(|rest| rest.rsplit_once(" on http://"))
                    {
                        let _ = tx.send(("serve", addr.to_string()));
                    }
                    if let Some(rest) = line.strip_prefix("weir: admin on http://") {
                        let _ = tx.send(("admin", rest.to_string()));
                    }
                    lines.lock().unwrap().push(line);
                }
                let _ = tx.send(("exit", String::new()));
            });
        }
        let mut admin = None;
        let mut token = None;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                // `ADDR (token in PATH)`
                Ok(("admin", rest)) => {
                    let (addr, path) = rest
                        .split_once(" (token in ")
                        .expect("the admin line names the token file");
                    admin = Some(addr.parse().expect("admin address"));
                    let path = path.trim_end_matches(')');
                    token = Some(
                        std::fs::read_to_string(path)
                            .expect("the token file is readable")
                            .trim()
                            .to_string(),
                    );
                }
                Ok(("serve", a)) => {
                    return Weir {
                        child,
                        addr: a.parse().expect("serve address"),
                        admin,
                        token,
                        lines,
                    };
                }
                Ok(_) | Err(_) => {
                    let _ = child.kill();
                    panic!("weir did not start:\n{}", lines.lock().unwrap().join("\n"));
                }
            }
        }
    }

    /// Sends a signal to the server (`TERM`, `KILL`, …).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }

    /// Waits for the server to exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The fields of every JSON log line of `target` so far, in order, each
    /// with the line's timestamp.
    pub fn logged(&self, target: &str) -> Vec<Value> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["target"] == target)
            .map(|v| {
                let mut fields = v["fields"].clone();
                fields["timestamp"] = v["timestamp"].clone();
                fields
            })
            .collect()
    }

    /// Returns once every line the server logged before this call is in
    /// [`Weir::log`]: the server writes its log in batches, so a request
    /// made now (to `path`: a worker's request or an actor's turn) has
    /// its receipt after all of them.
    pub async fn log_flushed(&self, path: &str) {
        let count = || self.receipts().len() + self.actor_receipts().len();
        let before = count();
        let _ = self.get(path).await;
        wait_for("a marker request's receipt", || async {
            let now = count();
            if now > before {
                Ok(())
            } else {
                Err(format!("{now} receipts"))
            }
        })
        .await;
    }

    /// How many times the server compiled code whose artifact path holds
    /// `hex` (a digest): each compile logs one `compiled` line, whether or
    /// not its artifact was left behind.
    pub fn compiles_of(&self, hex: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| {
                v["fields"]["message"] == "compiled"
                    && v["fields"]["artifact"]
                        .as_str()
                        .is_some_and(|a| a.contains(hex))
            })
            .count()
    }

    /// Waits until a log line of `target` matches, returning its fields.
    pub async fn first_logged(&self, target: &str, f: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(r) = self.logged(target).into_iter().find(|r| f(r)) {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "no matching {target} line in:\n{:#?}",
                self.logged(target)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every receipt logged so far.
    pub fn receipts(&self) -> Vec<Value> {
        self.logged("weir::receipt")
    }

    /// Receipts of actor turns (`weir::actor`), in order.
    pub fn actor_receipts(&self) -> Vec<Value> {
        self.logged("weir::actor")
    }

    /// Waits until `n` actor receipts match (they are read from the log,
    /// a moment after the turn), returning them.
    pub async fn actor_receipts_where(&self, n: usize, f: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let matching: Vec<Value> = self.actor_receipts().into_iter().filter(|r| f(r)).collect();
            if matching.len() >= n {
                assert_eq!(matching.len(), n, "{matching:#?}");
                return matching;
            }
            assert!(
                Instant::now() < deadline,
                "only {} matching actor receipts: {matching:#?}",
                matching.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until an actor turn's receipt matches, returning it.
    pub async fn actor_receipt_where(&self, f: impl Fn(&Value) -> bool) -> Value {
        self.first_logged("weir::actor", f).await
    }

    /// Waits until a receipt matches, returning it.
    pub async fn receipt_where(&self, f: impl Fn(&Value) -> bool) -> Value {
        self.first_logged("weir::receipt", f).await
    }

    /// Waits until exactly `n` receipts match, then checks that the count
    /// stays `n` for [`SETTLE`]: receipts are logged a moment after their
    /// events end, so a receipt that should not exist could still be on
    /// its way when the count first reaches `n`.
    pub async fn count_receipts_where(&self, n: usize, f: impl Fn(&Value) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let count = self.receipts().iter().filter(|r| f(r)).count();
            if count == n {
                break;
            }
            assert!(
                count < n && Instant::now() < deadline,
                "expected {n} matching receipts, have {count}: {:#?}",
                self.receipts()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(SETTLE).await;
        let count = self.receipts().iter().filter(|r| f(r)).count();
        assert_eq!(
            count,
            n,
            "more matching receipts arrived: {:#?}",
            self.receipts()
        );
    }

    pub fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send(Request::get(path).body(Full::new(Bytes::new())).unwrap())
            .await
    }

    /// Sends one request on a fresh connection and reads the whole response.
    pub async fn send(&self, mut req: Request<Full<Bytes>>) -> Resp {
        if !req.headers().contains_key("host") {
            req.headers_mut()
                .insert("host", self.addr.to_string().parse().unwrap());
        }
        send_to(self.addr, req).await
    }

    pub async fn admin_get(&self, path: &str) -> Resp {
        self.admin_send("GET", path).await
    }

    /// Every page of the actors' listing at `path` (`/actors` or
    /// `/actors/CLASS`), each page asked with `?limit=` when `limit` is
    /// given and after the page before's `next`: each page's actors, as
    /// `CLASS/NAME`.
    pub async fn actor_pages(&self, path: &str, limit: Option<usize>) -> Vec<Vec<String>> {
        let mut pages = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut query = Vec::new();
            if let Some(limit) = limit {
                query.push(format!("limit={limit}"));
            }
            if let Some(after) = &after {
                query.push(format!("after={after}"));
            }
            let r = self.admin_get(&format!("{path}?{}", query.join("&"))).await;
            assert_eq!(r.status, 200, "{path} after {after:?}: {}", r.text());
            let page = r.json();
            pages.push(
                page["actors"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| {
                        format!(
                            "{}/{}",
                            a["class"].as_str().unwrap(),
                            a["name"].as_str().unwrap()
                        )
                    })
                    .collect(),
            );
            match page["next"].as_str() {
                // Each page moves on: a cursor given back is no end.
                Some(next) if after.as_deref() == Some(next) => {
                    panic!("{path}: the page after {next} starts after {next} again")
                }
                Some(next) => after = Some(next.to_string()),
                None => return pages,
            }
        }
    }

    /// An admin request bearing the server's admin token.
    pub async fn admin_send(&self, method: &str, path: &str) -> Resp {
        let admin = self.admin.expect("admin listener");
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", admin.to_string());
        if let Some(token) = &self.token {
            req = req.header("authorization", format!("Bearer {token}"));
        }
        send_to(admin, req.body(Full::new(Bytes::new())).unwrap()).await
    }

    /// Waits until `/healthz` answers `status`.
    pub async fn wait_health(&self, status: u16) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.admin_get("/healthz").await.status != status {
            assert!(
                Instant::now() < deadline,
                "healthz never became {status}: {}",
                self.status().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until at least `n` lanes of the app run an event.
    pub async fn wait_busy(&self, n: usize) {
        wait_for(&format!("{n} busy lanes"), || async {
            let status = self.status().await;
            let busy = status["apps"][0]["lanes"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|l| l["state"] == "busy")
                .count();
            if busy >= n {
                Ok(())
            } else {
                Err(format!("{busy} busy"))
            }
        })
        .await
    }

    pub async fn status(&self) -> Value {
        let r = self.admin_get("/status").await;
        serde_json::from_slice(r.body.as_ref().expect("status body")).expect("status is JSON")
    }

    /// `/status` once the timer pass over the actors on disk is done (at
    /// most a minute after the start).
    pub async fn status_after_timer_pass(&self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = self.status().await;
            if status["actors"]["timer_pass"]["done"] == true {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the timer pass did not end: {status}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// One raw exchange: writes `bytes`, then reads until the server closes
    /// or `wait` passes.
    pub fn raw(&self, bytes: &[u8], wait: Duration) -> String {
        String::from_utf8_lossy(&self.raw_bytes(bytes, wait)).into_owned()
    }

    /// [`Weir::raw`], keeping the bytes as received.
    pub fn raw_bytes(&self, bytes: &[u8], wait: Duration) -> Vec<u8> {
        let mut s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(wait)).unwrap();
        s.write_all(bytes).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
        out
    }
}

impl Drop for Weir {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response as the client saw it: the body, or how it failed.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Result<Bytes, String>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(self.body.as_ref().expect("complete body")).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(self.body.as_ref().expect("complete body")).expect("JSON body")
    }

    /// Asserts this is Weir's JSON error with the given status and code.
    pub fn assert_weir_error(&self, status: u16, code: &str) {
        assert_eq!(self.status.as_u16(), status, "status; body {:?}", self.body);
        assert_eq!(self.json()["error"], code);
        assert_eq!(self.headers["content-type"], "application/json");
        assert_eq!(self.headers["cache-control"], "no-store");
        assert_eq!(self.headers["x-content-type-options"], "nosniff");
    }

    pub fn generation(&self) -> u64 {
        self.headers["x-weir-generation"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    }
}

pub async fn send_to(addr: SocketAddr, req: Request<Full<Bytes>>) -> Resp {
    try_send_to(addr, req).await.expect("an HTTP response")
}

/// [`send_to`], for exchanges the server may cut (a kill, a refusal): the
/// response, or what went wrong at the transport.
pub async fn try_send_to(addr: SocketAddr, req: Request<Full<Bytes>>) -> Result<Resp, String> {
    let what = format!("{} {}", req.method(), req.uri());
    tokio::time::timeout(ANSWER_WITHIN, exchange(addr, req))
        .await
        .unwrap_or_else(|_| panic!("{what} to {addr}: no answer within {ANSWER_WITHIN:?}"))
}

/// How long a test waits on one exchange, response and body, before it
/// fails instead of hanging: past the longest deadline Weir itself puts
/// on an answer (a call's 30 s event deadline, a cold start's compile),
/// with room for a loaded machine. A hang is never an answer the caller
/// of [`try_send_to`] may take for a cut connection.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(120);

async fn exchange(addr: SocketAddr, req: Request<Full<Bytes>>) -> Result<Resp, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let response = sender
        .send_request(req)
        .await
        .map_err(|e| format!("response head: {e}"))?;
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| format!("{e:?}"));
    Ok(Resp {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// Polls `check` every 20 ms until it gives a value, failing after 30 s
/// with `what` and the last thing seen.
pub async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match check().await {
            Ok(value) => return value,
            Err(seen) => assert!(Instant::now() < deadline, "{what}: still {seen}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The deterministic byte pattern used for body round trips.
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}
