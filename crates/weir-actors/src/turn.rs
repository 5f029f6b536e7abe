//! Turns: one event of one actor — a call or a due timer — run on the
//! actor's generation inside one storage transaction.
//!
//! Invariants owned here:
//! - a turn's writes commit when it ends well, and only then does its
//!   response leave (the output gate); a turn that traps, overruns its
//!   deadline, grows past its memory or answers badly is rolled back, and
//!   a generation whose call did not return is dropped at once;
//! - a commit that fails resets the actor — its generation and its open
//!   database are dropped — and the turn answers `storage_commit_failed`;
//!   none of its writes are visible afterwards;
//! - every fresh generation of an actor adopts the persisted incarnation
//!   counter and bumps it durably before the guest runs (see
//!   `weir_store::actor`), so two instances never share a number.

use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use wasmtime_wasi_http::WasiHttpView;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use weir_runtime::actor_host::{ActorIdentity, ActorSeat, TurnGate, now_ms};
use weir_runtime::event::truncate;
use weir_runtime::generation::Generation;
use weir_runtime::scope::EventScope;
use weir_runtime::{AppCode, ErrorCode};

use crate::address::ActorAddress;
use crate::directory::ActorDirectory;
use crate::timers::{ALARM_MAX_RETRIES, retry_at};

/// What is alive of one actor between its turns.
#[derive(Default)]
pub struct Live {
    pub gate: Option<Arc<TurnGate>>,
    pub generation: Option<Generation>,
    pub incarnation: u64,
}

impl Live {
    /// Drops the generation and closes the database: after a failed commit
    /// nothing of the actor's state in memory is trusted.
    pub fn reset(&mut self) {
        self.generation = None;
        self.gate = None;
    }

    /// The actor's earliest timer, from its database.
    pub fn next_deadline(&self) -> Option<i64> {
        self.gate
            .as_ref()
            .and_then(|g| g.with_db(|db| db.next_deadline().ok().flatten()))
    }
}

/// What a turn needs to know about where it runs.
pub struct TurnContext<'a> {
    pub address: &'a ActorAddress,
    pub code: &'a AppCode,
    pub directory: &'a ActorDirectory,
    pub metrics: &'a weir_runtime::metrics::AppMetrics,
    /// Numbers generations for receipts and logs (per class).
    pub next_generation: &'a std::sync::atomic::AtomicU64,
}

/// How a turn ended, for its receipt.
#[derive(Debug, Default)]
pub struct TurnReport {
    pub incarnation: u64,
    pub error: Option<ErrorCode>,
    pub detail: Option<String>,
    pub wasm: Option<Duration>,
    /// The turn instantiated the actor (a wake from hibernation or a fresh
    /// incarnation).
    pub woke: bool,
}

/// Makes sure the actor has an open database and a live generation.
async fn wake(
    ctx: &TurnContext<'_>,
    live: &mut Live,
    report: &mut TurnReport,
) -> Result<(), String> {
    if live.gate.is_none() {
        let mut db = ctx
            .directory
            .open(ctx.address)
            .map_err(|e| format!("cannot open the actor's database: {e}"))?;
        db.set_max_result_bytes(ctx.code.limits.max_sql_result_bytes);
        live.gate = Some(TurnGate::new(db));
    }
    if live.generation.is_some() {
        return Ok(());
    }
    let gate = live.gate.clone().expect("opened above");
    let incarnation = gate
        .with_db(|db| db.adopt_incarnation())
        .map_err(|e| format!("cannot adopt the incarnation counter: {e}"))?;
    let seat = ActorSeat {
        identity: ActorIdentity {
            class: ctx.address.class.clone(),
            name: ctx.address.name.clone(),
            incarnation,
        },
        gate,
        has_alarm: ctx.code.alarm.is_some(),
    };
    let number = ctx
        .next_generation
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let generation = Generation::instantiate(ctx.code, ctx.metrics, number, Some(seat))
        .await
        .map_err(|e| {
            if e.over_budget {
                report.error = Some(ErrorCode::MemoryBudgetExceeded);
            }
            e.reason
        })?;
    ctx.metrics.generation_created();
    live.generation = Some(generation);
    live.incarnation = incarnation;
    report.woke = true;
    Ok(())
}

/// A JSON error response, as Weir answers everywhere.
pub fn error_response(code: ErrorCode) -> http::Response<Bytes> {
    http::Response::builder()
        .status(code.status())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::CACHE_CONTROL, "no-store")
        .header("x-content-type-options", "nosniff")
        .body(Bytes::from(code.body()))
        .expect("static parts are valid")
}

