//! The mailbox: calls to an actor, queued in arrival order and run one turn
//! after another.
//!
//! Invariants owned here:
//! - an actor runs one turn at a time, in arrival order; at most
//!   `actor_max_queued` callers wait, and one more is refused at once with
//!   `actor_overloaded`;
//! - a turn, once started, runs to its end on its own task: a caller that
//!   leaves does not cut a turn short (its writes commit or roll back as a
//!   whole), and a caller that left before its turn began never enters Wasm.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::oneshot;
use weir_runtime::ErrorCode;
use weir_runtime::error_code::error_response;
use weir_runtime::extension::InternalRouter;

use crate::address::ActorAddress;
use crate::error_code::{ActorErrorCode, TurnError};
use crate::host::{ActorHost, Cell, Claim};
use crate::placement::{Forwarded, Location};
use crate::receipts::{TurnKind, TurnNotes};
use crate::turn::request_turn;

/// The calls of one actor waiting for their turns, and whether a runner
/// task is taking them.
#[derive(Default)]
pub(crate) struct Inbox {
    pub(crate) calls: std::collections::VecDeque<QueuedCall>,
    running: bool,
}

/// A call waiting for its turn; its claim keeps the actor in memory.
pub(crate) struct QueuedCall {
    request: http::Request<Bytes>,
    pub(crate) reply: oneshot::Sender<http::Response<Bytes>>,
    arrived: Instant,
    claim: Claim,
}

impl ActorHost {
    /// Runs a call to the actor at `address`, here or, in cluster mode, on
    /// the node that owns it.
    pub async fn call_address(
        self: &Arc<Self>,
        address: ActorAddress,
        request: http::Request<Bytes>,
    ) -> http::Response<Bytes> {
        if self.class(&address.class).is_err() {
            return error_response(ActorErrorCode::ClassUnknown);
        }
        let Some(placement) = self.placement.clone() else {
            return self.call_local(address, request).await;
        };
        let (parts, body) = request.into_parts();
        // Handed on at most twice: again only when it did not run where it
        // was sent.
        let mut last = TurnError::from(ErrorCode::HostUnavailable);
        for attempt in 0..2 {
            match placement.locate(&address, attempt > 0, false).await {
                Ok(Location::Here) => {
                    return self
                        .call_local(address, http::Request::from_parts(parts, body))
                        .await;
                }
                Ok(Location::Elsewhere(node)) => {
                    let request = copy_request(&parts, body.clone());
                    match placement.forward(node, address.clone(), request).await {
                        Forwarded::Answered(response) => return response,
                        Forwarded::Failed(code) => return error_response(code),
                        Forwarded::NotRun(code) => last = code,
                    }
                }
                Err(code) => return error_response(code),
            }
        }
        error_response(last)
    }

    /// Runs a call that another node handed here: here, or not at all
    /// (`None`: this node does not own the actor, and nothing ran).
    pub async fn call_forwarded(
        self: &Arc<Self>,
        address: ActorAddress,
        request: http::Request<Bytes>,
    ) -> Option<http::Response<Bytes>> {
        if self.class(&address.class).is_err() {
            return Some(error_response(ActorErrorCode::ClassUnknown));
        }
        if let Some(placement) = &self.placement {
            match placement.locate(&address, false, true).await {
                Ok(Location::Here) => {}
                Ok(Location::Elsewhere(_)) => return None,
                Err(code) => return Some(error_response(code)),
            }
        }
        Some(self.call_local(address, request).await)
    }

    /// Runs a call to the actor at `address` on this node.
    async fn call_local(
        self: &Arc<Self>,
        address: ActorAddress,
        request: http::Request<Bytes>,
    ) -> http::Response<Bytes> {
        let Ok(class) = self.class(&address.class) else {
            return error_response(ActorErrorCode::ClassUnknown);
        };
        let claim = match self.claim(&address, &class, Some(class.limits.actor_max_queued)) {
            Ok(claim) => claim,
            Err(code) => {
                if code == TurnError::Actor(ActorErrorCode::Overloaded) {
                    self.counters.overloaded.fetch_add(1, Ordering::Relaxed);
                    class.actor_metrics.overloaded();
                }
                return error_response(code);
            }
        };
        let (reply, rx) = oneshot::channel();
        let cell = claim.cell.clone();
        let start_runner = {
            let mut inbox = cell.inbox.lock().unwrap_or_else(|p| p.into_inner());
            inbox.calls.push_back(QueuedCall {
                request,
                reply,
                arrived: Instant::now(),
                claim,
            });
            !std::mem::replace(&mut inbox.running, true)
        };
        if start_runner {
            tokio::spawn(self.clone().run_calls(cell));
        }
        rx.await
            .unwrap_or_else(|_| error_response(ErrorCode::HostUnavailable))
    }

