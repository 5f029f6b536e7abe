//! The invocation machine, tried in-process: a server built by
//! `Server::build` on 127.0.0.1:0, a real HTTP client, small WAT components
//! (and the `actor-probe` guest for the turn transaction), and assertions
//! on the runtime's own state — the lane board, the admission queue, the
//! receipts and an actor's database — next to the black-box tests of
//! `crates/weir/tests`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::sync::oneshot;
use weir_runtime::compiled_code::Compiler;
use weir_runtime::lane::LaneState;
use weir_runtime::receipt::ReceiptSink;
use weir_runtime::{App, LoadError};
use weir_server::{Server, ServerConfig, ServerError};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/weir-server sits two levels below the root")
        .to_path_buf()
}

fn scratch(name: &str) -> PathBuf {
    let dir = weir_scratch::dir(&format!("server-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `guests/wat/flaky-start.wat`, never failing: its start spins for
/// `start_ms`, its handler for `hold_ms`, and it sets no response (each
/// event it finishes is answered 502 `invalid_response`).
fn spinner(dir: &Path, start_ms: u64, hold_ms: u64) -> PathBuf {
    let wat = std::fs::read_to_string(root().join("guests/wat/flaky-start.wat"))
        .unwrap()
        .replace("FAIL_FROM", "0")
        .replace("FAIL_UNTIL", "0")
        .replace("START_MS", &start_ms.to_string())
        .replace("HOLD_MS", &hold_ms.to_string());
    let path = dir.join("spinner.wasm");
    std::fs::write(&path, wat::parse_str(&wat).unwrap()).unwrap();
    path
}

/// A guest crate from `guests/`, built once per test binary.
fn guest(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "--release", "--target", "wasm32-wasip2"])
            .arg("--manifest-path")
            .arg(root().join("guests/Cargo.toml"))
            .arg("--target-dir")
            .arg(root().join("guests/target"))
            .status()
            .expect("cargo runs");
        assert!(status.success(), "guests build");
    });
    root().join(format!("guests/target/wasm32-wasip2/release/{name}.wasm"))
}

/// Receipts as the server writes them, one JSON object per line.
#[derive(Default)]
struct Receipts(Mutex<Vec<Value>>);

impl ReceiptSink for Receipts {
    fn write_line(&self, line: &[u8]) {
        let receipt = serde_json::from_slice(line).expect("a receipt is one JSON object");
        self.0.lock().unwrap().push(receipt);
    }
}

impl Receipts {
    /// Waits until `n` receipts of the app have been written.
    async fn wait_for(&self, n: usize) -> Vec<Value> {
        wait_until(|| self.app().len() >= n).await;
        self.app()
    }

    /// The fields of the app's event receipts, in the order written.
    fn app(&self) -> Vec<Value> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r["target"] == weir_runtime::receipt::WORKER_TARGET)
            .map(|r| r["fields"].clone())
            .collect()
    }
}