enum Verdict {
    Answered(http::response::Parts, Bytes),
    Trap(String),
    Deadline,
    Invalid(String),
    BodyTooLarge,
}

/// Why an actor's response body could not be collected.
enum BodyFailure {
    TooLarge,
    Failed(String),
}

type BodyFuture = Pin<Box<dyn Future<Output = Result<Bytes, BodyFailure>> + Send>>;

/// Runs a call as one turn and returns what the caller receives.
pub async fn request_turn(
    ctx: &TurnContext<'_>,
    live: &mut Live,
    request: http::Request<Bytes>,
) -> (http::Response<Bytes>, TurnReport) {
    let mut report = TurnReport::default();
    if let Err(e) = wake(ctx, live, &mut report).await {
        let code = *report.error.get_or_insert(ErrorCode::HostUnavailable);
        report.detail = Some(truncate(e));
        return (error_response(code), report);
    }
    report.incarnation = live.incarnation;
    let limits = &ctx.code.limits;
    let gate = live.gate.clone().expect("woken");
    // The turn's statements stop at its deadline, or at once if it is
    // abandoned.
    let scope = EventScope::new(limits.max_operations);
    let deadline = Instant::now() + limits.event_limit;
    scope.set_deadline(deadline);
    if let Err(e) = gate.begin(scope.stop_check()) {
        live.reset();
        report.error = Some(ErrorCode::StorageCommitFailed);
        report.detail = Some(e.to_string());
        return (error_response(ErrorCode::StorageCommitFailed), report);
    }
    let generation = live.generation.as_mut().expect("woken");
    generation.admitted += 1;
    generation.store.data_mut().set_scope(Some(scope.clone()));

    let (parts, body) = request.into_parts();
    let request = http::Request::from_parts(parts, Full::new(body));
    let (out_tx, mut out_rx) = tokio::sync::oneshot::channel();
    let handles = {
        let mut view = generation.store.data_mut().http();
        view.new_incoming_request(Scheme::Http, request)
            .and_then(|req| Ok((req, view.new_response_outparam(out_tx)?)))
    };
    let (req, out) = match handles {
        Ok(handles) => handles,
        Err(e) => {
            gate.rollback();
            generation.store.data_mut().set_scope(None);
            report.error = Some(ErrorCode::BadRequest);
            report.detail = Some(e.to_string());
            return (error_response(ErrorCode::BadRequest), report);
        }
    };

    let entered = Instant::now();
    let max_body = limits.max_response_body_bytes as usize;
    let mut returned = false;
    let verdict = {
        let Generation { store, proxy, .. } = &mut *generation;
        let mut call = pin!(
            proxy
                .wasi_http_incoming_handler()
                .call_handle(&mut *store, req, out)
        );
        let mut head: Option<http::response::Parts> = None;
        let mut body: Option<BodyFuture> = None;
        let mut headers_seen = false;
        let mut collected: Option<Bytes> = None;
        loop {
            tokio::select! {
                biased;
                response = &mut out_rx, if !headers_seen => {
                    headers_seen = true;
                    match response {
                        Ok(Ok(response)) => {
                            let (parts, guest_body) = response.into_parts();
                            head = Some(parts);
                            body = Some(Box::pin(async move {
                                Limited::new(guest_body, max_body)
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
                            }));
                        }
                        Ok(Err(code)) => break Verdict::Invalid(format!("guest answered with an error: {code:?}")),
                        Err(_) => break Verdict::Invalid("guest returned without setting a response".into()),
                    }
                }
                finished = async { body.as_mut().expect("guarded").await }, if body.is_some() => {
                    body = None;
                    match finished {
                        Ok(bytes) if returned => break Verdict::Answered(head.take().expect("head before body"), bytes),
                        // The body is complete; the guest is finishing.
                        Ok(bytes) => collected = Some(bytes),
                        Err(BodyFailure::TooLarge) => break Verdict::BodyTooLarge,
                        Err(BodyFailure::Failed(e)) => break Verdict::Invalid(format!("response body failed: {e}")),
                    }
                }
                result = &mut call, if !returned => {
                    match result {
                        Ok(()) => {
                            returned = true;
                            if let Some(bytes) = collected.take() {
                                break Verdict::Answered(head.take().expect("head before body"), bytes);
                            }
                        }
                        Err(e) => break Verdict::Trap(truncate(e.root_cause().to_string())),
                    }
                }
                _ = tokio::time::sleep_until(deadline.into()) => break Verdict::Deadline,
            }
        }
    };
    report.wasm = Some(entered.elapsed());
    // An answer that comes after the deadline is late, even when it beat
    // the deadline's timer (a statement stopped at the deadline lets the
    // guest answer at once).
    let verdict = match verdict {
        Verdict::Answered(..) if Instant::now() >= deadline => Verdict::Deadline,
        other => other,
    };
    generation.store.data_mut().set_scope(None);
    if !matches!(verdict, Verdict::Answered(..)) {
        // Its statements stop now, not at the deadline.
        scope.invalidate();
    }
    scope.close();
    scope.abort();
    if scope.live() > 0 && !scope.drain(limits.cleanup_timeout).await {
        // A storage call still holds the actor's database: the turn can
        // neither commit nor wait. The actor is reset; its database
        // closes (rolling the turn back) when that call ends.
        tracing::warn!(actor = %ctx.address, "an actor turn's host operations outlived cleanup_timeout_ms; resetting the actor");
        live.reset();
        ctx.metrics.generation_abandoned();
        report.error = Some(ErrorCode::StorageCleanupUnconfirmed);
        return (error_response(ErrorCode::StorageCleanupUnconfirmed), report);
    }

    let failure = match verdict {
        Verdict::Answered(parts, bytes) => {
            // The output gate: the turn's writes are durable before its
            // response leaves.
            return match gate.commit() {
                Ok(()) => {
                    if generation.admitted >= limits.retirement_admission_limit {
                        live.generation = None;
                        ctx.metrics.generation_retired();
                    }
                    (http::Response::from_parts(parts, bytes), report)
                }
                Err(why) => {
                    live.reset();
                    ctx.metrics.generation_abandoned();
                    report.error = Some(ErrorCode::StorageCommitFailed);
                    report.detail = Some(truncate(why));
                    (error_response(ErrorCode::StorageCommitFailed), report)
                }
            };
        }
        Verdict::Trap(detail) => {
            let code = generation
                .store
                .data()
                .memory_refusal()
                .unwrap_or(ErrorCode::InstanceAbandoned);
            (code, Some(detail))
        }
        Verdict::Deadline => (ErrorCode::EventDeadlineExceeded, None),
        Verdict::Invalid(detail) => (ErrorCode::InvalidResponse, Some(detail)),
        Verdict::BodyTooLarge => (ErrorCode::ResponseBodyTooLarge, None),
    };
    gate.rollback();
    if !returned {
        // The guest was stopped mid-call: its instance is not reusable.
        live.generation = None;
        ctx.metrics.generation_abandoned();
    }
    let (code, detail) = failure;
    report.error = Some(code);
    report.detail = detail;
    (error_response(code), report)
}