    /// Runs an actor's queued calls, one turn after another, on one task:
    /// the next turn starts as soon as the last one ends, with no hand-off
    /// between tasks. Turns run here, not on the callers' tasks, so a
    /// caller that goes away does not cut one short; a caller that left
    /// before its turn began is skipped. Between turns the actor is
    /// released, so due timers and operators get their turn in order.
    async fn run_calls(self: Arc<Self>, cell: Arc<Cell>) {
        loop {
            let mut live = cell.live.lock().await;
            let call = {
                let mut inbox = cell.inbox.lock().unwrap_or_else(|p| p.into_inner());
                match inbox.calls.pop_front() {
                    Some(call) => call,
                    None => {
                        inbox.running = false;
                        return;
                    }
                }
            };
            let QueuedCall {
                request,
                reply,
                arrived,
                claim,
            } = call;
            if reply.is_closed() {
                continue; // the caller left before its turn: never run it
            }
            let queued = arrived.elapsed();
            let class = cell.class.load_full();
            let (response, report) =
                request_turn(&self.context(&cell, &class), &mut live, request).await;
            self.after_turn(&cell, &live, false);
            self.counters.turns.fetch_add(1, Ordering::Relaxed);
            // The receipt's end is taken while the turn is still held, so
            // its time span never overlaps the next turn's.
            let ended = Instant::now();
            let answer = Answer {
                reply,
                response,
                report,
                queued,
                arrived,
                ended,
                claim,
            };
            match live.gate.clone().filter(|g| g.replicated()) {
                None => {
                    drop(live);
                    self.answer(&cell, &class, answer, None);
                }
                Some(gate) => {
                    // Cluster mode: the next turn runs while this one's
                    // commits travel; its answer leaves once they are
                    // durable (the output gate), or not at all.
                    compact(&cell.address, live.gate.clone()).await;
                    drop(live);
                    let host = self.clone();
                    let cell = cell.clone();
                    gate.on_settled(Box::new(move |settled| {
                        host.answer(&cell, &class, answer, settled.err());
                    }));
                }
            }
        }
    }

    /// Sends a turn's answer (or, when its commits did not become durable,
    /// the error that says so) and writes its receipt.
    fn answer(
        &self,
        cell: &Cell,
        class: &crate::host::ActorClass,
        answer: Answer,
        unsettled: Option<TurnError>,
    ) {
        let Answer {
            reply,
            mut response,
            mut report,
            queued,
            arrived,
            ended,
            claim,
        } = answer;
        // A turn that failed answers its own error; one that succeeded
        // answers only if what it wrote or read is durable and this node
        // may still speak for the actor.
        if let Some(code) = unsettled
            && report.error.is_none()
        {
            report.fail(
                code,
                Some("the turn's commits did not become durable".into()),
            );
            response = error_response(code);
        }
        let status = response.status().as_u16();
        let _ = reply.send(response);
        self.receipt(
            cell,
            class,
            TurnKind::Request,
            &report,
            TurnNotes {
                status: Some(status),
                queued: Some(queued),
                ..Default::default()
            },
            arrived,
            ended,
        );
        drop(claim);
        if report.refused_new() {
            self.forget_unopened(&cell.address);
        }
    }
}

/// Between a replica's turns: snapshots it when its log has grown enough
/// (read through SQLite, queued behind its commits: nothing waits), and
/// checkpoints its WAL when that has grown long, once everything shipped
/// has settled (a brief pause of the actor, every 32,768 frames).
pub(crate) async fn compact(address: &ActorAddress, gate: Option<Arc<crate::gate::TurnGate>>) {
    let Some(gate) = gate else { return };
    if let Err(why) = gate.snapshot_if_wanted() {
        tracing::warn!(actor = %address, error = %why, "cannot snapshot an actor; its log keeps growing until the next try");
    }
    if gate.checkpoint_due()
        && let Some(ready) = gate.settled()
        && ready.await.is_ok()
        && let Err(why) = gate.checkpoint_shipped()
    {
        tracing::warn!(actor = %address, error = %why, "cannot checkpoint an actor's WAL");
    }
}

/// A request turn's answer, on its way to its caller.
struct Answer {
    reply: oneshot::Sender<http::Response<Bytes>>,
    response: http::Response<Bytes>,
    report: crate::turn::TurnReport,
    queued: std::time::Duration,
    arrived: Instant,
    ended: Instant,
    /// Keeps the actor in memory until its answer has left.
    claim: Claim,
}

/// Where a request to an actor goes: the whole authority, so that a port
/// or user information makes the address invalid rather than being
/// dropped.
fn request_host(request: &http::Request<Bytes>) -> String {
    request
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            request
                .headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// A request again, for a second hop (the body is shared, not copied).
fn copy_request(parts: &http::request::Parts, body: Bytes) -> http::Request<Bytes> {
    let mut request = http::Request::new(body);
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    // The call's chain goes with it, hop after hop.
    *request.extensions_mut() = parts.extensions.clone();
    request
}

impl InternalRouter for ActorHost {
    fn handles(&self, host: &str) -> bool {
        ActorAddress::is_actor_host(host)
    }

    fn call(
        self: Arc<Self>,
        mut request: http::Request<Bytes>,
        caller: Option<weir_runtime::extension::Caller>,
    ) -> std::pin::Pin<Box<dyn Future<Output = http::Response<Bytes>> + Send>> {
        let refuse = |code: TurnError| Box::pin(std::future::ready(error_response(code))) as _;
        let Ok(address) = ActorAddress::from_host(&request_host(&request)) else {
            return refuse(ActorErrorCode::AddressInvalid.into());
        };
        // An actor calling: the call carries the actors that wait on it,
        // and one back into them is refused before it waits on itself.
        if let Some(identity) = caller
            .as_ref()
            .and_then(|c| c.downcast_ref::<crate::bindings::ActorIdentity>())
        {
            match crate::call_chain::CallChain::through(identity, &address) {
                Ok(chain) => {
                    request.extensions_mut().insert(chain);
                }
                Err(code) => return refuse(code.into()),
            }
        }
        Box::pin(async move { self.call_address(address, request).await })
    }
}
