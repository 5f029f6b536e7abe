//! One event: a request run on a lane's generation, from Wasm entry to the
//! end of the response body, and the lane's renewal afterwards.
//!
//! Invariants owned here:
//! - the guest runs on its own task, so a client that leaves does not kill
//!   it mid-instruction: it gets `cancellation_limit_ms` to finish (what it
//!   writes meanwhile is read and discarded, so its writes do not fail),
//!   then its generation is abandoned;
//! - before headers the deadline is `event_limit_ms` from Wasm entry; after
//!   headers it is `session_limit_ms`; both are enforced by one tokio timer
//!   in this task, never by a thread or timer per request, and headers that
//!   come after the deadline count as the deadline passing;
//! - a trap, a deadline, a cancellation that does not settle, or a declared
//!   response length over the limit drops the generation at once; a failure
//!   after headers is reported to the transport as a failed session, never
//!   as a clean end of body;
//! - after an event its guest returned from, the generation is kept or
//!   retired as [`crate::retirement`] decides (at its admission limit, or at
//!   once when the guest answered without a response), and the receipt says
//!   which;
//! - a lane is released with a live generation in it, or with none before
//!   its first event: a retired or abandoned generation is replaced first,
//!   and a lane whose generation cannot be instantiated (its first, or a
//!   replacement) stays out of admission (unavailable) until one can; the
//!   event that found it so is answered `host_unavailable` without
//!   entering Wasm.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Response;
use tokio::sync::oneshot;
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode as WasiErrorCode;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use crate::admission::LaneGuard;
use crate::app::App;
use crate::error_code::ErrorCode;
use crate::generation::Generation;
use crate::invocation::{self, Flow, GuestResponse, Hooks, Timing, declared_length};
use crate::outcome::Outcome;
use crate::receipt::Receipt;
use crate::retirement::SECOND_EVENT_FAILURES_TO_FALL_BACK;
use crate::scope::EventScope;

/// First wait before retrying a lane whose fresh instantiation failed.
pub const RENEW_BACKOFF_START: Duration = Duration::from_millis(100);

/// Longest wait between retries of an unavailable lane: a lane that comes
/// back is found within 30 s, and a persistent failure costs one attempt per
/// 30 s per lane.
pub const RENEW_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// How the guest's session ended, as the transport needs to know before it
/// may end the body cleanly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// The guest returned: the body it wrote is complete.
    Clean,
    /// The guest failed after headers (how, in the receipt's words): the
    /// body must end with an error.
    Failed(Outcome),
}

/// What the transport receives for an event.
pub enum Reply {
    /// The guest produced headers; the body streams from the guest, and
    /// `session` says how it ended.
    Response {
        response: Response<HyperOutgoingBody>,
        session: oneshot::Receiver<SessionEnd>,
        generation: u64,
    },
    /// Weir answers instead of the guest.
    Failure(ErrorCode),
}

/// Dropping this tells the event that nobody wants its result any more.
pub struct CancelHandle {
    _tx: oneshot::Sender<()>,
}

/// An event handed to its lane.
pub struct Dispatch {
    pub reply: oneshot::Receiver<Reply>,
    pub cancel: CancelHandle,
    pub task: EventTask,
}

/// The event's own future. The transport drives it inline while it waits
/// for the reply — the common case then costs no task spawn and no thread
/// hand-off — and whatever is left when the transport lets go (a streaming
/// body, a lane's renewal, a guest finishing after its client left) runs on
/// as a task of its own: dropping an unfinished `EventTask` spawns it, so an
/// event can never be cut short by its connection going away.
pub struct EventTask {
    future: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl EventTask {
    /// Runs the event until its reply is available, and returns it.
    pub async fn until_reply(
        &mut self,
        reply: &mut oneshot::Receiver<Reply>,
    ) -> Result<Reply, oneshot::error::RecvError> {
        std::future::poll_fn(|cx| {
            if let Some(future) = self.future.as_mut()
                && future.as_mut().poll(cx).is_ready()
            {
                self.future = None;
            }
            Pin::new(&mut *reply).poll(cx)
        })
        .await
    }

    /// Lets the event run on from where it is until it next waits — one
    /// poll, so at most one epoch tick of guest code — and says whether it
    /// has ended. A guest that sets its response and then writes its body
    /// finishes here, and its response can go out whole. What remains
    /// runs on as its own task.
    pub async fn run_until_waiting(&mut self) -> bool {
        std::future::poll_fn(|cx| {
            if let Some(future) = self.future.as_mut()
                && future.as_mut().poll(cx).is_ready()
            {
                self.future = None;
            }
            std::task::Poll::Ready(self.future.is_none())
        })
        .await
    }
}

impl Drop for EventTask {
    fn drop(&mut self) {
        if let Some(future) = self.future.take() {
            // Outside a runtime (the process is shutting down) there is
            // nothing left to finish the event on; it is dropped with it.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(future);
            }
        }
    }
}

