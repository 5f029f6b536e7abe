//! Turns: one event of one actor — a call or a due timer — run on the
//! runtime's invocation machine, inside one storage transaction.
//!
//! Invariants owned here (the transaction policy; how a call runs and ends
//! is the runtime's `invocation`):
//! - a turn's writes commit when it ends well, and only then does its
//!   response leave (the output gate); a turn that traps, overruns its
//!   deadline, grows past its memory or answers badly is rolled back, and
//!   a generation whose call did not return is dropped at once;
//! - a commit that fails resets the actor — its generation and its open
//!   database are dropped — and the turn answers `storage_commit_failed`;
//!   none of its writes are visible afterwards;
//! - a storage call still holding the database when the turn's cleanup
//!   budget runs out resets the actor without touching the database (it
//!   closes, rolling the turn back, when that call ends);
//! - every fresh generation of an actor adopts the persisted incarnation
//!   counter and bumps it durably before the guest runs (see
//!   `weir_store::actor`), so two instances never share a number.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use wasmtime::component::{ComponentExportIndex, TypedFunc};
use weir_runtime::buffered;
use weir_runtime::error_code::error_response;
use weir_runtime::extension::Extras;
use weir_runtime::generation::Generation;
use weir_runtime::invocation::{self, Ending, NoResponse, Timing};
use weir_runtime::scope::EventScope;
use weir_runtime::{AppCode, ErrorCode};

use crate::address::ActorAddress;
use crate::bindings::{ActorIdentity, ActorSeat};
use crate::call_chain::{CallChain, TurnChain};
use crate::directory::{ActorDirectory, OpenError};
use crate::error_code::{ActorErrorCode, TurnError};
use crate::gate::TurnGate;
use crate::placement::Placement;
use crate::storage_room::RoomShare;
use crate::timer_ledger::LedgerRow;
use crate::timers::{ALARM_MAX_RETRIES, now_ms, retry_at};
use weir_store::timers::DueTimer;

/// `alarm: func(reason: string) -> result<option<u64>, string>`.
pub type AlarmFunc = TypedFunc<(String,), (Result<Option<u64>, String>,)>;

/// What is alive of one actor between its turns.
#[derive(Default)]
pub struct Live {
    pub gate: Option<Arc<TurnGate>>,
    pub generation: Option<Generation>,
    /// The generation's `alarm` export, when the class has one.
    pub alarm: Option<AlarmFunc>,
    pub incarnation: u64,
    /// The class install the generation was made from.
    pub install: u64,
    /// The chain of the turn running now, as the generation's identity
    /// shows it to the routers it calls.
    pub chain: TurnChain,
}

impl Live {
    /// Drops the generation and closes the database: after a failed commit
    /// nothing of the actor's state in memory is trusted.
    pub fn reset(&mut self) {
        self.generation = None;
        self.alarm = None;
        self.gate = None;
    }

    /// Drops the generation only (its call was cut short, or it retired).
    fn drop_generation(&mut self) {
        self.generation = None;
        self.alarm = None;
    }
}

/// What a turn needs to know about where it runs.
pub struct TurnContext<'a> {
    pub address: &'a ActorAddress,
    pub code: &'a AppCode,
    /// The class's `weir:actor/alarm#alarm` export, if it has one.
    pub alarm: Option<&'a ComponentExportIndex>,
    pub directory: &'a ActorDirectory,
    /// The timer ledger, on one machine.
    pub ledger: Option<&'a Arc<weir_store::timer_ledger::TimerLedger>>,
    /// Where the actor's storage is made durable beyond this process, if
    /// anywhere (cluster mode).
    pub placement: Option<&'a Arc<dyn Placement>>,
    /// Told of each opening of the actor's storage in cluster mode.
    pub handover: Option<&'a Arc<dyn crate::handover::Handover>>,
    /// The layers that keep something in actors' names, each told of each
    /// opening of the actor's storage ([`crate::Holdings::opened`]).
    pub holdings: &'a std::sync::Mutex<Vec<Arc<dyn crate::holdings::Holdings>>>,
    pub metrics: &'a weir_runtime::metrics::AppMetrics,
    /// Numbers generations for receipts and logs (per class).
    pub next_generation: &'a std::sync::atomic::AtomicU64,
    /// Which install of the class the turn runs.
    pub install: u64,
}

