//! The test guest: one `wasi:http/proxy` component whose path selects a
//! behaviour, so that Weir's tests can provoke every runtime and transport
//! failure from outside with a real component.
//!
//! | path | behaviour |
//! |---|---|
//! | `/hello` | a fixed greeting |
//! | `/echo` | the request body back; `x-*` request headers copied to the response; `x-method` and `x-uri` say what the guest saw |
//! | `/counter` | increments a global held in linear memory and answers its value |
//! | `/trap` | traps before sending headers |
//! | `/loop` | spins forever before sending headers |
//! | `/sleep?ms=N` | sleeps N ms, then answers |
//! | `/stream?chunks=N&size=S&delay_ms=D` | N chunks of S bytes, D ms apart |
//! | `/trap-after-headers` | sends headers and a first chunk, then traps |
//! | `/stall-after-headers?ms=N` | sends headers and a first chunk, then sleeps N ms |
//! | `/cookies` | two `set-cookie` headers |
//! | `/status?code=N` | status N with a non-empty body |
//! | `/grow?mb=N` | grows and touches N MiB of linear memory, then answers |
//! | `/large?bytes=N` | N bytes of a repeating pattern |
//! | `/declared-length?len=N` | declares `content-length: N`, writes nothing |
//! | `/declared-length-then-fail?len=N` | declares `content-length: N`, then traps before writing anything (as a `wstd` guest does when finishing the empty body fails) |
//! | `/fetch?url=U` | GETs `U` (outbound HTTP); answers its status in `x-upstream-status` and its body, or 502 and the error |
//! | `/post?url=U&bytes=N` | POSTs N bytes to `U`, streamed in 4 KiB writes; answers like `/fetch` |
//! | `/fetch-many?url=U&n=N` | starts N GETs of `U` at once, waits for all; answers `ok=A capacity=B other=C` |
//! | `/fetch-stash?url=U&wait_ms=W` | starts a GET of `U`, waits W ms, keeps its handle in a global and answers |
//! | `/fetch-collect` | waits on the handle a previous event stashed; answers what it got |

use std::cell::Cell;

use wasi::http::outgoing_handler;
use wasi::http::types::{
    ErrorCode, Fields, FutureIncomingResponse, IncomingRequest, OutgoingBody, OutgoingRequest,
    OutgoingResponse, OutputStream, ResponseOutparam, Scheme,
};

struct Probe;

thread_local! {
    static COUNTER: Cell<u64> = const { Cell::new(0) };
}

/// Memory grown by `/grow` stays reachable so it is not freed between calls.
static mut HOARD: Vec<Vec<u8>> = Vec::new();

/// What `/taint` writes and `/scan` looks for.
const TAINT: u8 = 0xA5;

thread_local! {
    static STASHED: std::cell::RefCell<Option<FutureIncomingResponse>> =
        const { std::cell::RefCell::new(None) };
}

fn query_str<'a>(path: &'a str, name: &str) -> Option<&'a str> {
    let (_, q) = path.split_once('?')?;
    q.split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Starts a GET of `http://authority/path`.
fn start_get(url: &str) -> Result<FutureIncomingResponse, ErrorCode> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let request = OutgoingRequest::new(Fields::new());
    request.set_scheme(Some(&Scheme::Http)).expect("scheme");
    request.set_authority(Some(authority)).expect("authority");
    request.set_path_with_query(Some(path)).expect("path");
    outgoing_handler::handle(request, None)
}

/// Starts a POST of `bytes` pattern bytes to `http://authority/path`,
/// writing the body while the request is in flight.
fn post(url: &str, bytes: usize) -> Result<FutureIncomingResponse, ErrorCode> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let headers = Fields::from_list(&[("content-length".into(), bytes.to_string().into_bytes())])
        .expect("valid header");
    let request = OutgoingRequest::new(headers);
    request
        .set_method(&wasi::http::types::Method::Post)
        .expect("method");
    request.set_scheme(Some(&Scheme::Http)).expect("scheme");
    request.set_authority(Some(authority)).expect("authority");
    request.set_path_with_query(Some(path)).expect("path");
    let body = request.body().expect("body once");
    let future = outgoing_handler::handle(request, None)?;
    let stream = body.write().expect("stream once");
    let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    write_all(&stream, &data);
    drop(stream);
    OutgoingBody::finish(body, None)?;
    Ok(future)
}