/// How one alarm delivery ended.
#[derive(Debug)]
pub enum AlarmOutcome {
    /// The handler ran; `rearmed` is the new deadline it returned.
    Delivered { rearmed: Option<u64> },
    /// The handler failed; it will be retried at `retry_at_ms`.
    Retrying {
        attempt: u32,
        retry_at_ms: i64,
        why: String,
    },
    /// The handler failed its last retry; the timer was dropped.
    Dropped { attempts: u32, why: String },
    /// The turn's commit failed: the actor was reset, the timer stays.
    CommitFailed(String),
}

/// Delivers every timer due now as its own turn, in deadline order. The
/// due set is read once, before any handler runs.
pub async fn alarm_turns(
    ctx: &TurnContext<'_>,
    live: &mut Live,
    mut each: impl FnMut(&str, &AlarmOutcome, &TurnReport),
) -> Result<(), String> {
    let mut report = TurnReport::default();
    wake(ctx, live, &mut report).await?;
    let now = now_ms();
    let due = live
        .gate
        .as_ref()
        .expect("woken")
        .with_db(|db| db.due(now))
        .map_err(|e| e.to_string())?;
    let mut woke = report.woke;
    for timer in due {
        let mut report = TurnReport {
            // The first turn after a wake is the one that paid for it.
            woke: std::mem::take(&mut woke),
            ..Default::default()
        };
        wake(ctx, live, &mut report).await?;
        report.incarnation = live.incarnation;
        let outcome = alarm_turn(ctx, live, &timer.reason, timer.attempt, &mut report).await;
        each(&timer.reason, &outcome, &report);
        if matches!(outcome, AlarmOutcome::CommitFailed(_)) {
            break;
        }
    }
    Ok(())
}