/// How a turn ended, for its receipt.
#[derive(Debug, Default)]
pub struct TurnReport {
    pub incarnation: u64,
    pub error: Option<TurnError>,
    pub detail: Option<String>,
    pub wasm: Option<Duration>,
    /// Host operations the turn started, and refused for capacity.
    pub operations: (usize, usize),
    /// The turn instantiated the actor (a wake from hibernation or a fresh
    /// incarnation).
    pub woke: bool,
}

impl TurnReport {
    /// The turn was refused because its actor would have been a new one
    /// past `max_actors` or `max_actor_storage_bytes`.
    pub(crate) fn refused_new(&self) -> bool {
        [ActorErrorCode::TooMany, ActorErrorCode::StorageFull]
            .iter()
            .any(|&code| self.error == Some(code.into()))
    }

    pub(crate) fn fail(&mut self, code: impl Into<TurnError>, detail: Option<String>) {
        self.error = Some(code.into());
        self.detail = detail.map(invocation::truncate);
    }
}

/// Opens the actor's storage (through its placement in cluster mode, its
/// local copy made current first): what a wake and an operator's
/// inspection of a hibernated actor start with. A refusal names its code
/// in `report`.
pub(crate) async fn open_storage(
    ctx: &TurnContext<'_>,
    report: &mut TurnReport,
) -> Result<Arc<TurnGate>, String> {
    let refused = |report: &mut TurnReport, e: OpenError, what: &str| {
        match e {
            OpenError::TooMany { .. } => report.error = Some(ActorErrorCode::TooMany.into()),
            OpenError::NoRoom { .. } => report.error = Some(ActorErrorCode::StorageFull.into()),
            OpenError::Store(_) => {}
        }
        format!("{what}: {e}")
    };
    // What the room counts for the actor while it is closed: its
    // files, as they are before anything opens them.
    let files = ctx.directory.files_bytes(ctx.address);
    let (mut db, durable) = match ctx.placement {
        None => match ctx.directory.open(ctx.address) {
            Ok(db) => (db, None),
            Err(e) => return Err(refused(report, e, "cannot open the actor's database")),
        },
        Some(placement) => {
            let (path, new) = match ctx.directory.prepare(ctx.address) {
                Ok(prepared) => prepared,
                Err(e) => return Err(refused(report, e, "cannot make the actor's place")),
            };
            match placement.open(ctx.address, &path).await {
                Ok((db, durable)) => (db, Some(durable)),
                Err(code) => {
                    if new {
                        ctx.directory.not_made(&path);
                    }
                    report.error = Some(code);
                    return Err(format!(
                        "cannot open the actor's storage here: {}",
                        weir_runtime::WeirError::as_str(code)
                    ));
                }
            }
        }
    };
    db.set_max_result_bytes(ctx.code.limits.max_sql_result_bytes);
    let room = RoomShare::open(
        ctx.directory.room().clone(),
        ctx.directory.path(ctx.address),
        &mut db,
        files,
        ctx.code.limits.max_database_bytes,
    )
    .map_err(|e| format!("cannot bound the actor's storage: {e}"))?;
    // On one machine, the ledger's row is lowered before a commit that
    // brings the actor's earliest timer forward.
    let ledger = match durable {
        None => ctx
            .ledger
            .map(|l| LedgerRow::new(l.clone(), ctx.address.clone())),
        Some(_) => None,
    };
    Ok(TurnGate::open(db, room, durable, ledger))
}