/// Waits for a started GET: its status and body, or the error's name.
fn finish_get(future: &FutureIncomingResponse) -> Result<(u16, Vec<u8>), String> {
    future.subscribe().block();
    match future.get() {
        Some(Ok(Ok(response))) => {
            let status = response.status();
            let body = response.consume().map_err(|_| "body taken".to_string())?;
            let stream = body.stream().map_err(|_| "stream taken".to_string())?;
            let mut bytes = Vec::new();
            loop {
                match stream.blocking_read(65536) {
                    Ok(chunk) => bytes.extend_from_slice(&chunk),
                    Err(wasi::io::streams::StreamError::Closed) => break,
                    Err(wasi::io::streams::StreamError::LastOperationFailed(e)) => {
                        return Err(format!(
                            "body failed: {:?}",
                            wasi::http::types::http_error_code(&e)
                        ))
                    }
                }
            }
            Ok((status, bytes))
        }
        Some(Ok(Err(code))) => Err(format!("{code:?}")),
        Some(Err(())) => Err("already taken".into()),
        None => Err("not ready".into()),
    }
}

/// Waits for an outbound request and answers with what it got: the
/// upstream's status in `x-upstream-status` and its body, or 502 and the
/// error's name.
fn answer_upstream(out: ResponseOutparam, started: Result<FutureIncomingResponse, ErrorCode>) {
    match started
        .map_err(|e| format!("{e:?}"))
        .and_then(|f| finish_get(&f))
    {
        Ok((status, body)) => {
            let status = status.to_string();
            let (out_body, stream) = respond(out, 200, &[("x-upstream-status", status.as_bytes())]);
            answer_if_heard(out_body, stream, &body);
        }
        Err(e) => {
            let (out_body, stream) = respond(out, 502, &[("content-type", b"text/plain")]);
            answer_if_heard(out_body, stream, e.as_bytes());
        }
    }
}

/// Writes a body, stopping quietly if the client has gone: the fetch
/// routes are also used to show that a guest whose client left finishes
/// in time (cancelled, not abandoned), so a failed write is not a trap.
fn answer_if_heard(out_body: OutgoingBody, stream: OutputStream, bytes: &[u8]) {
    for chunk in bytes.chunks(4096) {
        if stream.blocking_write_and_flush(chunk).is_err() {
            return;
        }
    }
    drop(stream);
    let _ = OutgoingBody::finish(out_body, None);
}

fn query(path: &str, name: &str) -> Option<u64> {
    let (_, q) = path.split_once('?')?;
    q.split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v.parse().ok())
}

fn sleep_ms(ms: u64) {
    wasi::clocks::monotonic_clock::subscribe_duration(ms * 1_000_000).block();
}

fn respond(
    out: ResponseOutparam,
    status: u16,
    headers: &[(&str, &[u8])],
) -> (OutgoingBody, OutputStream) {
    let list: Vec<(String, Vec<u8>)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_vec()))
        .collect();
    let fields = Fields::from_list(&list).expect("headers are valid");
    let response = OutgoingResponse::new(fields);
    response.set_status_code(status).expect("status is valid");
    let body = response.body().expect("body is taken once");
    ResponseOutparam::set(out, Ok(response));
    let stream = body.write().expect("stream is taken once");
    (body, stream)
}

fn write_all(stream: &OutputStream, bytes: &[u8]) {
    // `blocking-write-and-flush` accepts at most 4096 bytes per call.
    for chunk in bytes.chunks(4096) {
        stream
            .blocking_write_and_flush(chunk)
            .expect("client accepts the body");
    }
}

fn finish(body: OutgoingBody, stream: OutputStream) {
    drop(stream);
    OutgoingBody::finish(body, None).expect("body is complete");
}

fn simple(out: ResponseOutparam, status: u16, text: &[u8]) {
    let (body, stream) = respond(out, status, &[("content-type", b"text/plain")]);
    write_all(&stream, text);
    finish(body, stream);
}

