//! The invocation machine: run one guest call on one generation, under a
//! deadline, in one event scope, and say how it ended. Worker events and
//! the calls of the layers above (see [`crate::extension`]) all run on it;
//! each keeps only its own policy (a lane's streaming and renewal, a
//! layer's transaction).
//!
//! Invariants owned here:
//! - the call runs until it returns, traps, its deadline passes, or —
//!   once its caller has left — its cancellation grace passes; nothing else
//!   ends it, and one tokio timer in the caller's task bounds it (no thread
//!   per call; the timer is registered only if the call waits);
//! - the scope always knows the current deadline, so host work that runs
//!   elsewhere (SQL on the pool) stops at it too;
//! - a response is judged when the guest sets it, before anything the
//!   guest does after: a response its [`Hooks::judge`] refuses ends the
//!   call with that refusal even if the guest trapped in the same poll;
//! - a response set, or a return, after the deadline counts as the
//!   deadline passing (a statement stopped at the deadline lets the guest
//!   answer at once, and must not make the answer count);
//! - one classifier says what an ending means ([`Ending::failure`]), and
//!   one teardown settles the scope ([`settle`]).

use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::Response;
use tokio::sync::oneshot;
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode as WasiErrorCode;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use crate::error_code::ErrorCode;
use crate::guest_state::GenerationState;
use crate::outcome::Outcome;
use crate::scope::EventScope;

/// Longest trap message kept in a receipt; wasmtime's backtraces can be
/// long, and the receipt is a log line.
pub const MAX_DETAIL_CHARS: usize = 512;

/// What a guest sets as its response: headers and a body it writes, or an
/// error in place of one.
pub type GuestResponse = Result<Response<HyperOutgoingBody>, WasiErrorCode>;

/// Where the guest's response arrives.
pub type ResponseSlot = oneshot::Receiver<GuestResponse>;

/// How a call ended.
#[derive(Debug)]
pub enum Ending<T> {
    /// The call returned.
    Returned(T),
    /// The call trapped (the message, truncated).
    Trapped(String),
    /// The guest ended its instance with `wasi:cli/exit` and this code: a
    /// command's normal end, a handler's abrupt one.
    Exited(i32),
    /// The deadline passed first; `after_response` when the guest had set
    /// its response already.
    DeadlinePassed { after_response: bool },
    /// The caller left and the guest did not finish within its grace.
    Cancelled,
    /// A response the hooks refused (a declared length over the limit),
    /// or that the hooks stopped on.
    Refused(ErrorCode, Option<String>),
}

/// What the machine does next after a response was handed to the hooks.
pub enum Flow {
    /// Go on; `Some(deadline)` replaces the deadline (headers sent: the
    /// session limit now applies).
    Continue(Option<Instant>),
    /// End the call now with this refusal.
    Stop(ErrorCode, Option<String>),
}

/// What the kind of call decides: how a response is judged and used, and
/// what a departed caller means.
pub trait Hooks {
    /// Refuses a response before it is used (checked even when the guest
    /// trapped right after setting it).
    fn judge(&self, _response: &Response<HyperOutgoingBody>) -> Option<ErrorCode> {
        None
    }

    /// The guest set its response (not refused by [`Hooks::judge`]).
    fn on_response(&mut self, response: GuestResponse) -> Flow;

    /// The caller left (the machine has already aborted the scope's work).
    fn on_cancel(&mut self) {}

    /// Work of the kind's own that must progress while the guest runs — a
    /// layer that collects the response body while the guest writes it —
    /// polled in the call's own task (no task or thread hand-off) until it
    /// is ready. None by default.
    fn poll_alongside(&mut self, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }
}

/// A call without a response slot (an exported function that returns its
/// result).
pub struct NoResponse;

impl Hooks for NoResponse {
    fn on_response(&mut self, _response: GuestResponse) -> Flow {
        Flow::Continue(None)
    }
}

/// The limits one call runs under.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// The first deadline (entry + `event_limit_ms`, say).
    pub deadline: Instant,
    /// After the caller leaves: the guest's grace to finish.
    pub cancellation_limit: Duration,
}