/// Makes sure the actor's database is open (opened anew when its commits
/// did not all become durable), and, in cluster mode, that its handover
/// ran on each opening before anything else of the actor does.
pub(crate) async fn open_if_closed(
    ctx: &TurnContext<'_>,
    live: &mut Live,
    report: &mut TurnReport,
) -> Result<(), String> {
    if let Some(why) = live.gate.as_ref().and_then(|g| g.broken()) {
        // Its commits did not all become durable: nothing of it here is
        // trusted, and it is opened anew (its local copy checked again).
        tracing::info!(actor = %ctx.address, error = weir_runtime::WeirError::as_str(why), "resetting an actor whose commits did not all become durable");
        live.reset();
    }
    if live.gate.is_none() {
        let gate = open_storage(ctx, report).await?;
        live.gate = Some(gate.clone());
        if ctx.placement.is_some()
            && let Some(handover) = ctx.handover
        {
            handover.opened(ctx.address, &gate).await;
        }
        let holdings = ctx
            .holdings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for holding in holdings {
            holding.opened(ctx.address, &gate);
        }
    }
    Ok(())
}

/// Makes sure the actor has an open database and a live generation.
pub(crate) async fn wake(
    ctx: &TurnContext<'_>,
    live: &mut Live,
    report: &mut TurnReport,
) -> Result<(), String> {
    open_if_closed(ctx, live, report).await?;
    if live.generation.is_some() {
        if live.install == ctx.install {
            return Ok(());
        }
        // The class's code was replaced: this turn starts the actor's next
        // incarnation on the new code, on the same storage.
        live.drop_generation();
    }
    let gate = live.gate.clone().expect("opened above");
    // A bump that is not durable fails the wake: the instance would share
    // its number (and its pid base) with the next one.
    let incarnation = gate
        .write_outside(|db| db.adopt_incarnation())
        .map_err(|e| {
            report.error = Some(ActorErrorCode::StorageCommitFailed.into());
            format!("cannot adopt the incarnation counter: {e}")
        })?;
    let seat = ActorSeat {
        identity: ActorIdentity {
            class: ctx.address.class.clone(),
            name: ctx.address.name.clone(),
            incarnation,
            turn_chain: live.chain.clone(),
        },
        gate: gate.clone(),
        has_alarm: ctx.alarm.is_some(),
    };
    let number = ctx
        .next_generation
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Its guest's output names the actor.
    let fields = [
        ("class", ctx.address.class.as_str()),
        ("name", ctx.address.name.as_str()),
    ];
    let extras = Extras {
        caller: Some(Arc::new(seat.identity.clone())),
        data: Some(Box::new(seat)),
        output_gate: Some(gate),
        guest_log: ctx
            .code
            .guest_log
            .as_ref()
            .map(|log| Arc::new(log.with_fields(&fields))),
    };
    let mut generation = Generation::instantiate(ctx.code, ctx.metrics, number, extras)
        .await
        .map_err(|e| {
            if e.over_budget {
                report.error = Some(ErrorCode::MemoryBudgetExceeded.into());
            }
            e.reason
        })?;
    let alarm = match ctx.alarm {
        Some(index) => Some(
            generation
                .instance
                .get_typed_func::<(String,), (Result<Option<u64>, String>,)>(
                    &mut generation.store,
                    index,
                )
                .map_err(|e| format!("the alarm export: {e:#}"))?,
        ),
        None => None,
    };
    ctx.metrics.generation_created();
    live.generation = Some(generation);
    live.alarm = alarm;
    live.incarnation = incarnation;
    live.install = ctx.install;
    report.woke = true;
    Ok(())
}

