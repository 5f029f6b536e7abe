//! The listener and the path of one request through the transport.
//!
//! Invariants owned here, in the order a request meets them:
//! 0. at most `max_connections` client connections are open at once; one
//!    more is answered 503 `connection_limit_exceeded` and closed, and a
//!    connection must deliver each request head within
//!    `header_read_timeout_ms`;
//! 1. a head over `max_request_head_bytes` is answered 431 and a declared
//!    `content-length` over `max_request_body_bytes` 413 — before admission,
//!    so the guest is never entered and no lane is used;
//! 2. admission (a lane or a queue place) happens before a byte of body is
//!    read; a refused request leaves its body unread;
//! 3. the body is read while the lane is held, under its own timeout;
//! 4. responses to HEAD and with status 204, 205 or 304 carry no body, even
//!    when the guest writes one (what it writes is drained and discarded);
//! 5. at shutdown, every connection open or already completed by the
//!    kernel (waiting in the listen backlog) has its request in flight, or
//!    its first (arriving within [`FIRST_REQUEST_GRACE`] of its taking),
//!    answered before it closes (within [`SHUTDOWN_GRACE`]); an idle
//!    keep-alive connection older than that closes at once.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use weir_runtime::error_code::error_response;
use weir_runtime::event::{self, Dispatch, Reply};
use weir_runtime::extension::EventOffer;
use weir_runtime::invocation::declared_length;
use weir_runtime::outcome::Outcome;
use weir_runtime::receipt::Receipt;
use weir_runtime::{ErrorCode, Limits};

use crate::head::head_bytes;
use crate::request_body::{BodyError, BodyPace, read_body};
use crate::response_body::{Finished, ServeBody, SessionBody, finished_body};
use crate::routing::{Router, RoutingErrorCode};
use crate::shutdown::Stops;
use crate::websocket::SocketHub;
use crate::websocket::upgrade::{offer_upgrade, refuse_socket};
use crate::websocket::worker::Handoff;

/// Header count accepted by the HTTP parser. hyper reserves this many slots
/// per request, so it is kept modest; a head with more header lines is
/// refused by the parser (431) even under `max_request_head_bytes`.
pub const MAX_REQUEST_HEADERS: usize = 256;

/// The parser's read buffer is this many times `max_request_head_bytes`
/// (and at least [`MIN_PARSER_BUFFER_BYTES`]), so any head up to that size
/// reaches Weir's own count and gets its JSON 431; larger heads are cut off
/// by the parser with a bare 431.
pub const PARSER_BUFFER_HEAD_MULTIPLE: usize = 4;

/// hyper's smallest allowed read buffer.
pub const MIN_PARSER_BUFFER_BYTES: usize = 64 * 1024;

/// Name of the optional header that tells which generation answered.
pub const GENERATION_HEADER: &str = "x-weir-generation";

/// What the transport serves with besides its routes.
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// Add `x-weir-generation` to every response the guest produced.
    pub receipt_headers: bool,
    /// The server's WebSockets; without them an upgrade is plain HTTP to
    /// the guest.
    pub sockets: Option<Arc<SocketHub>>,
    /// The server's own limits: its connections, its head read timeout and
    /// its parser's buffer (each app's limits bound its own requests).
    pub limits: Limits,
}

/// One class exposed at a path prefix: a request to
/// `<prefix>/<name>/<rest>` is a call to actor `name` of the class, with
/// path `/<rest>`, and does not enter the app's worker.
#[derive(Clone, Debug)]
pub struct ActorRoute {
    /// `/counter`: no trailing slash.
    pub prefix: String,
    pub class: String,
}

impl ActorRoute {
    /// The actor name and the path (with query) the actor sees, when the
    /// request path is under this route.
    pub(crate) fn matches(&self, path_and_query: &str) -> Option<(String, String)> {
        let rest = path_and_query.strip_prefix(self.prefix.as_str())?;
        let rest = rest.strip_prefix('/')?;
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let (name, inner) = match path.split_once('/') {
            Some((name, inner)) => (name, inner),
            None => (path, ""),
        };
        let mut actor_path = format!("/{inner}");
        if let Some(q) = query {
            actor_path.push('?');
            actor_path.push_str(q);
        }
        Some((name.to_string(), actor_path))
    }
}

/// Connections past `max_connections` that are answered at once (their 503
/// written, then closed a moment later) rather than just dropped: enough
/// for an honest burst to learn why, few enough that a flood of
/// connections cannot make the refusals themselves a load.
pub const MAX_REFUSALS_IN_FLIGHT: usize = 64;