async fn alarm_turn(
    ctx: &TurnContext<'_>,
    live: &mut Live,
    reason: &str,
    attempt: u32,
    report: &mut TurnReport,
) -> AlarmOutcome {
    let limits = &ctx.code.limits;
    let gate = live.gate.clone().expect("woken");
    let generation = live.generation.as_mut().expect("woken");
    let Some(alarm) = generation.alarm else {
        // Timers cannot be scheduled without the export; a database made
        // by an older build of the class may still hold some.
        let _ = gate.with_db(|db| db.cancel(reason));
        return AlarmOutcome::Dropped {
            attempts: attempt,
            why: "the class does not export weir:actor/alarm".into(),
        };
    };
    let scope = EventScope::new(limits.max_operations);
    let deadline = Instant::now() + limits.event_limit;
    scope.set_deadline(deadline);
    if let Err(e) = gate
        .begin(scope.stop_check())
        .and_then(|()| gate.with_db(|db| db.cancel(reason).map(drop)))
    {
        live.reset();
        return AlarmOutcome::CommitFailed(e.to_string());
    }
    generation.admitted += 1;
    generation.store.data_mut().set_scope(Some(scope.clone()));
    let entered = Instant::now();
    let result = tokio::time::timeout_at(
        deadline.into(),
        alarm.call_async(&mut generation.store, (reason.to_string(),)),
    )
    .await;
    report.wasm = Some(entered.elapsed());
    // A handler that returns after the deadline is late, even when it beat
    // the timer (a statement stopped at the deadline returns at once).
    let late = Instant::now() >= deadline;
    generation.store.data_mut().set_scope(None);
    if late || !matches!(result, Ok(Ok((Ok(_),)))) {
        scope.invalidate();
    }
    scope.close();
    scope.abort();
    if scope.live() > 0 && !scope.drain(limits.cleanup_timeout).await {
        // As for a request turn: the actor is reset without touching its
        // database; the timer stays and is retried.
        tracing::warn!(actor = %ctx.address, reason, "an alarm turn's host operations outlived cleanup_timeout_ms; resetting the actor");
        live.reset();
        ctx.metrics.generation_abandoned();
        report.error = Some(ErrorCode::StorageCleanupUnconfirmed);
        return AlarmOutcome::CommitFailed("host operations outlived cleanup_timeout_ms".into());
    }
    let failure = match result {
        Ok(Ok(_)) if late => {
            report.error = Some(ErrorCode::EventDeadlineExceeded);
            "the handler returned after event_limit_ms".into()
        }
        Ok(Ok((Ok(rearm),))) => {
            let scheduled = match rearm {
                Some(at) => {
                    gate.with_db(|db| db.schedule(reason, i64::try_from(at).unwrap_or(i64::MAX)))
                }
                None => Ok(()),
            };
            match scheduled
                .map_err(|e| e.to_string())
                .and_then(|()| gate.commit())
            {
                Ok(()) => {
                    if generation.admitted >= limits.retirement_admission_limit {
                        live.generation = None;
                        ctx.metrics.generation_retired();
                    }
                    return AlarmOutcome::Delivered { rearmed: rearm };
                }
                Err(why) => {
                    gate.rollback();
                    live.reset();
                    ctx.metrics.generation_abandoned();
                    report.error = Some(ErrorCode::StorageCommitFailed);
                    report.detail = Some(truncate(why.clone()));
                    return AlarmOutcome::CommitFailed(why);
                }
            }
        }
        Ok(Ok((Err(message),))) => {
            report.error = Some(ErrorCode::InvalidResponse);
            format!("handler returned an error: {message}")
        }
        Ok(Err(trap)) => {
            report.error = Some(
                generation
                    .store
                    .data()
                    .memory_refusal()
                    .unwrap_or(ErrorCode::InstanceAbandoned),
            );
            live.generation = None;
            ctx.metrics.generation_abandoned();
            truncate(trap.root_cause().to_string())
        }
        Err(_) => {
            report.error = Some(ErrorCode::EventDeadlineExceeded);
            live.generation = None;
            ctx.metrics.generation_abandoned();
            "the handler did not return within event_limit_ms".into()
        }
    };
    gate.rollback();
    report.detail = Some(failure.clone());
    let attempt = attempt + 1;
    let at = retry_at(now_ms(), attempt);
    let recorded = if attempt > ALARM_MAX_RETRIES {
        gate.with_db(|db| db.cancel(reason).map(drop))
    } else {
        gate.with_db(|db| db.retry_alarm(reason, at, attempt))
    };
    if let Err(e) = recorded {
        live.reset();
        return AlarmOutcome::CommitFailed(e.to_string());
    }
    if attempt > ALARM_MAX_RETRIES {
        AlarmOutcome::Dropped {
            attempts: attempt,
            why: failure,
        }
    } else {
        AlarmOutcome::Retrying {
            attempt,
            retry_at_ms: at,
            why: failure,
        }
    }
}