/// Runs a call as one turn and returns what the caller receives.
pub async fn request_turn(
    ctx: &TurnContext<'_>,
    live: &mut Live,
    request: http::Request<Bytes>,
) -> (http::Response<Bytes>, TurnReport) {
    let mut report = TurnReport::default();
    if let Err(e) = wake(ctx, live, &mut report).await {
        let code = *report
            .error
            .get_or_insert(ErrorCode::HostUnavailable.into());
        report.detail = Some(invocation::truncate(e));
        return (error_response(code), report);
    }
    report.incarnation = live.incarnation;
    // The actors waiting on this call, if an actor made it.
    live.chain.begin(
        request
            .extensions()
            .get::<CallChain>()
            .cloned()
            .unwrap_or_default(),
    );
    let limits = &ctx.code.limits;
    let gate = live.gate.clone().expect("woken");
    // The turn's statements stop at its deadline, or at once if it is
    // abandoned.
    let deadline = Instant::now() + limits.event_limit;
    let scope = EventScope::new(limits.max_operations);
    scope.set_deadline(deadline);
    gate.begin(scope.stop_check());
    let generation = live.generation.as_mut().expect("woken");
    generation.admitted += 1;
    generation.store.data_mut().set_scope(Some(scope.clone()));

    let call = buffered::call(generation, &scope, request, limits, deadline).await;
    report.wasm = Some(call.wasm);
    report.operations = (scope.started(), scope.refused());
    generation.store.data_mut().set_scope(None);
    if !invocation::settle(&scope, call.failure.is_some(), limits.cleanup_timeout).await {
        // A storage call still holds the actor's database: the turn can
        // neither commit nor wait. The actor is reset; its database
        // closes (rolling the turn back) when that call ends.
        tracing::warn!(actor = %ctx.address, "an actor turn's host operations outlived cleanup_timeout_ms; resetting the actor");
        live.reset();
        ctx.metrics.generation_abandoned();
        report.fail(ErrorCode::StorageCleanupUnconfirmed, None);
        return (error_response(ErrorCode::StorageCleanupUnconfirmed), report);
    }
    match (call.failure, call.answer) {
        (None, Ok(response)) => {
            // The output gate: the turn's writes are durable before its
            // response leaves.
            match gate.commit() {
                Ok(()) => {
                    retire_if_done(ctx, live);
                    (response, report)
                }
                Err(why) => {
                    live.reset();
                    ctx.metrics.generation_abandoned();
                    report.fail(ActorErrorCode::StorageCommitFailed, Some(why));
                    (error_response(ActorErrorCode::StorageCommitFailed), report)
                }
            }
        }
        (failure, _) => {
            let (code, detail) = failure.unwrap_or((ErrorCode::InvalidResponse, None));
            gate.rollback();
            if call.cut_short {
                // The guest was stopped mid-call: its instance is not
                // reusable.
                live.drop_generation();
                ctx.metrics.generation_abandoned();
            } else if code == ErrorCode::InvalidResponse && live.generation.is_some() {
                // It returned without a response: its state is broken as
                // far as Weir can know, so the next turn gets a fresh
                // instance (the actor's storage is untouched).
                live.drop_generation();
                ctx.metrics.generation_retired();
            }
            report.fail(code, detail);
            (error_response(code), report)
        }
    }
}