/// Polls `ready` every 5 ms until it holds (the test's own timeout bounds
/// it; no timing is asserted).
async fn wait_until(mut ready: impl FnMut() -> bool) {
    while !ready() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

struct Running {
    addr: SocketAddr,
    app: Arc<App>,
    actors: Option<Arc<weir_actors::ActorHost>>,
    receipts: Arc<Receipts>,
    _stop: oneshot::Sender<()>,
}

fn configure(app: &Path, data: &Path, limits: &[&str]) -> (ServerConfig, Arc<Receipts>) {
    let mut config = ServerConfig::new(app, "127.0.0.1:0".parse().unwrap(), data);
    for limit in limits {
        config.limits.apply(limit).unwrap();
    }
    let receipts = Arc::new(Receipts::default());
    config.receipts = Some(receipts.clone());
    (config, receipts)
}

async fn start(config: ServerConfig, receipts: Arc<Receipts>) -> Running {
    let server = Server::build(config).await.expect("the server builds");
    let (stop, stopped) = oneshot::channel::<()>();
    let running = Running {
        addr: server.local_addr(),
        app: server.app().clone(),
        actors: server.actors(),
        receipts,
        _stop: stop,
    };
    tokio::spawn(server.serve(async move {
        let _ = stopped.await;
    }));
    running
}

impl Running {
    async fn request(&self, method: &str, path: &str) -> (u16, String) {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
        let request = http::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .body(Empty::new())
            .unwrap();
        let response = client.request(request).await.expect("the server answers");
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    async fn get(&self, path: &str) -> (u16, String) {
        self.request("GET", path).await
    }

    fn lane(&self, lane: usize) -> LaneState {
        self.app.board.snapshot()[lane].state
    }
}

fn weir_error(code: &str) -> String {
    format!("{{\"error\":\"{code}\"}}")
}

// A spinning guest yields to tokio only at epoch ticks: the server and
// the client each get a worker of their own, as in `weir serve`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_runs_one_event_per_lane_queues_max_queued_and_refuses_the_rest() {
    let dir = scratch("admission");
    let app = spinner(&dir, 0, 1500);
    let (config, receipts) = configure(
        &app,
        &dir.join("data"),
        &["max_concurrent=1", "max_queued=1", "event_limit_ms=30000"],
    );
    let weir = Arc::new(start(config, receipts).await);
    assert_eq!(weir.lane(0), LaneState::Idle);

    let running = tokio::spawn({
        let weir = weir.clone();
        async move { weir.get("/").await }
    });
    wait_until(|| weir.lane(0) == LaneState::Busy).await;
    let queued = tokio::spawn({
        let weir = weir.clone();
        async move { weir.get("/").await }
    });
    wait_until(|| weir.app.admission.queue_depth() == 1).await;

    // The lane is busy and the queue is full: refused at once, never run.
    let refused = weir.get("/").await;
    assert_eq!(refused, (503, weir_error("event_capacity_exceeded")));
    let invalid = (502, weir_error("invalid_response"));
    assert_eq!(running.await.unwrap(), invalid);
    assert_eq!(queued.await.unwrap(), invalid);
    assert_eq!(weir.app.admission.queue_depth(), 0);

    let receipts = weir.receipts.wait_for(3).await;
    // Both admitted events ran in Wasm, one after the other on the one
    // lane (each on a fresh generation: a guest that sets no response has
    // its generation retired at once).
    let ran: Vec<_> = receipts
        .iter()
        .filter_map(|r| r["generation"].as_u64())
        .collect();
    assert_eq!(ran, [1, 2], "{receipts:?}");
    let refused: Vec<_> = receipts
        .iter()
        .filter(|r| r["error"] == "event_capacity_exceeded")
        .collect();
    assert_eq!(refused.len(), 1, "{receipts:?}");
    assert!(refused[0]["lane"].is_null() && refused[0]["generation"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_serves_retirement_admission_limit_events_then_a_fresh_one_takes_over() {
    let dir = scratch("retirement");
    // A guest that answers: the spinner sets no response, and that retires
    // its generation at once (the next test).
    let app = guest("hello");
    let (config, receipts) = configure(
        &app,
        &dir.join("data"),
        &["max_concurrent=1", "retirement_admission_limit=2"],
    );
    let weir = start(config, receipts).await;
    for _ in 0..5 {
        assert_eq!(weir.get("/").await, (200, "hello from weir\n".to_string()));
    }
    let receipts = weir.receipts.wait_for(5).await;
    let generations: Vec<_> = receipts
        .iter()
        .map(|r| r["generation"].as_u64().unwrap())
        .collect();
    assert_eq!(generations, [1, 1, 2, 2, 3]);
    let retired: Vec<_> = receipts.iter().map(|r| r["retired"].as_str()).collect();
    assert_eq!(
        retired,
        [
            None,
            Some("admission_limit"),
            None,
            Some("admission_limit"),
            None
        ]
    );
    wait_until(|| weir.lane(0) == LaneState::Idle).await;
    assert_eq!(weir.app.board.snapshot()[0].generation, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_that_returns_without_a_response_has_its_generation_retired_at_once() {
    let dir = scratch("no-response");
    let app = spinner(&dir, 0, 0);
    let (config, receipts) = configure(&app, &dir.join("data"), &["max_concurrent=1"]);
    let weir = start(config, receipts).await;
    for _ in 0..3 {
        assert_eq!(weir.get("/").await, (502, weir_error("invalid_response")));
    }
    let receipts = weir.receipts.wait_for(3).await;
    let generations: Vec<_> = receipts
        .iter()
        .map(|r| r["generation"].as_u64().unwrap())
        .collect();
    assert_eq!(generations, [1, 2, 3], "{receipts:?}");
    assert!(
        receipts
            .iter()
            .all(|r| r["retired"] == "invalid_response" && r["error"] == "invalid_response"),
        "{receipts:?}"
    );
    // Failures on a first event are not the signature of a guest that
    // cannot serve a second one: the admission limit stays.
    let status = weir.app.retirement.status();
    assert_eq!((status.events_per_generation, status.fallback), (64, false));
    wait_until(|| weir.lane(0) == LaneState::Idle).await;
    assert_eq!(weir.app.board.snapshot()[0].generation, 4);
    assert_eq!(
        weir.app
            .metrics
            .counts()
            .retired
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_never_answers_is_cut_at_event_limit_and_its_lane_renewed() {
    let dir = scratch("deadline");
    let app = spinner(&dir, 0, 1 << 40);
    let (config, receipts) = configure(
        &app,
        &dir.join("data"),
        &["max_concurrent=1", "event_limit_ms=300"],
    );
    let weir = start(config, receipts).await;
    for _ in 0..2 {
        assert_eq!(
            weir.get("/").await,
            (503, weir_error("event_deadline_exceeded"))
        );
    }
    let receipts = weir.receipts.wait_for(2).await;
    let generations: Vec<_> = receipts.iter().map(|r| &r["generation"]).collect();
    assert_eq!(generations, [1, 2], "each abandoned for a fresh one");
    assert!(
        receipts.iter().all(|r| r["outcome"] == "deadline"),
        "{receipts:?}"
    );
    wait_until(|| weir.lane(0) == LaneState::Idle).await;
    assert_eq!(weir.app.board.snapshot()[0].generation, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_function_that_never_ends_is_refused_at_event_limit() {
    let dir = scratch("start");
    let app = spinner(&dir, 1 << 40, 0);
    let (config, _) = configure(&app, &dir.join("data"), &["event_limit_ms=300"]);
    // Bounded so that a start that is not cut fails the test, not hangs it.
    let built = tokio::time::timeout(Duration::from_secs(60), Server::build(config));
    let error = built.await.expect("not hung").err().expect("refused");
    match &error {
        ServerError::Load(LoadError::Instantiate { cause: source, .. }) => assert_eq!(
            source.reason,
            "its start did not finish within event_limit_ms (300 ms)"
        ),
        other => panic!("{other}"),
    }
    // A start that ends within the limit is a start like any other.
    let app = spinner(&dir, 50, 0);
    let (config, receipts) = configure(&app, &dir.join("data2"), &["event_limit_ms=1000"]);
    let weir = start(config, receipts).await;
    assert_eq!(weir.get("/").await, (502, weir_error("invalid_response")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compiler_process_that_fails_or_dies_is_a_refused_load_that_leaves_nothing() {
    let dir = scratch("compiler");
    let app = spinner(&dir, 0, 0);
    for (script, reason) in [
        ("echo no compiler here >&2; exit 7", "no compiler here"),
        (
            "kill -9 $$",
            "the compiler process failed (signal: 9 (SIGKILL))",
        ),
    ] {
        let data = dir.join(format!("data-{}", reason.len()));
        let (mut config, _) = configure(&app, &data, &[]);
        config.compiler = Compiler::Process {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into(), "sh".into()],
        };
        let error = Server::build(config).await.err().expect("refused");
        match &error {
            ServerError::Load(LoadError::Compile { reason: got, .. }) => {
                assert_eq!(got, reason)
            }
            other => panic!("{other}"),
        }
        let left: Vec<_> = std::fs::read_dir(data.join(weir_server::CODE_DIR))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
    // A compiler that says it compiled but could not write the artifact
    // (its exit code for that) is the cache's trouble, not a refusal.
    let data = dir.join("data-not-kept");
    let (mut config, _) = configure(&app, &data, &[]);
    config.compiler = Compiler::Process {
        program: "/bin/sh".into(),
        args: vec![
            "-c".into(),
            format!(
                "echo cannot write the artifact >&2; exit {}",
                weir_runtime::compiled_code::EXIT_ARTIFACT_NOT_WRITTEN
            )
            .into(),
            "sh".into(),
        ],
    };
    match Server::build(config).await.err().expect("refused") {
        ServerError::Load(LoadError::CodeNotKept { reason, .. }) => {
            assert_eq!(reason, "cannot write the artifact")
        }
        other => panic!("{other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actor_turn_commits_all_of_its_writes_or_none_of_them() {
    let dir = scratch("turn");
    let app = spinner(&dir, 0, 0);
    let (mut config, receipts) = configure(&app, &dir.join("data"), &[]);
    config.apps[0].actors = vec![("probe".into(), guest("actor_probe"))];
    config.apps[0].actor_routes = vec![("/probe".into(), "probe".into())];
    let weir = start(config, receipts).await;
    let actors = weir.actors.clone().expect("an actor host");
    let keys = || async {
        let detail = actors.inspect("probe", "t", true, None).await.unwrap();
        let keys: Vec<String> = detail.keys.unwrap().into_iter().map(|e| e.key).collect();
        keys
    };

    assert_eq!(
        weir.request("POST", "/probe/t/incr").await,
        (200, "1".into())
    );
    assert_eq!(keys().await, ["n"]);
    // A write, then a trap: the write is rolled back with the turn.
    assert_eq!(
        weir.request("POST", "/probe/t/write-then-trap").await,
        (503, weir_error("instance_abandoned"))
    );
    assert_eq!(keys().await, ["n"]);
    // The actor goes on from its committed state.
    assert_eq!(
        weir.request("POST", "/probe/t/incr").await,
        (200, "2".into())
    );
    assert_eq!(keys().await, ["n"]);
}