/// Runs `call` to its end.
///
/// `response` is where the guest's response arrives (none for a call that
/// returns its result), `cancel` resolves when the caller leaves (none for
/// a call nobody can leave, such as one a layer above runs to its end
/// whatever its caller does).
pub async fn run<T, H: Hooks>(
    call: impl Future<Output = wasmtime::Result<T>>,
    mut response: Option<&mut ResponseSlot>,
    scope: &EventScope,
    timing: Timing,
    mut cancel: Option<&mut oneshot::Receiver<()>>,
    hooks: &mut H,
) -> Ending<T> {
    let mut call = pin!(call);
    let mut deadline = timing.deadline;
    scope.set_deadline(deadline);
    // The one timer of the call. It is registered with tokio's timer only
    // if the call waits (a guest that answers within its first poll never
    // touches the timer wheel), and re-armed only when it fires before the
    // deadline, which a later deadline can make it do: every registration
    // takes the wheel's lock, and one earlier than the timer thread's next
    // wake also wakes that thread.
    let mut alarm = pin!(tokio::time::sleep_until(deadline.into()));
    let mut responded = response.is_none();
    let mut cancelled = false;
    let mut alongside_done = false;
    let late = |cancelled: bool, responded: bool| {
        if cancelled {
            Ending::Cancelled
        } else {
            Ending::DeadlinePassed {
                after_response: responded,
            }
        }
    };
    loop {
        tokio::select! {
            biased;
            set = async { response.as_mut().expect("guarded").await }, if !responded => {
                responded = true;
                if Instant::now() >= deadline {
                    return late(cancelled, false);
                }
                let set = match set {
                    Ok(set) => set,
                    // The guest dropped its response slot without setting
                    // it: what it returns says the rest.
                    Err(_) => continue,
                };
                if let Ok(r) = &set
                    && let Some(code) = hooks.judge(r)
                {
                    return Ending::Refused(code, None);
                }
                match hooks.on_response(set) {
                    Flow::Continue(Some(next)) if !cancelled => {
                        deadline = next;
                        move_deadline(scope, alarm.as_mut(), deadline);
                    }
                    Flow::Continue(_) => {}
                    Flow::Stop(code, detail) => return Ending::Refused(code, detail),
                }
            }
            result = &mut call => {
                // One reading of the clock judges both: the call ended now.
                let ended = Instant::now();
                // A response set in the same poll as the trap or return is
                // judged first.
                if !responded
                    && let Some(slot) = response.as_mut()
                    && let Ok(Ok(set)) = slot.try_recv()
                {
                    responded = true;
                    if let Some(code) = hooks.judge(&set) {
                        return Ending::Refused(code, None);
                    }
                    if result.is_ok()
                        && ended < deadline
                        && let Flow::Stop(code, detail) = hooks.on_response(Ok(set))
                    {
                        return Ending::Refused(code, detail);
                    }
                }
                return match result {
                    Ok(_) if ended >= deadline => late(cancelled, responded),
                    Ok(value) => Ending::Returned(value),
                    Err(e) => match e.downcast_ref::<wasmtime_wasi::I32Exit>() {
                        Some(exit) => Ending::Exited(exit.0),
                        None => Ending::Trapped(truncate(e.root_cause().to_string())),
                    },
                };
            }
            _ = &mut alarm => {
                if Instant::now() < deadline {
                    // Armed for a deadline since moved later.
                    alarm.as_mut().reset(deadline.into());
                    continue;
                }
                return late(cancelled, responded);
            }
            _ = std::future::poll_fn(|cx| hooks.poll_alongside(cx)), if !alongside_done => {
                alongside_done = true;
            }
            _ = async { cancel.as_mut().expect("guarded").await }, if cancel.is_some() && !cancelled => {
                cancelled = true;
                // The caller is gone: the call's outbound work stops now,
                // and the guest gets its grace to finish.
                scope.abort();
                hooks.on_cancel();
                deadline = deadline.min(Instant::now() + timing.cancellation_limit);
                move_deadline(scope, alarm.as_mut(), deadline);
            }
        }
    }
}

