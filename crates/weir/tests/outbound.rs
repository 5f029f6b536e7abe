//! Outbound HTTP through the event scope, against real upstream servers on
//! loopback run by the test itself.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Weir, probe};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What an upstream does with each request it reads.
#[derive(Clone)]
enum Behavior {
    /// Answers 200 with a fixed body after a delay.
    Answer(Duration),
    /// Reads the request and never answers.
    Never,
    /// Answers 302 to the given location.
    Redirect(String),
    /// Answers 200 with a body of this many bytes.
    Large(usize),
    /// Reads the request body (by its content-length) and answers with
    /// how many bytes it read and their sum.
    Count,
    /// Sends headers and the first bytes of a longer body, then stalls.
    Trickle,
}

/// A real HTTP/1.1 server on 127.0.0.1 that records what reached it.
struct Upstream {
    port: u16,
    accepted: Arc<AtomicUsize>,
    /// When each connection was seen closed by its client.
    closed: Arc<Mutex<Vec<Instant>>>,
}

impl Upstream {
    async fn start(behavior: Behavior) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(Mutex::new(Vec::new()));
        let (a, c) = (accepted.clone(), closed.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                a.fetch_add(1, Ordering::SeqCst);
                let behavior = behavior.clone();
                let c = c.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // Read the head.
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => {
                                c.lock().unwrap().push(Instant::now());
                                return;
                            }
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let answer = match behavior {
                        Behavior::Count => {
                            let head_end =
                                buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                            let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                            let length: usize = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .map(|v| v.trim().parse().unwrap())
                                .unwrap_or(0);
                            let mut body = buf[head_end..].to_vec();
                            while body.len() < length {
                                match stream.read(&mut chunk).await {
                                    Ok(0) | Err(_) => break,
                                    Ok(n) => body.extend_from_slice(&chunk[..n]),
                                }
                            }
                            let sum: u64 = body.iter().map(|b| *b as u64).sum();
                            let text = format!("{} {}", body.len(), sum);
                            Some(format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{text}",
                                text.len()
                            ))
                        }
                        Behavior::Answer(delay) => {
                            tokio::time::sleep(delay).await;
                            Some(
                                "HTTP/1.1 200 OK\r\ncontent-length: 13\r\n\r\nupstream body"
                                    .to_string(),
                            )
                        }
                        Behavior::Redirect(to) => Some(format!(
                            "HTTP/1.1 302 Found\r\nlocation: {to}\r\ncontent-length: 0\r\n\r\n"
                        )),
                        Behavior::Large(n) => Some(format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {n}\r\n\r\n{}",
                            "x".repeat(n)
                        )),
                        Behavior::Trickle => Some(
                            "HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\nfirst bytes"
                                .to_string(),
                        ),
                        Behavior::Never => None,
                    };
                    if let Some(answer) = answer {
                        let _ = stream.write_all(answer.as_bytes()).await;
                    }
                    // Wait for the client to close.
                    loop {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {}
                        }
                    }
                    c.lock().unwrap().push(Instant::now());
                });
            }
        });
        Upstream {
            port,
            accepted,
            closed,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    async fn wait_closed(&self, n: usize) -> Vec<Instant> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let closed = self.closed.lock().unwrap().clone();
            if closed.len() >= n {
                return closed;
            }
            assert!(
                Instant::now() < deadline,
                "upstream saw {} closes, wanted {n}",
                closed.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_is_denied_by_default_and_allowed_by_pattern() {
    let upstream = Upstream::start(Behavior::Answer(Duration::ZERO)).await;
    let fetch = format!("/fetch?url={}", upstream.url());

    let denied = Weir::start(&probe(), &[]);
    let resp = denied.get(&fetch).await;
    assert_eq!(resp.status, 502);
    assert_eq!(resp.text(), "ErrorCode::HttpRequestDenied");
    assert_eq!(upstream.accepted(), 0, "nothing was sent");
    let metrics = denied.admin_get("/metrics").await.text();
    assert!(
        metrics.contains("weir_outbound_refused_total{app=\"probe\",result=\"denied\"} 1"),
        "{metrics}"
    );

    let other_port = Weir::start(&probe(), &["--allow-outbound", "http://127.0.0.1:1"]);
    assert_eq!(
        other_port.get(&fetch).await.text(),
        "ErrorCode::HttpRequestDenied"
    );
    let https_only = Weir::start(&probe(), &["--allow-outbound", "https://127.0.0.1:*"]);
    assert_eq!(
        https_only.get(&fetch).await.text(),
        "ErrorCode::HttpRequestDenied"
    );
    assert_eq!(upstream.accepted(), 0);

    let allowed = Weir::start(&probe(), &["--allow-outbound", "http://127.0.0.1:*"]);
    let resp = allowed.get(&fetch).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.headers["x-upstream-status"], "200");
    assert_eq!(resp.text(), "upstream body");
    assert_eq!(upstream.accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_a_denied_host_is_not_followed() {
    let denied_target = Upstream::start(Behavior::Answer(Duration::ZERO)).await;
    let redirector = Upstream::start(Behavior::Redirect(denied_target.url())).await;
    let weir = Weir::start(
        &probe(),
        &[
            "--allow-outbound",
            &format!("http://127.0.0.1:{}", redirector.port),
        ],
    );
    let resp = weir.get(&format!("/fetch?url={}", redirector.url())).await;
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.headers["x-upstream-status"], "302",
        "the guest sees the redirect itself"
    );
    assert_eq!(redirector.accepted(), 1);
    assert_eq!(denied_target.accepted(), 0);
}

/// A client asks a guest to fetch from `upstream`, then leaves once the
/// upstream has the request (and, for a trickling upstream, the guest is
/// reading its body). The upstream must see its connection closed by the
/// abort on disconnect — long before the 10 s cancellation limit would
/// abandon the generation — and the guest, seeing only the abort, finishes
/// in time: cancelled, not abandoned.
async fn client_leaves_while_the_guest_waits_on(upstream: Upstream) {
    let weir = Weir::start(
        &probe(),
        &[
            "--allow-outbound",
            "http://127.0.0.1:*",
            "--limit",
            "cancellation_limit_ms=10000",
        ],
    );
    let mut client = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    client
        .write_all(
            format!(
                "GET /fetch?url={} HTTP/1.1\r\nhost: x\r\n\r\n",
                upstream.url()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    common::wait_for("the request at the upstream", || async {
        if upstream.accepted() > 0 {
            Ok(())
        } else {
            Err("nothing accepted".to_string())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let left = Instant::now();
    drop(client);
    let closed = upstream.wait_closed(1).await;
    let after = closed[0] - left;
    println!("upstream saw its connection closed {after:?} after the client left");
    assert!(
        after < Duration::from_secs(5),
        "closed by the abort, not by abandonment: {after:?}"
    );
    let receipt = weir.receipt_where(|r| r["outcome"] == "cancelled").await;
    assert_eq!(receipt["error"], "request_cancelled");
    assert_eq!(
        weir.status().await["apps"][0]["generations"]["abandoned"],
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_closes_the_upstream_connection() {
    client_leaves_while_the_guest_waits_on(Upstream::start(Behavior::Never).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_closes_the_upstream_connection() {
    client_leaves_while_the_guest_waits_on(Upstream::start(Behavior::Trickle).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_requests_at_once_run_128_and_refuse_the_rest() {
    let upstream = Upstream::start(Behavior::Answer(Duration::from_millis(300))).await;
    let weir = Weir::start(&probe(), &["--allow-outbound", "http://127.0.0.1:*"]);
    let resp = weir
        .get(&format!("/fetch-many?n=200&url={}", upstream.url()))
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "ok=128 capacity=72 other=0");
    assert_eq!(upstream.accepted(), 128, "the refused 72 started nothing");
    let receipt = weir
        .receipt_where(|r| r["outcome"] == "ok" && r["status"] == 200)
        .await;
    assert_eq!(receipt["operations"], 128, "{receipt}");
    assert_eq!(receipt["operations_refused"], 72, "{receipt}");
    let metrics = weir.admin_get("/metrics").await.text();
    assert!(
        metrics.contains(
            "weir_outbound_refused_total{app=\"probe\",result=\"event_operation_capacity\"} 72"
        ),
        "{metrics}"
    );
    // The scope is per event: the next event has all 128 again.
    let again = weir
        .get(&format!("/fetch-many?n=128&url={}", upstream.url()))
        .await;
    assert_eq!(again.text(), "ok=128 capacity=0 other=0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_left_running_at_the_end_of_an_event_is_aborted_and_never_delivered_later() {
    let never = Upstream::start(Behavior::Never).await;
    let weir = Weir::start(
        &probe(),
        &[
            "--allow-outbound",
            "http://127.0.0.1:*",
            "--limit",
            "max_concurrent=1",
        ],
    );
    // The guest starts a request to an upstream that never answers, keeps
    // the handle, and answers at once.
    let resp = weir
        .get(&format!("/fetch-stash?wait_ms=200&url={}", never.url()))
        .await;
    assert_eq!(resp.text(), "stashed\n");
    let ended = Instant::now();
    assert_eq!(never.accepted(), 1, "the request reached its upstream");
    let closed = never.wait_closed(1).await;
    println!(
        "upstream connection closed {:?} after the event ended",
        closed[0].saturating_duration_since(ended)
    );
    // The next event on the same generation finds the handle aborted.
    let collect = weir.get("/fetch-collect").await;
    assert_eq!(
        collect.text(),
        "error ErrorCode::InternalError(Some(\"event_operation_aborted\"))"
    );

    // An upstream that answers after the event ended: the answer is never
    // delivered into the next event.
    let late = Upstream::start(Behavior::Answer(Duration::from_millis(300))).await;
    assert_eq!(
        weir.get(&format!("/fetch-stash?wait_ms=100&url={}", late.url()))
            .await
            .text(),
        "stashed\n"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let collect = weir.get("/fetch-collect").await.text();
    assert!(collect.starts_with("error "), "{collect}");
    assert!(!collect.contains("delivered"), "{collect}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_timeouts_and_response_size_are_bounded_by_the_limits() {
    let never = Upstream::start(Behavior::Never).await;
    let large = Upstream::start(Behavior::Large(100_000)).await;
    let weir = Weir::start(
        &probe(),
        &[
            "--allow-outbound",
            "http://127.0.0.1:*",
            "--limit",
            "outbound_first_byte_timeout_ms=300",
            "--limit",
            "max_outbound_response_bytes=50000",
            "--limit",
            "event_limit_ms=5000",
        ],
    );
    let started = Instant::now();
    let resp = weir.get(&format!("/fetch?url={}", never.url())).await;
    assert_eq!(resp.status, 502);
    assert_eq!(resp.text(), "ErrorCode::ConnectionReadTimeout");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the first-byte limit applied"
    );
    never.wait_closed(1).await;

    let resp = weir.get(&format!("/fetch?url={}", large.url())).await;
    assert_eq!(resp.status, 502);
    // The guest's read of the body fails at the cap: it never gets the
    // whole 100,000 bytes. (wasi-http 48 does not attach the error code to
    // the stream error for this case.)
    assert!(resp.text().starts_with("body failed:"), "{}", resp.text());
    let within = weir
        .get(&format!(
            "/fetch?url={}",
            Upstream::start(Behavior::Large(50_000)).await.url()
        ))
        .await;
    assert_eq!(within.status, 200, "a body at the cap is delivered");
    assert_eq!(within.body.unwrap().len(), 50_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_streams_a_request_body_upstream() {
    let counter = Upstream::start(Behavior::Count).await;
    let weir = Weir::start(&probe(), &["--allow-outbound", "http://127.0.0.1:*"]);
    let n = 300_000;
    let resp = weir
        .get(&format!("/post?bytes={n}&url={}", counter.url()))
        .await;
    assert_eq!(resp.status, 200, "{:?}", resp.body);
    let expected: u64 = (0..n).map(|i| (i % 251) as u64).sum();
    assert_eq!(resp.text(), format!("{n} {expected}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_closes_the_upstream_connection_of_the_abandoned_event() {
    let never = Upstream::start(Behavior::Never).await;
    let weir = Weir::start(
        &probe(),
        &[
            "--allow-outbound",
            "http://127.0.0.1:*",
            "--limit",
            "event_limit_ms=300",
        ],
    );
    let resp = weir.get(&format!("/fetch?url={}", never.url())).await;
    resp.assert_weir_error(503, "event_deadline_exceeded");
    never.wait_closed(1).await;
    assert_eq!(
        weir.status().await["apps"][0]["generations"]["abandoned"],
        1
    );
    assert_eq!(weir.get("/hello").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connect_timeout_comes_from_the_limit() {
    // A listener that never accepts, with its backlog filled: further
    // connection attempts get no answer at all.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..8 {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            fillers.push(s);
        }
    }
    let weir = Weir::start(
        &probe(),
        &[
            "--allow-outbound",
            "http://127.0.0.1:*",
            "--limit",
            "outbound_connect_timeout_ms=300",
            "--limit",
            "event_limit_ms=5000",
        ],
    );
    let started = Instant::now();
    let resp = weir.get(&format!("/fetch?url=http://{addr}/")).await;
    assert_eq!(resp.status, 502);
    assert_eq!(resp.text(), "ErrorCode::ConnectionTimeout");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    drop(listener);
}

/// Set inside the network namespace the test below runs its body in.
const IN_NETNS: &str = "WEIR_TEST_IN_NETNS";

/// Whether the metadata service, link-local and loopback addresses are
/// reached under `http://*:*`, by address and by a name that resolves to
/// them. Run in a network namespace of its own with only a loopback
/// interface (and a hosts file of the test's), so that a refusal that
/// failed would send no packet anywhere.
#[test]
fn a_wildcard_allow_list_reaches_no_metadata_link_local_or_loopback_address() {
    if std::env::var_os(IN_NETNS).is_some() {
        return tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(guarded_addresses_inside_a_namespace());
    }
    let hosts = weir_scratch::dir("netns-hosts");
    std::fs::write(
        &hosts,
        "127.0.0.1 localhost\n169.254.169.254 meta.test\nfd00:ec2::254 meta6.test\n127.0.0.1 loop.test\n10.99.0.1 private.test\n",
    )
    .unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new("unshare")
        .args(["--net", "--mount", "sh", "-c"])
        .arg(format!(
            "ip link set lo up && mount --bind {} /etc/hosts && exec \"$0\" \"$@\"",
            hosts.display()
        ))
        .arg(&exe)
        .args([
            "--exact",
            "a_wildcard_allow_list_reaches_no_metadata_link_local_or_loopback_address",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(IN_NETNS, "1")
        .spawn()
        .expect("unshare runs (util-linux; the tests run as root)");
    let status = common::exit_within(&mut child, Duration::from_secs(120))
        .expect("the test's body in its namespace ended within two minutes");
    assert!(
        status.success(),
        "the body in its namespace failed: {status}"
    );
}

async fn guarded_addresses_inside_a_namespace() {
    // Only loopback here: nothing leaves this namespace.
    let links = common::output_within(
        std::process::Command::new("ip").args(["-o", "link"]),
        common::EXITS_WITHIN,
    );
    let links = String::from_utf8_lossy(&links.stdout);
    assert_eq!(links.lines().count(), 1, "only loopback: {links}");
    let weir = Weir::start(&probe(), &["--allow-outbound", "http://*:*"]);
    let upstream = Upstream::start(Behavior::Answer(Duration::ZERO)).await;
    for url in [
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://meta.test/latest/meta-data/".to_string(),
        "http://[fd00:ec2::254]/latest/meta-data/".to_string(),
        "http://meta6.test/".to_string(),
        "http://169.254.1.1/".to_string(),
        "http://[fe80::1]/".to_string(),
        "http://100.100.100.200/".to_string(),
        // This machine's other listeners: not named, not reached.
        upstream.url(),
        format!("http://loop.test:{}/", upstream.port),
        format!("http://[::ffff:127.0.0.1]:{}/", upstream.port),
    ] {
        let r = weir.get(&format!("/fetch?url={url}")).await;
        assert_eq!(r.text(), "ErrorCode::HttpRequestDenied", "{url}");
    }
    assert_eq!(upstream.accepted(), 0, "nothing reached the upstream");
    // An address of no guarded kind is not refused for its kind (here it
    // has no route: nothing leaves the namespace).
    let r = weir.get("/fetch?url=http://private.test/").await;
    assert_ne!(r.text(), "ErrorCode::HttpRequestDenied");
    // A pattern that names the address itself reaches it.
    let named = Weir::start(
        &probe(),
        &[
            "--allow-outbound",
            &format!("http://127.0.0.1:{}", upstream.port),
        ],
    );
    let r = named.get(&format!("/fetch?url={}", upstream.url())).await;
    assert_eq!(r.status, 200, "{}", r.text());
}
