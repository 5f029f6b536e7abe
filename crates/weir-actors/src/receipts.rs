//! Receipts of actor turns: one JSON line per turn, written by the
//! runtime's one receipt encoder with the fields only a turn has (class,
//! name, incarnation, alarm reason and attempt), and the host's counters
//! and metrics.
//!
//! Invariant owned here: every turn that ran — a request turn, each alarm
//! delivery — is counted once and, when receipts are logged, leaves exactly
//! one receipt, whether it committed, failed or was dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use weir_runtime::WeirError;
use weir_runtime::receipt::{Terminal, write_receipt};

use crate::host::{ActorClass, ActorHost, Cell};
use crate::turn::TurnReport;

/// The receipts' `target`, beside the workers' `weir::receipt`.
pub const TURN_TARGET: &str = "weir::actor";

/// Counters of the actor host, for `/actors`.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) turns: AtomicU64,
    pub(crate) failed_turns: AtomicU64,
    pub(crate) wakes: AtomicU64,
    pub(crate) hibernations: AtomicU64,
    pub(crate) overloaded: AtomicU64,
    /// Calls refused for making one actor past `max_actors`, or one more
    /// in a full storage room (`max_actor_storage_bytes`).
    pub(crate) refused_new: AtomicU64,
    pub(crate) alarms: AtomicU64,
    pub(crate) alarms_dropped: AtomicU64,
    pub(crate) dispatches: AtomicU64,
}

/// Which kind of turn a receipt tells of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnKind {
    Request,
    Alarm,
    /// A call of one of the class's exports by a layer above.
    Call,
}

impl TurnKind {
    fn as_str(self) -> &'static str {
        match self {
            TurnKind::Request => "request",
            TurnKind::Alarm => "alarm",
            TurnKind::Call => "call",
        }
    }
}

/// What the caller of a turn knows about it beyond its report.
#[derive(Default)]
pub(crate) struct TurnNotes<'a> {
    /// Overrides `ok`/`failed` (an alarm's `retrying`, `dropped`).
    pub(crate) outcome: Option<&'static str>,
    pub(crate) status: Option<u16>,
    pub(crate) reason: Option<&'a str>,
    pub(crate) attempt: Option<u32>,
    pub(crate) dispatch: Option<u64>,
    pub(crate) queued: Option<Duration>,
}

/// What only a turn's receipt has.
#[derive(Serialize)]
struct TurnFields<'a> {
    /// The app that declares the class, and the version of its code.
    #[serde(skip_serializing_if = "str::is_empty")]
    app: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    version: &'a str,
    class: &'a str,
    name: &'a str,
    turn: &'static str,
    incarnation: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    /// Which delivery of due timers ran this alarm turn (one per wake of
    /// the actor by the dispatcher).
    #[serde(skip_serializing_if = "Option::is_none")]
    dispatch: Option<u64>,
    woke: bool,
}

impl ActorHost {
    /// Counts a turn that ran from `started` to `ended` on `class` (the
    /// code it ran, even if another was installed since) and writes its
    /// receipt.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn receipt(
        &self,
        cell: &Cell,
        class: &ActorClass,
        kind: TurnKind,
        report: &TurnReport,
        notes: TurnNotes<'_>,
        started: Instant,
        ended: Instant,
    ) {
        let metrics = &class.actor_metrics;
        let ok = report.error.is_none();
        if !ok {
            self.counters.failed_turns.fetch_add(1, Ordering::Relaxed);
        }
        if report.refused_new() {
            self.counters.refused_new.fetch_add(1, Ordering::Relaxed);
            metrics.refused_new();
        }
        if report.woke {
            self.counters.wakes.fetch_add(1, Ordering::Relaxed);
            metrics.woke();
        }
        match kind {
            TurnKind::Request => metrics.request_turn(ok, ended - started),
            TurnKind::Alarm => metrics.alarm_turn(ok),
            TurnKind::Call => metrics.call_turn(ok),
        }
        let Some(sink) = &self.sink else { return };
        write_receipt(
            sink.as_ref(),
            TURN_TARGET,
            "turn",
            SystemTime::now() - ended.elapsed(),
            &TurnFields {
                app: &class.app,
                version: &class.version,
                class: &cell.address.class,
                name: &cell.address.name,
                turn: kind.as_str(),
                incarnation: report.incarnation,
                reason: notes.reason,
                attempt: notes.attempt,
                dispatch: notes.dispatch,
                woke: report.woke,
            },
            &Terminal {
                outcome: notes.outcome.unwrap_or(if ok { "ok" } else { "failed" }),
                error: report.error.map(|e| e.as_str()),
                status: notes.status,
                queued_us: notes.queued.map(|q| q.as_micros() as u64),
                wasm_us: report.wasm.map(|w| w.as_micros() as u64),
                total_us: (ended - started).as_micros() as u64,
                operations: report.operations.0,
                operations_refused: report.operations.1,
                detail: report.detail.as_deref(),
            },
        );
    }
}
