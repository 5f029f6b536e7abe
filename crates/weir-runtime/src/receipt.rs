//! Receipts: every event ends with exactly one.
//!
//! Invariant owned here: a receipt is emitted once, when the last party that
//! can still change it lets go. The transport (which counts bytes out) and
//! the event task (which knows the generation and how the guest ended) each
//! hold the same [`PendingReceipt`]; it is written — log record plus
//! metrics — when the last holder drops, so an event cannot end without
//! one, and never has two. The first failure recorded wins: a cancellation
//! stays a cancellation even if the generation is abandoned afterwards.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error_code::ErrorCode;
use crate::metrics::AppMetrics;

/// How an event ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The guest answered and the response was delivered in full.
    Ok,
    /// The guest trapped.
    Trap,
    /// An event or session deadline passed.
    Deadline,
    /// The client left before the response was delivered.
    Cancelled,
    /// No lane or queue place was available.
    Capacity,
    /// A transport or memory limit was hit.
    Limit,
}

impl Outcome {
    pub const ALL: &'static [Outcome] = &[
        Outcome::Ok,
        Outcome::Trap,
        Outcome::Deadline,
        Outcome::Cancelled,
        Outcome::Capacity,
        Outcome::Limit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Trap => "trap",
            Outcome::Deadline => "deadline",
            Outcome::Cancelled => "cancelled",
            Outcome::Capacity => "capacity",
            Outcome::Limit => "limit",
        }
    }
}

/// The fields of a receipt that are set as the event goes.
#[derive(Debug, Default)]
struct Fields {
    outcome: Option<Outcome>,
    error: Option<ErrorCode>,
    status: u16,
    lane: Option<usize>,
    generation: Option<u64>,
    admission: Option<u64>,
    memory_bytes: usize,
    admitted_at: Option<Instant>,
    wasm_entered_at: Option<Instant>,
    headers_at: Option<Instant>,
    detail: Option<String>,
}

/// A receipt being assembled; emitted when the last clone is dropped.
pub struct PendingReceipt {
    app: Arc<str>,
    metrics: AppMetrics,
    arrived: Instant,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    fields: Mutex<Fields>,
}

/// A shared handle on the pending receipt of one event.
pub type Receipt = Arc<PendingReceipt>;

impl PendingReceipt {
    pub fn new(app: Arc<str>, metrics: AppMetrics, arrived: Instant) -> Receipt {
        Arc::new(PendingReceipt {
            app,
            metrics,
            arrived,
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            fields: Mutex::new(Fields::default()),
        })
    }

    fn with(&self, f: impl FnOnce(&mut Fields)) {
        let mut fields = self.fields.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut fields);
    }

    /// Records a failure; the first one recorded is the one reported.
    pub fn fail(&self, outcome: Outcome, error: Option<ErrorCode>, detail: Option<String>) {
        self.with(|f| {
            if f.outcome.is_none() || f.outcome == Some(Outcome::Ok) {
                f.outcome = Some(outcome);
                f.error = error;
                f.detail = detail;
            }
        });
    }

    /// Records that the guest ended cleanly, unless a failure came first.
    pub fn succeed(&self) {
        self.with(|f| {
            if f.outcome.is_none() {
                f.outcome = Some(Outcome::Ok);
            }
        });
    }

    pub fn status(&self, status: u16) {
        self.with(|f| f.status = status);
    }

    pub fn admitted(&self, lane: usize, admission: u64) {
        self.with(|f| {
            f.lane = Some(lane);
            f.admission = Some(admission);
            f.admitted_at = Some(Instant::now());
        });
    }

    pub fn entered_wasm(&self, generation: u64) {
        self.with(|f| {
            f.generation = Some(generation);
            f.wasm_entered_at = Some(Instant::now());
        });
    }

    pub fn headers_sent(&self) {
        self.with(|f| f.headers_at = Some(Instant::now()));
    }

    pub fn memory(&self, bytes: usize) {
        self.with(|f| f.memory_bytes = bytes);
    }

    pub fn add_bytes_in(&self, n: u64) {
        self.bytes_in.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_bytes_out(&self, n: u64) {
        self.bytes_out.fetch_add(n, Ordering::Relaxed);
    }

    /// The outcome recorded so far, if any.
    pub fn outcome(&self) -> Option<Outcome> {
        self.fields
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .outcome
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

impl Drop for PendingReceipt {
    fn drop(&mut self) {
        let now = Instant::now();
        let f = self.fields.get_mut().unwrap_or_else(|p| p.into_inner());
        // An event that got no verdict was abandoned by its client before
        // anything else could say what happened.
        let outcome = f.outcome.unwrap_or(Outcome::Cancelled);
        let total = now - self.arrived;
        let wasm = match (f.wasm_entered_at, f.headers_at) {
            (Some(entered), Some(headers)) => Some(headers - entered),
            _ => None,
        };
        self.metrics
            .event(outcome, total.as_secs_f64(), wasm.map(|w| w.as_secs_f64()));
        let queued = f.admitted_at.map(|a| micros(a - self.arrived));
        tracing::info!(
            target: "weir::receipt",
            app = %self.app,
            lane = f.lane,
            generation = f.generation,
            admission = f.admission,
            outcome = outcome.as_str(),
            error = f.error.map(|e| e.as_str()),
            status = f.status,
            bytes_in = self.bytes_in.load(Ordering::Relaxed),
            bytes_out = self.bytes_out.load(Ordering::Relaxed),
            memory_bytes = f.memory_bytes,
            queued_us = queued,
            wasm_us = wasm.map(micros),
            total_us = micros(total),
            detail = f.detail.as_deref(),
            "receipt"
        );
    }
}
