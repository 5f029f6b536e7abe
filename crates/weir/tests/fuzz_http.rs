//! A black-box fuzz run of the transport: malformed request lines and
//! heads, bad and conflicting body framing, broken chunked encoding,
//! pipelined requests and raw noise, over many connections at once, against
//! a real `weir serve`. It stops by itself after `WEIR_FUZZ_REQUESTS`
//! requests (default 20,000; `bench/RESULTS.md` records a 200,000 run) and
//! asserts that the server is alive, logged no panic, that everything it
//! answered was a sequence of well-formed, complete HTTP/1.1 responses,
//! that every well-formed request not preceded by a malformed one was
//! served, and that few connections closed without an answer.

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

/// What the generator meant one request of a connection to be.
#[derive(Clone, Copy, Debug)]
struct Sent {
    /// Generated well-formed (an assembled request may happen to be one
    /// too, but is not counted on).
    well_formed: bool,
    /// Its method is HEAD: its response has no body, whatever its headers
    /// say.
    head: bool,
}

/// One connection's worth of bytes: one or more (pipelined) requests, and
/// what each was meant to be.
fn generate(rng: &mut Rng) -> (Vec<u8>, Vec<Sent>) {
    let mut out = Vec::new();
    let mut sent = Vec::new();
    let requests = 1 + rng.below(3);
    for _ in 0..requests {
        match rng.below(10) {
            // Raw noise.
            0 => {
                let n = rng.below(300) as usize;
                out.extend(rng.bytes(n));
                sent.push(Sent {
                    well_formed: false,
                    head: false,
                });
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
                sent.push(Sent {
                    well_formed: true,
                    head: false,
                });
            }
            // A request assembled from good and bad parts.
            _ => {
                let method = rng.pick(METHODS);
                sent.push(Sent {
                    well_formed: false,
                    head: method == "HEAD",
                });
                let line = format!("{method} {} {}", rng.pick(TARGETS), rng.pick(VERSIONS));
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
    (out, sent)
}

/// The statuses of the final responses in `answer`, which must be a
/// sequence of complete, well-formed HTTP/1.x responses, one per request
/// answered, in order (interim 1xx responses, such as a `100 Continue`,
/// are skipped). A response is framed as its request and headers say: no
/// body for a HEAD, a 204 or a 304; else chunked, or by content-length, or
/// up to the end of the connection.
fn statuses(answer: &[u8], sent: &[Sent]) -> Result<Vec<u16>, String> {
    let mut rest = answer;
    let mut statuses = Vec::new();
    while !rest.is_empty() {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut headers);
        let head = match response.parse(rest) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Err("a response head cut short".into()),
            Err(e) => return Err(format!("a malformed response head: {e}")),
        };
        if response.version.is_none() {
            return Err("a response without a version".into());
        }
        let code = response.code.ok_or("a response without a status")?;
        let header = |name: &str| {
            response
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).to_ascii_lowercase())
        };
        let chunked = header("transfer-encoding").is_some_and(|t| t.ends_with("chunked"));
        let length = header("content-length");
        rest = &rest[head..];
        if (100..200).contains(&code) {
            continue;
        }
        // Bytes after a request the generator made may read as one more
        // (a body longer than its content-length says): its answer is an
        // error, and the last.
        let head_request = match sent.get(statuses.len()) {
            Some(request) => request.head,
            None if (400..500).contains(&code) => false,
            None => return Err(format!("a {code} past the requests sent")),
        };
        let body = if head_request || code == 204 || code == 304 {
            0
        } else if chunked {
            chunked_length(rest)?
        } else if let Some(length) = length {
            length
                .trim()
                .parse::<usize>()
                .map_err(|e| format!("content-length {length:?}: {e}"))?
        } else {
            rest.len()
        };
        if rest.len() < body {
            return Err(format!(
                "a body of {body} bytes cut short at {}",
                rest.len()
            ));
        }
        rest = &rest[body..];
        if statuses.len() >= sent.len() && !rest.is_empty() {
            return Err("more after the answer past the requests sent".into());
        }
        statuses.push(code);
    }
    Ok(statuses)
}

