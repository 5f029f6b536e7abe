//! A black-box fuzz run of the transport: malformed request lines and
//! heads, bad and conflicting body framing, broken chunked encoding,
//! pipelined requests and raw noise, over many connections at once, against
//! a real `weir serve`. It stops by itself after `WEIR_FUZZ_REQUESTS`
//! requests (default 20,000; `bench/RESULTS.md` records a 200,000 run) and
//! asserts that the server is alive, logged no panic, and that everything
//! it answered was a well-formed HTTP/1.1 response.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Weir, probe};

/// A small deterministic generator (xorshift64*), so a failing run can be
/// repeated from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

const METHODS: &[&str] = &[
    "GET", "POST", "PUT", "HEAD", "DELETE", "OPTIONS", "PATCH", "TRACE", "CONNECT", "get", "G E T",
    "", "BREW", "\u{0}GET",
];
const TARGETS: &[&str] = &[
    "/hello",
    "/echo",
    "/status?code=204",
    "/status?code=304",
    "/large?bytes=70000",
    "/counter",
    "*",
    "http://x/hello",
    "/%zz",
    "/../../etc/passwd",
    "//",
    "/hello?a=b&&=",
    "hello",
    "/\u{7f}",
];
const VERSIONS: &[&str] = &[
    "HTTP/1.1",
    "HTTP/1.0",
    "HTTP/2.0",
    "HTTP/1.1 extra",
    "http/1.1",
    "",
    "HTTP/9.9",
];
const HEADERS: &[&str] = &[
    "host: x",
    "content-length: 5",
    "content-length: -1",
    "content-length: 5, 6",
    "content-length: 99999999999999999999",
    "transfer-encoding: chunked",
    "transfer-encoding: gzip, chunked",
    "transfer-encoding: identity",
    "connection: close",
    "connection: keep-alive, upgrade",
    "upgrade: websocket",
    "expect: 100-continue",
    "x-a: \u{1}\u{2}",
    "no colon here",
    ": empty name",
    "x-long: AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    " leading-space: x",
    "x-unicode: ünïcödé",
];
const CHUNKS: &[&str] = &[
    "5\r\nhello\r\n0\r\n\r\n",
    "zz\r\nhello\r\n0\r\n\r\n",
    "5\r\nhel",
    "ffffffffffffffff\r\nx\r\n",
    "5;ext=1\r\nhello\r\n0\r\nx-trailer: t\r\n\r\n",
    "0\r\n\r\n",
    "5\r\nhelloXX0\r\n\r\n",
    "-1\r\n\r\n",
];

/// One connection's worth of bytes: one or more (pipelined) requests, and
/// how many of them.
fn generate(rng: &mut Rng) -> (Vec<u8>, u64) {
    let mut out = Vec::new();
    let requests = 1 + rng.below(3);
    for _ in 0..requests {
        match rng.below(10) {
            // Raw noise.
            0 => {
                let n = rng.below(300) as usize;
                out.extend(rng.bytes(n));
            }
            // A well-formed request.
            1..=3 => {
                let target = rng.pick(&["/hello", "/echo", "/counter", "/status?code=201"]);
                let len = rng.below(64) as usize;
                let body = rng.bytes(len);
                out.extend(
                    format!(
                        "POST {target} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    )
                    .as_bytes(),
                );
                out.extend(body);
            }
            // A request assembled from good and bad parts.
            _ => {
                let line = format!(
                    "{} {} {}",
                    rng.pick(METHODS),
                    rng.pick(TARGETS),
                    rng.pick(VERSIONS)
                );
                out.extend(line.as_bytes());
                out.extend(if rng.below(8) == 0 {
                    &b"\n"[..]
                } else {
                    b"\r\n"
                });
                for _ in 0..rng.below(6) {
                    out.extend(rng.pick(HEADERS).as_bytes());
                    out.extend(b"\r\n");
                }
                if rng.below(10) != 0 {
                    out.extend(b"\r\n");
                }
                match rng.below(4) {
                    0 => out.extend(rng.pick(CHUNKS).as_bytes()),
                    1 => {
                        let n = rng.below(20) as usize;
                        out.extend(rng.bytes(n));
                    }
                    _ => {}
                }
            }
        }
    }
    (out, requests)
}

/// Is `answer` one or more well-formed HTTP/1.x responses (as far as it
/// goes)? Only the status lines are checked: what follows a status line
/// belongs to hyper's framing, which the client side cannot fully parse
/// once the input was garbage.
fn well_formed(answer: &[u8]) -> bool {
    let text = String::from_utf8_lossy(answer);
    let Some(first) = text.lines().next() else {
        return true;
    };
    let mut parts = first.splitn(3, ' ');
    matches!(parts.next(), Some("HTTP/1.1" | "HTTP/1.0"))
        && parts
            .next()
            .is_some_and(|s| s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()))
}