/// The body a guest streams into its response.
pub type GuestBody = HyperOutgoingBody;

/// A request whose body has been read in full, as the guest will see it.
pub type EventRequest = http::Request<Full<Bytes>>;

/// Starts the event on the lane held by `guard`.
pub fn dispatch(
    app: Arc<App>,
    guard: LaneGuard,
    request: EventRequest,
    receipt: Receipt,
) -> Dispatch {
    let (reply_tx, reply) = oneshot::channel();
    let (cancel_tx, cancel_rx) = oneshot::channel();
    Dispatch {
        reply,
        cancel: CancelHandle { _tx: cancel_tx },
        task: EventTask {
            future: Some(Box::pin(run_event(
                app, guard, request, receipt, reply_tx, cancel_rx,
            ))),
        },
    }
}

async fn run_event(
    app: Arc<App>,
    mut guard: LaneGuard,
    request: EventRequest,
    receipt: Receipt,
    reply_tx: oneshot::Sender<Reply>,
    mut cancel_rx: oneshot::Receiver<()>,
) {
    let limits = &app.code.limits;
    let lane_id = guard.lane().id;
    let mut generation = match guard.lane().generation.take() {
        Some(generation) => generation,
        // The lane's first event: its generation is made now.
        None => {
            app.board.set_renewing(lane_id);
            // Instantiation's future is boxed here and in `renew`: inline,
            // it would be most of the size of every event's future, which
            // is allocated per event.
            match Box::pin(app.instantiate()).await {
                Ok(generation) => generation,
                Err(e) => {
                    let mut reply_tx = Some(reply_tx);
                    fail_event(
                        &receipt,
                        &mut reply_tx,
                        Outcome::Capacity,
                        ErrorCode::HostUnavailable,
                        Some(e.to_string()),
                    );
                    drop(receipt);
                    let fresh = renew(&app, lane_id).await;
                    app.board.set_idle(lane_id, fresh.number);
                    guard.lane().generation = Some(fresh);
                    return;
                }
            }
        }
    };
    generation.admitted += 1;
    app.board.set_busy(lane_id, generation.number);

    let (out_tx, mut out_rx) = oneshot::channel();
    let handles = generation.store.data_mut().open_call(request, out_tx);
    let (req, out) = match handles {
        Ok(handles) => handles,
        Err(e) => {
            receipt.fail(
                Outcome::Limit,
                Some(ErrorCode::BadRequest),
                Some(e.to_string()),
            );
            let _ = reply_tx.send(Reply::Failure(ErrorCode::BadRequest));
            finish_lane(&app, guard, generation, false).await;
            return;
        }
    };

    let scope = EventScope::new(limits.max_operations);
    generation.store.data_mut().set_scope(Some(scope.clone()));
    let number = generation.number;
    let entered = Instant::now();
    receipt.entered_wasm(number, entered);
    let mut hooks = WorkerHooks {
        limits,
        receipt: &receipt,
        reply_tx: Some(reply_tx),
        session_tx: None,
        number,
        invalid: false,
    };
    let ending = {
        let Generation { store, proxy, .. } = &mut generation;
        let call = proxy
            .wasi_http_incoming_handler()
            .call_handle(store, req, out);
        invocation::run(
            call,
            Some(&mut out_rx),
            &scope,
            Timing {
                deadline: entered + limits.event_limit,
                cancellation_limit: limits.cancellation_limit,
            },
            Some(&mut cancel_rx),
            &mut hooks,
        )
        .await
    };
    let WorkerHooks {
        mut reply_tx,
        mut session_tx,
        mut invalid,
        ..
    } = hooks;

    receipt.call_ended(generation.memory_bytes(), scope.started(), scope.refused());
    let Some((outcome, code, detail)) = ending.failure(generation.store.data()) else {
        if reply_tx.is_some() {
            invalid_response(&receipt, &mut reply_tx, None);
            invalid = true;
        }
        if let Some(tx) = session_tx.take() {
            let _ = tx.send(SessionEnd::Clean);
        }
        let (retired, fell_back) = app.retirement.after_event(generation.admitted, invalid);
        if fell_back {
            tracing::warn!(
                app = %app.name,
                generations = SECOND_EVENT_FAILURES_TO_FALL_BACK,
                "the guest cannot serve a second event on one instance: generations in a row \
                 answered invalid_response on their second event, so every generation now \
                 serves one event (set retirement_admission_limit = 1 to start that way)"
            );
        }
        receipt.succeed(retired);
        // The event is over: whatever the guest left running stops, and
        // nothing more may start in its name.
        generation.store.data_mut().set_scope(None);
        if !invocation::settle(&scope, false, limits.cleanup_timeout).await {
            receipt.cleanup_unconfirmed();
            drop(receipt);
            quarantine(&app, lane_id, &scope).await;
        } else {
            drop(receipt);
        }
        finish_lane(&app, guard, generation, retired.is_none()).await;
        return;
    };

    // Abandonment: fence the scope at once, then drop the store — it holds
    // the response channels and every resource the guest started, so a
    // failed session is seen as failed and the guest's connections close.
    scope.invalidate();
    drop(generation);
    let drained = invocation::settle(&scope, true, limits.cleanup_timeout).await;
    let code = if drained {
        code
    } else {
        ErrorCode::StorageCleanupUnconfirmed
    };
    fail_event(&receipt, &mut reply_tx, outcome, code, detail);
    if !drained {
        receipt.cleanup_unconfirmed();
    }
    if let Some(tx) = session_tx.take() {
        let _ = tx.send(SessionEnd::Failed(outcome));
    }
    drop(receipt);
    app.metrics.generation_abandoned();
    tracing::debug!(app = %app.name, lane = lane_id, generation = number, "generation abandoned");
    if !drained {
        quarantine(&app, lane_id, &scope).await;
    }
    let fresh = renew(&app, lane_id).await;
    app.board.set_idle(lane_id, fresh.number);
    guard.lane().generation = Some(fresh);
}