/// The length, framing included, of the chunked body that `bytes` starts
/// with.
fn chunked_length(bytes: &[u8]) -> Result<usize, String> {
    let mut at = 0;
    loop {
        let line_end = bytes[at..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk size cut short")?;
        let line = String::from_utf8_lossy(&bytes[at..at + line_end]).into_owned();
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| format!("a chunk size {line:?}: {e}"))?;
        at += line_end + 2;
        if size == 0 {
            // Trailers, up to an empty line.
            loop {
                let end = bytes[at..]
                    .windows(2)
                    .position(|w| w == b"\r\n")
                    .ok_or("trailers cut short")?;
                at += end + 2;
                if end == 0 {
                    return Ok(at);
                }
            }
        }
        at += size + 2;
        if at > bytes.len() {
            return Err("a chunk cut short".into());
        }
    }
}

/// Sends `bytes` in `pieces` writes and reads the answer. The client
/// shuts its side only once `owed` says the answers it is owed are in: a
/// server takes a client's end (EOF) mid-request for a disconnect and
/// cancels what it was doing, as it should, so an earlier half-close
/// would cost the answers the test requires.
fn exchange(
    addr: SocketAddr,
    bytes: &[u8],
    pieces: usize,
    owed: impl Fn(&[u8]) -> bool,
) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let step = bytes.len().div_ceil(pieces.max(1)).max(1);
    for chunk in bytes.chunks(step) {
        if s.write_all(chunk).is_err() {
            break; // the server closed first: fine, read what it said
        }
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 16384];
    let mut shut = false;
    loop {
        if !shut && owed(&answer) {
            let _ = s.shutdown(Shutdown::Write);
            shut = true;
        }
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
                    let (bytes, kinds) = generate(&mut rng);
                    sent.fetch_add(kinds.len() as u64, Ordering::Relaxed);
                    let pieces = 1 + rng.below(3) as usize;
                    // Every well-formed request before the first that was
                    // not is answered, and served.
                    let owed = kinds.iter().take_while(|k| k.well_formed).count();
                    let answered_all_owed = |answer: &[u8]| {
                        owed == 0 || statuses(answer, &kinds).is_ok_and(|c| c.len() >= owed)
                    };
                    let answer = exchange(addr, &bytes, pieces, answered_all_owed)
                        .map_err(|e| format!("{e} after {:?}", String::from_utf8_lossy(&bytes)))?;
                    let shown = || {
                        format!(
                            "{:?} to {:?}",
                            String::from_utf8_lossy(&answer[..answer.len().min(400)]),
                            String::from_utf8_lossy(&bytes)
                        )
                    };
                    let codes = statuses(&answer, &kinds)
                        .map_err(|e| format!("{e}: the answer {}", shown()))?;
                    if codes.len() < owed || codes[..owed].iter().any(|c| !(200..300).contains(c)) {
                        return Err(format!(
                            "{owed} well-formed requests got {codes:?}: the answer {}",
                            shown()
                        ));
                    }
                    if codes.is_empty() {
                        silent.fetch_add(1, Ordering::Relaxed);
                    } else {
                        answered.fetch_add(1, Ordering::Relaxed);
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
    // Nearly every connection gets an answer: only one whose first bytes
    // never make a head hyper can refuse (a head cut short, then the
    // client's end) is closed without one: 24 of 10,036 with the default
    // seed.
    let (answered, silent) = (
        answered.load(Ordering::Relaxed),
        silent.load(Ordering::Relaxed),
    );
    assert!(
        silent * 100 <= (answered + silent) * SILENT_PERCENT_AT_MOST,
        "{silent} of {} connections closed without an answer",
        answered + silent
    );
}

/// The share of fuzzed connections that may be closed without an answer:
/// those whose first bytes never make a head (0.2 % with the default
/// seed; other seeds vary around that).
const SILENT_PERCENT_AT_MOST: u64 = 2;
