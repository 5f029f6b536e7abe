//! Outbound HTTP for guests (`wasi:http/outgoing-handler`).
//!
//! Invariants owned here:
//! - a guest reaches no host unless a configured pattern allows its scheme,
//!   host and port; a denied request fails in the guest with the standard
//!   `HTTP-request-denied` error, is counted, and nothing is sent;
//! - a guest never reaches Weir's own listen or admin addresses, whatever
//!   the patterns allow: the destination is resolved first, refused if any
//!   of its addresses is Weir's (a loopback, unspecified or local interface
//!   address on one of Weir's ports counts), and a plain-HTTP request is
//!   then sent to exactly the address that was checked;
//! - every outbound request is an operation of the event's scope: it is
//!   refused when the scope is full or closed, and an abort ends it for real
//!   — the connection is dropped, so the upstream sees it closed;
//! - timeouts and the response size are bounded by the app's limits: a guest
//!   may ask for shorter timeouts, never longer ones;
//! - redirects are never followed on the guest's behalf: the guest gets the
//!   redirect response itself;
//! - a request to an internal domain ([`crate::extension::InternalRouter`])
//!   never reaches the network: it is answered in-process, and is an
//!   operation of the caller's scope like any other. A request to a
//!   reserved internal domain ([`OutboundRules::reserve`]) that no router
//!   of the caller's serves (a program's call to an actor, a worker-only
//!   app's) is denied, whatever the patterns allow: it is never looked up
//!   or sent;
//! - nothing leaves a generation that has an output gate (no request, no
//!   internal call) before the gate lets it
//!   ([`crate::extension::OutputGate`]).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use crate::extension::{InternalRouter, InternalRoutes, OutputGate};
use crate::held::HeldResponses;
use crate::limits::Limits;
use crate::metrics::AppMetrics;
pub use crate::outbound_rules::{HostPattern, OutboundRules, PatternError};
use crate::scope::{EventScope, Operation};

/// The error text a guest sees for an operation its event's scope stopped.
pub const ABORTED: &str = "event_operation_aborted";

/// The per-generation outbound policy handed to `wasmtime-wasi-http`.
pub struct OutboundPolicy {
    rules: Arc<OutboundRules>,
    chunk_bytes: usize,
    connect_timeout: Duration,
    first_byte_timeout: Duration,
    max_response_bytes: u64,
    metrics: AppMetrics,
    /// The scope of the event running now; none between events.
    pub(crate) scope: Option<Arc<EventScope>>,
    routes: InternalRoutes,
    max_call_body_bytes: u64,
    /// Passed before anything leaves, when the generation has one.
    pub(crate) output_gate: Option<Arc<dyn OutputGate>>,
    /// Who the generation is, for internal routers.
    pub(crate) caller: Option<crate::extension::Caller>,
    /// Internal responses' bytes the guest was handed and has not taken.
    pub(crate) held_responses: HeldResponses,
}

impl OutboundPolicy {
    /// The most an unsent body buffers in the host: one chunk (wasi-http's
    /// one buffered write, of at most [`Self::p2_outgoing_body_chunk_size`]).
    pub(crate) fn body_buffer_bytes(&self) -> usize {
        self.chunk_bytes
    }

    pub fn new(
        rules: Arc<OutboundRules>,
        limits: &Limits,
        metrics: AppMetrics,
        routes: InternalRoutes,
    ) -> Self {
        OutboundPolicy {
            routes,
            max_call_body_bytes: limits.max_request_body_bytes,
            output_gate: None,
            caller: None,
            rules,
            chunk_bytes: limits.max_response_chunk_bytes,
            connect_timeout: limits.outbound_connect_timeout,
            first_byte_timeout: limits.outbound_first_byte_timeout,
            max_response_bytes: limits.max_outbound_response_bytes,
            metrics,
            scope: None,
            held_responses: HeldResponses::default(),
        }
    }

    /// The guest's options, with every timeout bounded by the app's limits.
    fn bounded(&self, options: Option<RequestOptions>) -> RequestOptions {
        let asked = options.unwrap_or_default();
        let bound =
            |asked: Option<Duration>, limit: Duration| Some(asked.map_or(limit, |a| a.min(limit)));
        RequestOptions {
            connect_timeout: bound(asked.connect_timeout, self.connect_timeout),
            first_byte_timeout: bound(asked.first_byte_timeout, self.first_byte_timeout),
            between_bytes_timeout: bound(asked.between_bytes_timeout, self.first_byte_timeout),
        }
    }
}

type IoFuture = Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>;
type SendFuture = Box<
    dyn Future<Output = wasmtime_wasi_http::Result<(http::Response<WasiBody>, IoFuture)>> + Send,
>;

fn refused(error: Error) -> SendFuture {
    Box::new(async move { Err(error) })
}