/// Retires the actor's generation once it has served its admissions.
fn retire_if_done(ctx: &TurnContext<'_>, live: &mut Live) {
    if live
        .generation
        .as_ref()
        .is_some_and(|g| g.admitted >= ctx.code.limits.retirement_admission_limit)
    {
        live.drop_generation();
        ctx.metrics.generation_retired();
    }
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

/// Delivers every timer due now as its own turn, in deadline order.
///
/// The due set is read once, before any handler runs, so a handler that
/// re-arms its own reason for "now" runs again in a later dispatch, not
/// this one. A timer of that set runs only if it is still as it was read
/// when its turn comes: one that an earlier handler of the same dispatch
/// cancelled does not fire, and one it moved fires when it was moved to.
/// Deliveries a process that died left unfinished are due again first
/// (see `weir_store::timers`).
pub async fn alarm_turns(
    ctx: &TurnContext<'_>,
    live: &mut Live,
    mut each: impl FnMut(&str, &AlarmOutcome, &TurnReport),
) -> Result<(), String> {
    let mut report = TurnReport::default();
    wake(ctx, live, &mut report).await?;
    let gate = live.gate.clone().expect("woken");
    let recovered = gate.write_outside(|db| db.recover_deliveries())?;
    if recovered > 0 {
        tracing::info!(actor = %ctx.address, recovered, "alarm deliveries a stopped process left unfinished are due again");
    }
    let now = now_ms();
    let due = gate.with_db(|db| db.due(now)).map_err(|e| e.to_string())?;
    let mut woke = report.woke;
    for timer in due {
        let mut report = TurnReport {
            // The first turn after a wake is the one that paid for it.
            woke: std::mem::take(&mut woke),
            ..Default::default()
        };
        wake(ctx, live, &mut report).await?;
        let still = live
            .gate
            .as_ref()
            .expect("woken")
            .with_db(|db| db.timer(&timer.reason))
            .map_err(|e| e.to_string())?;
        if still.as_ref() != Some(&timer) {
            // Cancelled or moved by an earlier handler of this dispatch.
            woke |= report.woke;
            continue;
        }
        report.incarnation = live.incarnation;
        let outcome = alarm_turn(ctx, live, &timer, &mut report).await;
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
    timer: &DueTimer,
    report: &mut TurnReport,
) -> AlarmOutcome {
    let gate = live.gate.clone().expect("woken");
    let reason = timer.reason.as_str();
    let Some(alarm) = live.alarm else {
        // Timers cannot be scheduled without the export; a database made
        // by an older build of the class may still hold some.
        let _ = gate.write_outside(|db| db.cancel(reason));
        return AlarmOutcome::Dropped {
            attempts: timer.attempt,
            why: "the class does not export weir:actor/alarm".into(),
        };
    };
    let ended = call_turn(
        ctx,
        live,
        alarm,
        (reason.to_string(),),
        report,
        // Taken in the turn's own transaction (a re-arm puts it back),
        // with a delivery row that only a turn that ends well deletes: a
        // commit point inside the turn makes the taking durable, not the
        // delivery.
        |gate| {
            gate.write(|db| db.begin_delivery(timer))
                .map_err(|e| e.to_string())
        },
        |rearm, gate| {
            gate.write(|db| {
                db.delivered(reason)?;
                match rearm {
                    Some(at) => db.schedule(reason, i64::try_from(*at).unwrap_or(i64::MAX)),
                    None => Ok(()),
                }
            })
            .map_err(|e| e.to_string())
        },
    )
    .await;
    let why = match ended {
        CallEnd::Done(rearmed) => return AlarmOutcome::Delivered { rearmed },
        CallEnd::CommitFailed(why) => return AlarmOutcome::CommitFailed(why),
        CallEnd::Failed(why) => why,
    };
    let attempt = timer.attempt + 1;
    let at = retry_at(now_ms(), attempt);
    let recorded = if attempt > ALARM_MAX_RETRIES {
        gate.write_outside(|db| db.drop_delivery(timer))
    } else {
        gate.write_outside(|db| db.redeliver(timer, at, attempt))
    };
    if let Err(e) = recorded {
        live.reset();
        return AlarmOutcome::CommitFailed(e);
    }
    if attempt > ALARM_MAX_RETRIES {
        AlarmOutcome::Dropped {
            attempts: attempt,
            why,
        }
    } else {
        AlarmOutcome::Retrying {
            attempt,
            retry_at_ms: at,
            why,
        }
    }
}

/// How a call of one of the class's exports ended as a turn.
pub enum CallEnd<T> {
    /// It returned `ok`, and the turn committed.
    Done(T),
    /// It failed (an `err`, a trap, its deadline, memory): the turn was
    /// rolled back.
    Failed(String),
    /// The turn could not begin or commit, or its host operations outlived
    /// cleanup: the actor was reset.
    CommitFailed(String),
}

/// Runs one call of an export `func` of a woken actor as a turn: `before`
/// writes in the turn's transaction before the guest runs, `on_ok` after
/// it returned `ok`; the turn commits only if both succeed.
pub async fn call_turn<P, T>(
    ctx: &TurnContext<'_>,
    live: &mut Live,
    func: TypedFunc<P, (Result<T, String>,)>,
    params: P,
    report: &mut TurnReport,
    before: impl FnOnce(&TurnGate) -> Result<(), String>,
    on_ok: impl FnOnce(&T, &TurnGate) -> Result<(), String>,
) -> CallEnd<T>
where
    P: wasmtime::component::ComponentNamedList + wasmtime::component::Lower + Send + Sync + 'static,
    T: wasmtime::component::Lift + Send + Sync + 'static,
{
    let limits = &ctx.code.limits;
    let gate = live.gate.clone().expect("woken");
    // No actor waits on a timer's or a layer's call.
    live.chain.begin(CallChain::default());
    let scope = EventScope::new(limits.max_operations);
    let deadline = Instant::now() + limits.event_limit;
    scope.set_deadline(deadline);
    gate.begin(scope.stop_check());
    if let Err(e) = before(&gate) {
        live.reset();
        return CallEnd::CommitFailed(e);
    }
    let generation = live.generation.as_mut().expect("woken");
    generation.admitted += 1;
    generation.store.data_mut().set_scope(Some(scope.clone()));
    let entered = Instant::now();
    let ending = invocation::run(
        func.call_async(&mut generation.store, params),
        None,
        &scope,
        Timing {
            deadline,
            cancellation_limit: limits.cancellation_limit,
        },
        None,
        &mut NoResponse,
    )
    .await;
    report.wasm = Some(entered.elapsed());
    report.operations = (scope.started(), scope.refused());
    let data = generation.store.data_mut();
    let cut_short = ending.cut_short();
    let result = match ending {
        Ending::Returned((Ok(value),)) => Ok(value),
        Ending::Returned((Err(message),)) => Err((
            ErrorCode::InvalidResponse,
            format!("handler returned an error: {message}"),
        )),
        other => Err(other
            .failure(data)
            .map(|(_, code, detail)| {
                let why = match code {
                    ErrorCode::EventDeadlineExceeded => {
                        "the handler did not return within event_limit_ms".to_string()
                    }
                    _ => detail.unwrap_or_default(),
                };
                (code, why)
            })
            .unwrap_or((
                ErrorCode::InvalidResponse,
                "the handler did not return".into(),
            ))),
    };
    data.set_scope(None);
    if !invocation::settle(&scope, result.is_err(), limits.cleanup_timeout).await {
        // As for a request turn: the actor is reset without touching its
        // database.
        tracing::warn!(actor = %ctx.address, "a turn's host operations outlived cleanup_timeout_ms; resetting the actor");
        live.reset();
        ctx.metrics.generation_abandoned();
        report.fail(ErrorCode::StorageCleanupUnconfirmed, None);
        return CallEnd::CommitFailed("host operations outlived cleanup_timeout_ms".into());
    }
    match result {
        Ok(value) => match on_ok(&value, &gate).and_then(|()| gate.commit()) {
            Ok(()) => {
                retire_if_done(ctx, live);
                CallEnd::Done(value)
            }
            Err(why) => {
                gate.rollback();
                live.reset();
                ctx.metrics.generation_abandoned();
                report.fail(ActorErrorCode::StorageCommitFailed, Some(why.clone()));
                CallEnd::CommitFailed(why)
            }
        },
        Err((code, why)) => {
            gate.rollback();
            if cut_short {
                live.drop_generation();
                ctx.metrics.generation_abandoned();
            }
            report.fail(code, Some(why.clone()));
            CallEnd::Failed(why)
        }
    }
}