fn read_body(request: &IncomingRequest) -> Vec<u8> {
    let body = request.consume().expect("body is consumed once");
    let stream = body.stream().expect("stream is taken once");
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(65536) {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(wasi::io::streams::StreamError::Closed) => break,
            Err(e) => panic!("request body failed: {e:?}"),
        }
    }
    bytes
}

impl wasi::exports::http::incoming_handler::Guest for Probe {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let route = path.split('?').next().unwrap_or("");
        match route {
            "/hello" => simple(out, 200, b"hello from weir\n"),
            "/echo" => {
                let method = format!("{:?}", request.method());
                let mut headers: Vec<(String, Vec<u8>)> = request
                    .headers()
                    .entries()
                    .into_iter()
                    .filter(|(k, _)| k.starts_with("x-"))
                    .collect();
                headers.push(("x-method".into(), method.into_bytes()));
                headers.push(("x-uri".into(), path.clone().into_bytes()));
                let bytes = read_body(&request);
                let borrowed: Vec<(&str, &[u8])> = headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_slice()))
                    .collect();
                let (body, stream) = respond(out, 200, &borrowed);
                write_all(&stream, &bytes);
                finish(body, stream);
            }
            "/counter" => {
                let n = COUNTER.with(|c| {
                    c.set(c.get() + 1);
                    c.get()
                });
                simple(out, 200, n.to_string().as_bytes());
            }
            "/trap" => panic!("probe traps before headers"),
            "/loop" => {
                let mut x: u64 = 0;
                loop {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
            // Computes `m` million additions, then answers: a request that
            // is a long computation but ends.
            "/compute" => {
                let mut x: u64 = 0;
                for _ in 0..query(&path, "m").unwrap_or(0) * 1_000_000 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                simple(out, 200, x.to_string().as_bytes());
            }
            "/sleep" => {
                sleep_ms(query(&path, "ms").unwrap_or(0));
                simple(out, 200, b"slept\n");
            }
            "/stream" => {
                let chunks = query(&path, "chunks").unwrap_or(4);
                let size = query(&path, "size").unwrap_or(1024) as usize;
                let delay = query(&path, "delay_ms").unwrap_or(0);
                // A wait before the response is set (a client may leave
                // meanwhile).
                sleep_ms(query(&path, "wait_ms").unwrap_or(0));
                let (body, stream) = respond(out, 200, &[]);
                for i in 0..chunks {
                    if i > 0 && delay > 0 {
                        sleep_ms(delay);
                    }
                    write_all(&stream, &vec![b'a' + (i % 26) as u8; size]);
                }
                finish(body, stream);
            }
            "/trap-after-headers" => {
                let (_body, stream) = respond(out, 200, &[]);
                write_all(&stream, b"partial");
                sleep_ms(20);
                panic!("probe traps after headers");
            }
            "/stall-after-headers" => {
                let (body, stream) = respond(out, 200, &[]);
                write_all(&stream, b"partial");
                sleep_ms(query(&path, "ms").unwrap_or(60_000));
                finish(body, stream);
            }
            "/cookies" => simple_with(
                out,
                &[
                    ("set-cookie", b"a=1; Path=/"),
                    ("set-cookie", b"b=2; Path=/"),
                ],
            ),
            "/status" => {
                let code = query(&path, "code").unwrap_or(200) as u16;
                simple(out, code, b"this body must not reach the client\n");
            }
            "/grow" => {
                let mb = query(&path, "mb").unwrap_or(1) as usize;
                let block = vec![7u8; mb << 20];
                let sum: u64 = block.iter().step_by(4096).map(|b| *b as u64).sum();
                // SAFETY: the guest is single-threaded; nothing else touches HOARD.
                unsafe { (*std::ptr::addr_of_mut!(HOARD)).push(block) };
                simple(out, 200, sum.to_string().as_bytes());
            }
            // Leaves a taint for a later instance to look for: a 128 KiB
            // stack buffer and `kb` KiB of kept heap, every byte TAINT.
            "/taint" => {
                let kb = query(&path, "kb").unwrap_or(1024) as usize;
                let stack = std::hint::black_box([TAINT; 128 << 10]);
                let heap = std::hint::black_box(vec![TAINT; kb << 10]);
                // SAFETY: the guest is single-threaded; nothing else touches HOARD.
                unsafe { (*std::ptr::addr_of_mut!(HOARD)).push(heap) };
                simple(out, 200, stack.len().to_string().as_bytes());
            }
            // Counts the 4 KiB pages of linear memory (all but the first,
            // which holds address 0) that are TAINT through and through:
            // what an earlier instance left.
            "/scan" => {
                let bytes = core::arch::wasm32::memory_size(0) << 16;
                let mut tainted = 0usize;
                for page in (4096..bytes).step_by(4096) {
                    // SAFETY: every address below memory_size is linear
                    // memory; it is only read.
                    let whole = (page..page + 4096)
                        .all(|a| unsafe { core::ptr::read_volatile(a as *const u8) } == TAINT);
                    tainted += whole as usize;
                }
                simple(out, 200, tainted.to_string().as_bytes());
            }
            "/large" => {
                let n = query(&path, "bytes").unwrap_or(0) as usize;
                let bytes: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
                let (body, stream) = respond(out, 200, &[]);
                write_all(&stream, &bytes);
                finish(body, stream);
            }
            "/declared-length" => {
                let len = query(&path, "len").unwrap_or(0).to_string();
                let (body, stream) = respond(out, 200, &[("content-length", len.as_bytes())]);
                drop(stream);
                drop(body);
            }
            "/declared-length-then-fail" => {
                let len = query(&path, "len").unwrap_or(0).to_string();
                let (_body, _stream) = respond(out, 200, &[("content-length", len.as_bytes())]);
                // Trap at once, with no panic message to print first: the
                // response and the trap reach Weir in the same poll.
                core::arch::wasm32::unreachable();
            }
            "/fetch" => {
                let url = query_str(&path, "url").unwrap_or("").to_string();
                answer_upstream(out, start_get(&url));
            }
            "/post" => {
                let url = query_str(&path, "url").unwrap_or("").to_string();
                let bytes = query(&path, "bytes").unwrap_or(0) as usize;
                answer_upstream(out, post(&url, bytes));
            }
            "/fetch-many" => {
                let url = query_str(&path, "url").unwrap_or("").to_string();
                let n = query(&path, "n").unwrap_or(1);
                let started: Vec<_> = (0..n).map(|_| start_get(&url)).collect();
                let (mut ok, mut capacity, mut other) = (0, 0, 0);
                for f in &started {
                    match f
                        .as_ref()
                        .map_err(|e| format!("{e:?}"))
                        .and_then(finish_get)
                    {
                        Ok(_) => ok += 1,
                        Err(e) if e.contains("event_operation_capacity") => capacity += 1,
                        Err(_) => other += 1,
                    }
                }
                let text = format!("ok={ok} capacity={capacity} other={other}");
                simple(out, 200, text.as_bytes());
            }
            "/fetch-stash" => {
                let url = query_str(&path, "url").unwrap_or("").to_string();
                match start_get(&url) {
                    Ok(f) => {
                        // Give the request time to reach its upstream.
                        sleep_ms(query(&path, "wait_ms").unwrap_or(0));
                        STASHED.with(|s| *s.borrow_mut() = Some(f));
                        simple(out, 200, b"stashed\n");
                    }
                    Err(e) => simple(out, 502, format!("{e:?}").as_bytes()),
                }
            }
            "/fetch-collect" => {
                let stashed = STASHED.with(|s| s.borrow_mut().take());
                let text = match stashed {
                    None => "nothing stashed".to_string(),
                    Some(f) => match finish_get(&f) {
                        Ok((status, body)) => {
                            format!("delivered {status} {}", String::from_utf8_lossy(&body))
                        }
                        Err(e) => format!("error {e}"),
                    },
                };
                simple(out, 200, text.as_bytes());
            }
            _ => simple(out, 404, b"no such probe\n"),
        }
    }
}

fn simple_with(out: ResponseOutparam, headers: &[(&str, &[u8])]) {
    let (body, stream) = respond(out, 200, headers);
    write_all(&stream, b"ok\n");
    finish(body, stream);
}

wasi::http::proxy::export!(Probe);