/// A worker event's part in the invocation machine: a response is judged
/// by its declared length and handed to the transport as soon as it is
/// set (the body streams from the guest); a departed client is recorded.
struct WorkerHooks<'a> {
    limits: &'a crate::limits::Limits,
    receipt: &'a Receipt,
    /// Until the transport has its reply.
    reply_tx: Option<oneshot::Sender<Reply>>,
    /// How the session ended, once headers went out.
    session_tx: Option<oneshot::Sender<SessionEnd>>,
    number: u64,
    /// The guest set an error instead of a response.
    invalid: bool,
}

impl Hooks for WorkerHooks<'_> {
    fn judge(&self, response: &Response<HyperOutgoingBody>) -> Option<ErrorCode> {
        if invocation::informational_from_guest(response) {
            return Some(ErrorCode::InvalidResponse);
        }
        declared_length(response.headers())
            .is_some_and(|n| n > self.limits.max_response_body_bytes)
            .then_some(ErrorCode::ResponseBodyTooLarge)
    }

    fn on_response(&mut self, response: GuestResponse) -> Flow {
        match response {
            Ok(response) => {
                let sent = self.receipt.headers_sent(response.status().as_u16());
                let (tx, session) = oneshot::channel();
                self.session_tx = Some(tx);
                if let Some(reply_tx) = self.reply_tx.take()
                    && let Err(Reply::Response { response, .. }) = reply_tx.send(Reply::Response {
                        response,
                        session,
                        generation: self.number,
                    })
                {
                    // The client left before its response was set. The
                    // guest still has its cancellation grace: what it
                    // writes is read and discarded, so its writes succeed
                    // as they would have, until it finishes or its
                    // generation goes (which ends the body).
                    tokio::spawn(discard(response.into_body()));
                }
                Flow::Continue(Some(sent + self.limits.session_limit))
            }
            Err(code) => {
                invalid_response(self.receipt, &mut self.reply_tx, Some(code));
                self.invalid = true;
                Flow::Continue(None)
            }
        }
    }

    fn on_cancel(&mut self) {
        self.receipt
            .fail(Outcome::Cancelled, Some(ErrorCode::RequestCancelled), None);
    }
}