/// How long a refused connection is kept open after its 503, reading and
/// discarding what the client sends, so that closing it does not reset
/// the connection before the client has read the answer.
pub const REFUSAL_LINGER: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a shutdown waits for in-flight events before giving up on them.
/// Long enough for ordinary events to finish; a streaming session that needs
/// longer is cut off (its client sees an incomplete body).
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long after it was taken a connection is given, when the server
/// stops, for its first request to arrive: a request sent on a connection
/// made a moment before the stop is on its way (microseconds on a LAN, a
/// round trip or two over a WAN); a client that connected and says
/// nothing holds the shutdown no longer.
pub const FIRST_REQUEST_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Connections taken from the backlog at shutdown, at most: the kernel's
/// default backlog (`somaxconn`), so a flood of new connections cannot
/// hold the shutdown in that loop.
pub const MAX_BACKLOG_TAKEN: usize = 4096;

/// What every request of one connection needs. Cloned per request, it
/// touches a count that only this connection writes; the router's and the
/// options' own counts, written by every connection on every core, are
/// touched once per connection.
struct ConnectionScope {
    router: Arc<Router>,
    options: Arc<ServeOptions>,
}

/// Serves the apps of `router` on `listener` until `shutdown` resolves,
/// then stops accepting (taking the connections already waiting), lets
/// in-flight requests finish (up to [`SHUTDOWN_GRACE`]) and returns.
pub async fn serve(
    listener: TcpListener,
    router: Arc<Router>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    let stops = Arc::new(Stops::default());
    let mut shutdown = std::pin::pin!(shutdown);
    let options = Arc::new(options);
    let limits = &options.limits;
    let connections = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let refusals = Arc::new(tokio::sync::Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true)
        // One buffer, one `write`: hyper otherwise sends a head and a
        // small body as two iovecs of a `writev`, which measured 3.9 %
        // more CPU per hello request (bench/RESULTS.md); for large
        // bodies the extra copy did not show (1 MiB responses, same rate).
        .writev(false)
        .max_headers(MAX_REQUEST_HEADERS)
        .max_buf_size(
            (limits.max_request_head_bytes * PARSER_BUFFER_HEAD_MULTIPLE)
                .max(MIN_PARSER_BUFFER_BYTES),
        );
    // Takes one accepted connection: served, or refused past
    // `max_connections`.
    let take = |stream: tokio::net::TcpStream, peer: SocketAddr| {
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            refuse_connection(stream, &refusals);
            return;
        };
        let _ = stream.set_nodelay(true);
        let taken = tokio::time::Instant::now();
        let scope = Arc::new(ConnectionScope {
            router: router.clone(),
            options: options.clone(),
        });
        let service = service_fn(move |req| {
            let scope = scope.clone();
            async move { Ok::<_, Infallible>(handle(&scope.router, &scope.options, req).await) }
        });
        let (stop_ticket, stop) = stops.register();
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        tokio::spawn(async move {
            let _permit = permit;
            let _stop_ticket = stop_ticket;
            let mut connection = std::pin::pin!(connection);
            let ended = tokio::select! {
                biased;
                ended = connection.as_mut() => ended,
                _ = stop => {
                    // A connection made a moment ago may have its first
                    // request on its way: told to stop before it has read
                    // one, hyper closes it unread. It has until
                    // FIRST_REQUEST_GRACE after it was taken (a connection
                    // is not asked per request whether it had one: that
                    // would put a write on every request's path).
                    let first_by = taken + FIRST_REQUEST_GRACE;
                    if tokio::time::Instant::now() < first_by {
                        tokio::select! {
                            biased;
                            ended = connection.as_mut() => return log_end(peer, ended),
                            _ = tokio::time::sleep_until(first_by) => {}
                        }
                    }
                    // No new request on this connection; the one in
                    // flight finishes.
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            log_end(peer, ended);
        });
    };
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut shutdown => break,
        };
        match accepted {
            Ok((stream, peer)) => take(stream, peer),
            Err(e) => {
                // Running out of file descriptors must not end the server.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
    // The connections the kernel completed and this server had not taken
    // yet would be reset when the listener closes, after their clients
    // sent their requests: each is taken too, and served its first.
    for (stream, peer) in backlog(listener) {
        take(stream, peer);
    }
    stops.stop();
    // Open sockets close with 1001, so their events end too.
    if let Some(sockets) = &options.sockets {
        sockets.shut_down();
    }
    // Every connection has ended when each has given its place back, and
    // every socket (an upgraded connection gives its place back at the
    // upgrade) when its close handshake is over.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let ended = async {
        let _ = connections.acquire_many(all).await;
        if let Some(sockets) = &options.sockets {
            sockets.all_closed().await;
        }
    };
    if tokio::time::timeout(SHUTDOWN_GRACE, ended).await.is_err() {
        tracing::warn!("shutdown grace passed with requests still in flight");
    }
}

/// Notes how a connection ended, if with an error.
fn log_end(peer: SocketAddr, ended: Result<(), hyper::Error>) {
    if let Err(e) = ended {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// The connections waiting in `listener`'s backlog (at most
/// [`MAX_BACKLOG_TAKEN`]); the listener is closed after.
fn backlog(listener: TcpListener) -> Vec<(tokio::net::TcpStream, SocketAddr)> {
    let mut taken = Vec::new();
    let listener = match listener.into_std() {
        Ok(listener) => listener,
        Err(e) => {
            tracing::warn!(error = %e, "cannot take the connections waiting at shutdown");
            return taken;
        }
    };
    while taken.len() < MAX_BACKLOG_TAKEN {
        // Non-blocking (the listener was tokio's): `WouldBlock` once the
        // backlog is empty.
        let Ok((stream, peer)) = listener.accept() else {
            break;
        };
        let stream = stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpStream::from_std(stream));
        match stream {
            Ok(stream) => taken.push((stream, peer)),
            Err(e) => tracing::debug!(%peer, error = %e, "a waiting connection cannot be taken"),
        }
    }
    taken
}

/// Answers a connection past `max_connections` with a JSON 503 and closes
/// it; past [`MAX_REFUSALS_IN_FLIGHT`] refusals at once, just closes it.
fn refuse_connection(stream: tokio::net::TcpStream, refusals: &Arc<tokio::sync::Semaphore>) {
    let Ok(permit) = refusals.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _permit = permit;
        let code = ErrorCode::ConnectionLimitExceeded;
        let body = code.body();
        let head = format!(
            "HTTP/1.1 {} Service Unavailable\r\ncontent-type: application/json\r\ncache-control: no-store\r\nx-content-type-options: nosniff\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            code.status(),
            body.len()
        );
        let mut stream = stream;
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 4096];
        let _ = tokio::time::timeout(REFUSAL_LINGER, async {
            while let Ok(n) = stream.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
    });
}

/// Binds a listener, for callers that want the bound address first.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

fn refuse(receipt: &Receipt, outcome: Outcome, code: ErrorCode) -> Response<ServeBody> {
    receipt.fail(outcome, Some(code), None);
    receipt.status(code.status());
    error_response(code)
}

/// Invariant 4, one rule for every path (worker events, actor routes):
/// true when the response to `method` with this head carries no body —
/// HEAD, 204, 205, 304 — after fixing its framing headers (204 never says
/// a length; 205 says 0, RFC 9110 §15.3.6).
pub(crate) fn bodyless(method: &Method, parts: &mut http::response::Parts) -> bool {
    let status = parts.status;
    let none = method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::RESET_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    if status == StatusCode::NO_CONTENT {
        parts.headers.remove(header::CONTENT_LENGTH);
    } else if status == StatusCode::RESET_CONTENT {
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    }
    none
}

/// The limits a request breaks before admission (invariant 1): its head
/// over `max_request_head_bytes`, or a declared body over
/// `max_request_body_bytes`.
pub(crate) fn over_head_limits<B>(req: &Request<B>, limits: &Limits) -> Option<ErrorCode> {
    if head_bytes(req) > limits.max_request_head_bytes {
        return Some(ErrorCode::RequestHeaderFieldsTooLarge);
    }
    if declared_length(req.headers()).is_some_and(|n| n > limits.max_request_body_bytes) {
        return Some(ErrorCode::PayloadTooLarge);
    }
    None
}

/// Reads a request body under the app's body limit and read timeout
/// (invariant 3).
pub(crate) async fn read_request_body(body: Incoming, limits: &Limits) -> Result<Bytes, BodyError> {
    read_body(
        body,
        limits.max_request_body_bytes,
        BodyPace {
            total: limits.body_read_timeout,
            idle: limits.body_idle_timeout,
            min_bytes_per_s: limits.body_min_rate_bytes_per_s,
        },
    )
    .await
}

async fn handle(
    router: &Router,
    options: &ServeOptions,
    req: Request<Incoming>,
) -> Response<ServeBody> {
    let Some(served) = router.route(&req) else {
        return error_response(RoutingErrorCode::NoRoute);
    };
    if let Some(host) = &served.actors {
        let target = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        for route in &served.actor_routes {
            if let Some((name, actor_path)) = route.matches(target) {
                // Boxed: inline, the actor's future would make every
                // worker request's future (moved at least once per
                // request) as large as the two together.
                return Box::pin(crate::actor_route::handle(
                    &served.app,
                    host,
                    (&route.class, &name),
                    actor_path,
                    req,
                    options,
                ))
                .await;
            }
        }
    }
    let app = &served.app;
    let arrived = Instant::now();
    let receipt = app.receipts.open(arrived);
    let limits = &app.code.limits;

    if let Some(code) = over_head_limits(&req, limits) {
        return refuse(&receipt, Outcome::Limit, code);
    }

    let mut req = req;
    let offer = match offer_upgrade(app, options.sockets.as_ref(), &mut req) {
        Ok(offer) => offer,
        Err((outcome, code, why)) => return refuse_socket(&receipt, outcome, code, why),
    };

    let mut guard = match app.admission.admit(arrived + limits.event_limit).await {
        Ok(guard) => guard,
        Err(code) => return refuse(&receipt, Outcome::Capacity, code),
    };
    receipt.admitted(guard.lane().id, app.next_admission_index());

    let (mut parts, body) = req.into_parts();
    if let Some(offer) = offer {
        parts.extensions.insert(EventOffer(Arc::new(offer)));
    }
    // A request without a body reads nothing; one with a body reads it
    // in a future of its own, boxed so that it does not add its size to
    // every request's future.
    let bytes = if body.is_end_stream() {
        Bytes::new()
    } else {
        match Box::pin(read_request_body(body, limits)).await {
            Ok(bytes) => bytes,
            Err(e) => return refuse(&receipt, e.outcome(), e.code()),
        }
    };
    receipt.add_bytes_in(bytes.len() as u64);
    let method = parts.method.clone();
    let request = Request::from_parts(parts, Full::new(bytes));

    let Dispatch {
        mut reply,
        cancel,
        mut task,
    } = event::dispatch(app.clone(), guard, request, receipt.clone());
    // Whatever of the event is left after the reply runs on as its own task
    // when `task` drops at the end of this function.
    match task.until_reply(&mut reply).await {
        Ok(Reply::Response {
            response,
            session,
            generation,
        }) => {
            let (mut parts, body) = response.into_parts();
            // An accepted WebSocket: the socket holds the event from here.
            if let Some(handoff) = parts.extensions.remove::<Handoff>() {
                handoff.give(cancel, session);
                drop(body);
                return Response::from_parts(parts, ServeBody::empty());
            }
            if options.receipt_headers {
                parts
                    .headers
                    .insert(GENERATION_HEADER, HeaderValue::from(generation));
            }
            if bodyless(&method, &mut parts) {
                // The guest may still be writing; drain what it writes so
                // it is not failed for a body the client will never see.
                tokio::spawn(async move {
                    let _cancel = cancel;
                    event::discard(body).await;
                    drop(session);
                });
                return Response::from_parts(parts, ServeBody::empty());
            }
            // Most guests write their whole body right after setting the
            // response: let the event get that far here, so that such a
            // response goes out whole, with no task or thread hand-off.
            task.run_until_waiting().await;
            let (body, session) =
                match finished_body(body, session, limits.max_response_chunk_bytes) {
                    Finished::Complete(bytes) => {
                        receipt.add_bytes_out(bytes.len() as u64);
                        return Response::from_parts(parts, ServeBody::full(bytes));
                    }
                    Finished::Streaming(body, session) => (body, session),
                };
            let body = SessionBody::new(
                body,
                session,
                receipt,
                cancel,
                limits.max_response_body_bytes,
                limits.max_response_chunk_bytes,
            );
            Response::from_parts(parts, ServeBody::Session(Box::new(body)))
        }
        Ok(Reply::Failure(code)) => error_response(code),
        // The event task ended without a word: treat the host as gone.
        Err(_) => error_response(ErrorCode::HostUnavailable),
    }
}

#[cfg(test)]
mod tests {
    use super::ActorRoute;

    #[test]
    fn actor_routes_split_name_path_and_query() {
        let route = ActorRoute {
            prefix: "/counter".into(),
            class: "counter".into(),
        };
        assert_eq!(
            route.matches("/counter/ada/incr?by=2"),
            Some(("ada".into(), "/incr?by=2".into()))
        );
        assert_eq!(
            route.matches("/counter/ada"),
            Some(("ada".into(), "/".into()))
        );
        assert_eq!(
            route.matches("/counter/ada?x=1"),
            Some(("ada".into(), "/?x=1".into()))
        );
        assert_eq!(route.matches("/counterfeit/ada"), None);
        assert_eq!(route.matches("/counter"), None);
        assert_eq!(route.matches("/other/ada"), None);
    }
}