fn exchange(addr: SocketAddr, bytes: &[u8], pieces: usize) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let step = bytes.len().div_ceil(pieces.max(1)).max(1);
    for chunk in bytes.chunks(step) {
        if s.write_all(chunk).is_err() {
            break; // the server closed first: fine, read what it said
        }
    }
    let _ = s.shutdown(Shutdown::Write);
    let mut answer = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => return Err(e),
        }
    }
    Ok(answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fuzzed_transport_stays_up_answers_well_formed_and_never_panics() {
    let requests: u64 = std::env::var("WEIR_FUZZ_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let seed: u64 = std::env::var("WEIR_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_f00d);
    const CONNECTIONS: u64 = 16;
    let weir = Weir::start(
        &probe(),
        &[
            "--limit",
            "header_read_timeout_ms=2000",
            "--limit",
            "body_idle_timeout_ms=2000",
        ],
    );
    let addr = weir.addr;
    let sent = Arc::new(AtomicU64::new(0));
    let answered = Arc::new(AtomicU64::new(0));
    let silent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|w| {
            let (sent, answered, silent) = (sent.clone(), answered.clone(), silent.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let mut rng = Rng(seed ^ (w + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                while sent.load(Ordering::Relaxed) < requests {
                    let (bytes, n) = generate(&mut rng);
                    sent.fetch_add(n, Ordering::Relaxed);
                    let pieces = 1 + rng.below(3) as usize;
                    let answer = exchange(addr, &bytes, pieces)
                        .map_err(|e| format!("{e} after {:?}", String::from_utf8_lossy(&bytes)))?;
                    if answer.is_empty() {
                        silent.fetch_add(1, Ordering::Relaxed);
                    } else if well_formed(&answer) {
                        answered.fetch_add(1, Ordering::Relaxed);
                    } else {
                        return Err(format!(
                            "malformed answer {:?} to {:?}",
                            String::from_utf8_lossy(&answer[..answer.len().min(200)]),
                            String::from_utf8_lossy(&bytes)
                        ));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        tokio::task::spawn_blocking(move || w.join().unwrap())
            .await
            .unwrap()
            .unwrap();
    }
    let took = started.elapsed();
    println!(
        "{} requests on {} connections in {took:?}: {} connections answered, {} closed without an answer (seed {seed:#x})",
        sent.load(Ordering::Relaxed),
        answered.load(Ordering::Relaxed) + silent.load(Ordering::Relaxed),
        answered.load(Ordering::Relaxed),
        silent.load(Ordering::Relaxed)
    );
    // Alive, healthy, serving, and nothing panicked.
    assert_eq!(weir.get("/hello").await.status, 200);
    assert_eq!(weir.admin_get("/healthz").await.status, 200);
    let log = weir.log();
    // The probe guest may trap on fuzzed input (its own panic message is
    // a `weir::guest` record in Weir's log); Weir must not.
    let panics: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("panicked") && !l.contains("\"target\":\"weir::guest\""))
        .collect();
    assert!(panics.is_empty(), "panics logged: {panics:#?}");
    assert!(answered.load(Ordering::Relaxed) > 0);
}