/// Holds a lane out of admission until its event's host operations have
/// all ended.
async fn quarantine(app: &Arc<App>, lane_id: usize, scope: &EventScope) {
    app.board.set_quarantined(lane_id);
    tracing::warn!(app = %app.name, lane = lane_id, live = scope.live(), "lane quarantined until its host operations settle");
    scope.settled().await;
}

/// Reads what a guest writes into a body nobody will read, and throws it
/// away, until the guest finishes the body or its generation goes.
pub async fn discard(mut body: GuestBody) {
    while let Some(Ok(_)) = body.frame().await {}
}

/// A session outcome that is already known.
pub fn settled(end: SessionEnd) -> oneshot::Receiver<SessionEnd> {
    let (tx, rx) = oneshot::channel();
    let _ = tx.send(end);
    rx
}

/// Puts a generation that ended its event cleanly back in its lane when
/// `keep` (its retirement said so), or retires it and renews the lane.
async fn finish_lane(app: &Arc<App>, mut guard: LaneGuard, generation: Generation, keep: bool) {
    let lane_id = guard.lane().id;
    if keep {
        app.board.set_idle(lane_id, generation.number);
        guard.lane().generation = Some(generation);
        return;
    }
    // The old store's teardown (resetting its memory) and the next
    // instantiation run as a task of their own, never on the way of the
    // response the transport is sending (the event may be driven inline
    // by it: see `EventTask`). The lane stays held until they are done.
    let app = app.clone();
    tokio::spawn(async move {
        drop(generation);
        app.metrics.generation_retired();
        let fresh = renew(&app, lane_id).await;
        app.board.set_idle(lane_id, fresh.number);
        guard.lane().generation = Some(fresh);
    });
}

/// Instantiates a fresh generation for a lane, retrying with backoff while
/// instantiation fails. The lane is marked unavailable meanwhile.
async fn renew(app: &Arc<App>, lane_id: usize) -> Generation {
    app.board.set_renewing(lane_id);
    let mut backoff = RENEW_BACKOFF_START;
    loop {
        match Box::pin(app.instantiate()).await {
            Ok(generation) => return generation,
            Err(_) => {
                app.board.set_unavailable(lane_id);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RENEW_BACKOFF_MAX);
            }
        }
    }
}

fn fail_event(
    receipt: &Receipt,
    reply_tx: &mut Option<oneshot::Sender<Reply>>,
    outcome: Outcome,
    code: ErrorCode,
    detail: Option<String>,
) {
    receipt.fail(outcome, Some(code), detail);
    if let Some(tx) = reply_tx.take() {
        receipt.status(code.status());
        let _ = tx.send(Reply::Failure(code));
    }
}

fn invalid_response(
    receipt: &Receipt,
    reply_tx: &mut Option<oneshot::Sender<Reply>>,
    code: Option<WasiErrorCode>,
) {
    let detail = match code {
        Some(code) => format!("guest answered with an error: {code:?}"),
        None => "guest returned without setting a response".to_string(),
    };
    fail_event(
        receipt,
        reply_tx,
        Outcome::Trap,
        ErrorCode::InvalidResponse,
        Some(detail),
    );
}

pub use crate::invocation::truncate;
