//! A buffered call: one HTTP request handed to a generation's
//! `incoming-handler`, its response collected whole. What a caller inside
//! Weir gets when it cannot stream: an actor's turn (whose output gate
//! holds the response until its writes are durable) and a resident
//! process reached by its owner.
//!
//! Invariants owned here:
//! - the response body is collected while the guest writes it, in the
//!   call's own task (a guest writing a large body is never blocked on
//!   it), and never past `max_response_body_bytes`: a declared length over
//!   it is refused before a byte moves, and a body cut at it fails the call
//!   with `response_body_too_large` whatever the guest does next;
//! - a call that returns without a response, answers with an error, or
//!   whose body fails is `invalid_response`; one whose body is not done by
//!   the deadline is `event_deadline_exceeded`;
//! - one classification: the answer and the failure come out together, and
//!   the caller keeps only its own policy (commit or roll back, keep or
//!   drop the instance).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};

use crate::error_code::ErrorCode;
use crate::generation::Generation;
use crate::invocation::{self, Ending, Flow, GuestResponse, Hooks, Timing};
use crate::limits::Limits;
use crate::scope::EventScope;

/// What a failed call is answered with: the code, and a detail.
pub type Failure = (ErrorCode, Option<String>);

/// How one buffered call went.
pub struct BufferedCall {
    /// The whole response, or why there is none.
    pub answer: Result<http::Response<Bytes>, Failure>,
    /// Why the call failed, if it did (set whenever `answer` is an error,
    /// and also when the guest answered and then trapped).
    pub failure: Option<Failure>,
    /// The guest was stopped mid-call: its instance holds a half-run call
    /// and must not be used again.
    pub cut_short: bool,
    /// Time from entering the guest to the end of the call.
    pub wasm: Duration,
}

/// Why a response body could not be collected.
enum BodyFailure {
    TooLarge,
    Failed(String),
}

type Collected = Result<Bytes, BodyFailure>;

/// A response body being collected, or collected.
enum Body {
    Collecting(Pin<Box<dyn Future<Output = Collected> + Send>>),
    Done(Collected),
}

/// The buffered call's part in the invocation machine: the response's
/// head is kept and its body collected alongside the call.
struct CollectHooks {
    max_body: u64,
    head: Option<http::response::Parts>,
    body: Option<Body>,
}

impl Hooks for CollectHooks {
    fn judge(
        &self,
        response: &hyper::Response<wasmtime_wasi_http::p2::body::HyperOutgoingBody>,
    ) -> Option<ErrorCode> {
        if invocation::informational_from_guest(response) {
            return Some(ErrorCode::InvalidResponse);
        }
        invocation::declared_length(response.headers())
            .is_some_and(|n| n > self.max_body)
            .then_some(ErrorCode::ResponseBodyTooLarge)
    }

    fn on_response(&mut self, response: GuestResponse) -> Flow {
        match response {
            Ok(response) => {
                let (parts, guest_body) = response.into_parts();
                self.head = Some(parts);
                let max = self.max_body as usize;
                self.body = Some(Body::Collecting(Box::pin(async move {
                    Limited::new(guest_body, max)
                        .collect()
                        .await
                        .map(|c| c.to_bytes())
                        .map_err(|e| {
                            if e.downcast_ref::<LengthLimitError>().is_some() {
                                BodyFailure::TooLarge
                            } else {
                                BodyFailure::Failed(e.to_string())
                            }
                        })
                })));
                Flow::Continue(None)
            }
            Err(code) => Flow::Stop(
                ErrorCode::InvalidResponse,
                Some(format!("guest answered with an error: {code:?}")),
            ),
        }
    }

    fn poll_alongside(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(Body::Collecting(body)) = &mut self.body else {
            // Nothing to collect yet: a response sets it, and the machine
            // polls again after every response.
            return Poll::Pending;
        };
        let collected = std::task::ready!(body.as_mut().poll(cx));
        self.body = Some(Body::Done(collected));
        Poll::Ready(())
    }
}

/// Hands `request` to `generation`'s handler under `deadline` and collects
/// the response. The caller has set `scope` on the generation's store (and
/// clears and settles it afterwards).
pub async fn call(
    generation: &mut Generation,
    scope: &Arc<EventScope>,
    request: http::Request<Bytes>,
    limits: &Limits,
    deadline: Instant,
) -> BufferedCall {
    let entered = Instant::now();
    let (parts, body) = request.into_parts();
    let request = http::Request::from_parts(parts, Full::new(body));
    let (out_tx, mut out_rx) = tokio::sync::oneshot::channel();
    let handles = generation.store.data_mut().open_call(request, out_tx);
    let (req, out) = match handles {
        Ok(handles) => handles,
        Err(e) => {
            let failure = (ErrorCode::BadRequest, Some(e.to_string()));
            return BufferedCall {
                answer: Err(failure.clone()),
                failure: Some(failure),
                cut_short: false,
                wasm: Duration::ZERO,
            };
        }
    };
    let mut hooks = CollectHooks {
        max_body: limits.max_response_body_bytes,
        head: None,
        body: None,
    };
    let ending = {
        let Generation { store, proxy, .. } = &mut *generation;
        let call = proxy
            .wasi_http_incoming_handler()
            .call_handle(&mut *store, req, out);
        invocation::run(
            call,
            Some(&mut out_rx),
            scope,
            Timing {
                deadline,
                cancellation_limit: limits.cancellation_limit,
            },
            None,
            &mut hooks,
        )
        .await
    };
    // The body, once the guest returned: what it wrote is complete.
    let answer = match (&ending, hooks.head.take(), hooks.body.take()) {
        (Ending::Returned(()), Some(head), Some(body)) => {
            let collected = match body {
                Body::Done(collected) => Some(collected),
                Body::Collecting(rest) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    tokio::time::timeout(left, rest).await.ok()
                }
            };
            match collected {
                Some(Ok(bytes)) => Ok(http::Response::from_parts(head, bytes)),
                Some(Err(BodyFailure::TooLarge)) => Err((ErrorCode::ResponseBodyTooLarge, None)),
                Some(Err(BodyFailure::Failed(e))) => Err((
                    ErrorCode::InvalidResponse,
                    Some(format!("response body failed: {e}")),
                )),
                None => Err((ErrorCode::EventDeadlineExceeded, None)),
            }
        }
        (Ending::Returned(()), _, _) => Err((
            ErrorCode::InvalidResponse,
            Some("guest returned without setting a response".into()),
        )),
        // A body cut at its bound makes the guest's writes fail: what it
        // does next is not the reason.
        (_, _, Some(Body::Done(Err(BodyFailure::TooLarge)))) => {
            Err((ErrorCode::ResponseBodyTooLarge, None))
        }
        _ => Err((ErrorCode::InvalidResponse, None)),
    };
    let wasm = entered.elapsed();
    let failure = match (&answer, ending.failure(generation.store.data())) {
        (Ok(_), None) => None,
        (Err((ErrorCode::ResponseBodyTooLarge, detail)), _) => {
            Some((ErrorCode::ResponseBodyTooLarge, detail.clone()))
        }
        (_, Some((_, code, detail))) => Some((code, detail)),
        (Err((code, detail)), None) => Some((*code, detail.clone())),
    };
    BufferedCall {
        answer,
        failure,
        cut_short: ending.cut_short(),
        wasm,
    }
}