/// Moves the call's deadline: the scope learns it at once, and the alarm
/// is reset only if it must ring sooner (a later deadline keeps it armed;
/// when it rings early, the loop re-arms it).
fn move_deadline(scope: &EventScope, alarm: Pin<&mut tokio::time::Sleep>, deadline: Instant) {
    scope.set_deadline(deadline);
    if deadline < alarm.deadline().into_std() {
        alarm.reset(deadline.into());
    }
}

impl<T> Ending<T> {
    /// What the ending means, when it is a failure: the receipt's outcome,
    /// the error Weir answers, and a detail. The store tells a trap that
    /// followed a refused memory growth from any other trap.
    pub fn failure(&self, state: &GenerationState) -> Option<(Outcome, ErrorCode, Option<String>)> {
        Some(match self {
            Ending::Returned(_) => return None,
            Ending::Trapped(detail) => match state.memory_refusal() {
                Some(code) => (Outcome::Limit, code, Some(detail.clone())),
                None => (
                    Outcome::Trap,
                    ErrorCode::InstanceAbandoned,
                    Some(detail.clone()),
                ),
            },
            // A handler that exits has ended its instance mid-event.
            Ending::Exited(code) => (
                Outcome::Trap,
                ErrorCode::InstanceAbandoned,
                Some(format!("the guest exited with code {code}")),
            ),
            Ending::DeadlinePassed {
                after_response: false,
            } => (Outcome::Deadline, ErrorCode::EventDeadlineExceeded, None),
            Ending::DeadlinePassed {
                after_response: true,
            } => (
                Outcome::Deadline,
                ErrorCode::EventDeadlineExceeded,
                Some("session_limit_ms passed".to_string()),
            ),
            Ending::Cancelled => (
                Outcome::Cancelled,
                ErrorCode::RequestCancelled,
                Some("guest did not finish within cancellation_limit_ms".to_string()),
            ),
            Ending::Refused(code, detail) => (outcome_of(*code), *code, detail.clone()),
        })
    }

    /// True when the guest was stopped mid-call (its instance holds a
    /// half-run call and is not reusable).
    pub fn cut_short(&self) -> bool {
        !matches!(self, Ending::Returned(_))
    }
}

/// The receipt outcome of a refusal.
fn outcome_of(code: ErrorCode) -> Outcome {
    match code {
        ErrorCode::InvalidResponse => Outcome::Trap,
        ErrorCode::RequestCancelled => Outcome::Cancelled,
        ErrorCode::EventDeadlineExceeded => Outcome::Deadline,
        _ => Outcome::Limit,
    }
}

/// Ends the scope of a call: nothing new may start in its name, what is
/// still running is told to stop (fenced at once when the call `failed`),
/// and everything left is given `cleanup` to settle. True when it did.
pub async fn settle(scope: &EventScope, failed: bool, cleanup: Duration) -> bool {
    if failed {
        scope.invalidate();
    }
    scope.close();
    scope.abort();
    scope.live() == 0 || scope.drain(cleanup).await
}

/// True for an informational status the guest set itself: not an answer.
/// Only a host interface that takes the connection over may set one, and
/// it marks it ([`crate::extension::Takeover`]).
pub fn informational_from_guest(response: &Response<HyperOutgoingBody>) -> bool {
    response.status().is_informational()
        && response
            .extensions()
            .get::<crate::extension::Takeover>()
            .is_none()
}

/// The `content-length` a request or a response declares, if any: what
/// the transport and a response's judge hold against a limit before a
/// byte of body moves.
pub fn declared_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Cuts a detail to [`MAX_DETAIL_CHARS`].
pub fn truncate(mut s: String) -> String {
    if s.chars().count() > MAX_DETAIL_CHARS {
        s = s.chars().take(MAX_DETAIL_CHARS).collect();
        s.push('…');
    }
    s
}