impl WasiHttpHooks for OutboundPolicy {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: IoFuture,
    ) -> SendFuture {
        let internal = request.uri().host().and_then(|host| self.routes.find(host));
        if internal.is_none() && !self.rules.allows(request.uri()) {
            self.metrics.outbound_denied();
            return refused(Error::HttpRequestDenied);
        }
        let Some(scope) = &self.scope else {
            return refused(Error::InternalError(Some("event_scope_closed".into())));
        };
        let mut op = match scope.register() {
            Ok(op) => op,
            Err(e) => {
                self.metrics.outbound_refused();
                return refused(Error::InternalError(Some(e.to_string())));
            }
        };
        // The output gate: nothing leaves before the gate lets it.
        let mut settle = None;
        if let Some(gate) = &self.output_gate {
            if let Err(why) = gate.flush() {
                return refused(gate_refused(why));
            }
            settle = gate.settle();
        }
        if let Some(router) = internal {
            return call_internal(
                router,
                self.caller.clone(),
                request,
                op,
                self.max_call_body_bytes,
                settle,
                (self.held_responses.clone(), self.chunk_bytes),
            );
        }
        let options = self.bounded(options);
        let max_bytes = self.max_response_bytes;
        let rules = self.rules.clone();
        let metrics = self.metrics.clone();
        Box::new(async move {
            let sent = tokio::select! {
                sent = async {
                    if let Some(settle) = settle {
                        settle.await.map_err(gate_refused)?;
                    }
                    let request = match pin_destination(request, &rules, &options).await {
                        Ok(request) => request,
                        Err(e) => {
                            if matches!(e, Error::HttpRequestDenied) {
                                metrics.outbound_denied();
                            }
                            return Err(e);
                        }
                    };
                    wasmtime_wasi_http::default_send_request(request, Some(options)).await
                } => sent,
                _ = op.aborted() => return Err(Error::InternalError(Some(ABORTED.into()))),
            };
            let (response, io) = sent?;
            if !op.is_valid() {
                return Err(Error::InternalError(Some(ABORTED.into())));
            }
            let response = response.map(|body| {
                CappedBody {
                    inner: body.boxed_unsync(),
                    left: max_bytes,
                }
                .boxed_unsync()
            });
            // The connection lives as long as the operation: an abort ends
            // it, dropping the socket.
            let io: IoFuture = Box::new(async move {
                tokio::select! {
                    done = io => done,
                    _ = op.aborted() => Err(Error::InternalError(Some(ABORTED.into()))),
                }
            });
            Ok((response, io))
        })
    }

    /// The guest may write at most one client chunk at a time, so a response
    /// body never needs re-chunking on its way out.
    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        self.chunk_bytes
    }
}

/// Resolves the request's destination and refuses it if any of its
/// addresses is one of Weir's own, or of a kind only a pattern that names
/// it reaches ([`OutboundRules::guards`]); a plain-HTTP request is then
/// addressed to the checked address itself (its `Host` header is kept),
/// so a second resolution cannot lead it elsewhere.
async fn pin_destination(
    mut request: http::Request<WasiBody>,
    rules: &OutboundRules,
    options: &RequestOptions,
) -> Result<http::Request<WasiBody>, Error> {
    let uri = request.uri();
    let tls = uri
        .scheme_str()
        .is_some_and(|s| s.eq_ignore_ascii_case("https"));
    let host = uri
        .host()
        .ok_or(Error::HttpRequestUriInvalid)?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let lookup = tokio::net::lookup_host((host.as_str(), port));
    let wait = options.connect_timeout.unwrap_or(Duration::from_secs(10));
    let addrs: Vec<SocketAddr> = match tokio::time::timeout(wait, lookup).await {
        Ok(Ok(addrs)) => addrs.collect(),
        Ok(Err(_)) => Vec::new(),
        Err(_) => return Err(Error::DnsTimeout),
    };
    let Some(first) = addrs.first().copied() else {
        return Err(Error::DnsError {
            rcode: Some("address not available".into()),
            info_code: None,
        });
    };
    if addrs
        .iter()
        .any(|a| rules.is_own(*a) || rules.guards(a.ip()))
    {
        return Err(Error::HttpRequestDenied);
    }
    if !tls {
        let mut parts = request.uri().clone().into_parts();
        parts.authority = Some(
            first
                .to_string()
                .parse()
                .map_err(|_| Error::HttpRequestUriInvalid)?,
        );
        *request.uri_mut() = Uri::from_parts(parts).map_err(|_| Error::HttpRequestUriInvalid)?;
    }
    Ok(request)
}

/// The error a guest's request fails with when its output gate refuses.
fn gate_refused(why: String) -> Error {
    Error::InternalError(Some(format!("output_gate_refused: {why}")))
}

/// An internal call: reads the request body (bounded like a client's),
/// has the router answer, and hands the guest the whole response, its body
/// counted against the guest's memory limit until the guest takes it
/// (`held`: the store's count and the chunk its frames are cut to).
fn call_internal(
    router: Arc<dyn InternalRouter>,
    caller: Option<crate::extension::Caller>,
    request: http::Request<WasiBody>,
    mut op: Operation,
    max_body_bytes: u64,
    settle: Option<crate::extension::Settle>,
    held: (HeldResponses, usize),
) -> SendFuture {
    Box::new(async move {
        let work = async {
            if let Some(settle) = settle {
                settle.await.map_err(gate_refused)?;
            }
            let (parts, body) = request.into_parts();
            let body = http_body_util::Limited::new(body, max_body_bytes as usize)
                .collect()
                .await
                .map_err(|e| Error::InternalError(Some(format!("request body: {e}"))))?
                .to_bytes();
            let response = router
                .call(http::Request::from_parts(parts, body), caller)
                .await;
            let (count, chunk) = held;
            let response = response.map(|b| {
                count
                    .hold(b, chunk)
                    .map_err(|never| match never {})
                    .boxed_unsync()
            });
            let io: IoFuture = Box::new(async { Ok(()) });
            Ok((response, io))
        };
        tokio::select! {
            done = work => done,
            _ = op.aborted() => Err(Error::InternalError(Some(ABORTED.into()))),
        }
    })
}

/// An outbound response body that fails once it passes its byte budget.
struct CappedBody {
    inner: WasiBody,
    left: u64,
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
        {
            let n = data.len() as u64;
            if n > self.left {
                return Poll::Ready(Some(Err(Error::HttpResponseBodySize(None))));
            }
            self.left -= n;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}
