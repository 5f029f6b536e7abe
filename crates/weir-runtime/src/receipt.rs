//! Receipts: every event ends with exactly one.
//!
//! Invariant owned here: a receipt is emitted once, when the last party that
//! can still change it lets go. The transport (which counts bytes out) and
//! the event task (which knows the generation and how the guest ended) each
//! hold the same [`PendingReceipt`]; it is written — one JSON line to the
//! app's [`ReceiptSink`] plus metrics — when the last holder drops, so an
//! event cannot end without one, and never has two. The line is encoded by
//! [`crate::receipt_line`]. The first failure recorded wins: a cancellation
//! stays a cancellation even if the generation is abandoned afterwards.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::error_code::ErrorCode;
use crate::metrics::AppMetrics;
use crate::outcome::Outcome;
pub use crate::receipt_line::{ReceiptSink, Terminal, write_receipt};
use crate::receipt_line::{put_number, put_text, write_line};
use crate::retirement::RetiredBecause;

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
    operations: usize,
    operations_refused: usize,
    retired: Option<RetiredBecause>,
}

/// What every receipt of one version of an app shares: the app's name
/// and the version (encoded once), its metrics and, if receipts are
/// logged, the sink they go to.
pub struct ReceiptBook {
    version: Arc<str>,
    /// `,"app":…,"version":…`, encoded once: every receipt of the book
    /// starts its fields with it.
    head: Box<[u8]>,
    metrics: AppMetrics,
    sink: Option<Arc<dyn ReceiptSink>>,
}

impl ReceiptBook {
    pub fn new(
        app: Arc<str>,
        version: Arc<str>,
        metrics: AppMetrics,
        sink: Option<Arc<dyn ReceiptSink>>,
    ) -> Arc<Self> {
        Arc::new(ReceiptBook {
            head: worker_head(&app, &version),
            version,
            metrics,
            sink,
        })
    }

    /// The version of the app these receipts are of.
    pub fn version(&self) -> &Arc<str> {
        &self.version
    }

    pub fn metrics(&self) -> &AppMetrics {
        &self.metrics
    }

    /// Opens the receipt of an event that arrived at `arrived`.
    pub fn open(self: &Arc<Self>, arrived: Instant) -> Receipt {
        Arc::new(PendingReceipt {
            book: self.clone(),
            arrived,
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            fields: Mutex::new(Fields::default()),
        })
    }
}

/// A receipt being assembled; emitted when the last clone is dropped.
pub struct PendingReceipt {
    book: Arc<ReceiptBook>,
    arrived: Instant,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    fields: Mutex<Fields>,
}

/// A shared handle on the pending receipt of one event.
pub type Receipt = Arc<PendingReceipt>;

impl PendingReceipt {
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

    /// Records that the event's host operations outlived the cleanup budget:
    /// whatever else happened, what they did is unknown to the client.
    pub fn cleanup_unconfirmed(&self) {
        self.with(|f| {
            if f.outcome.is_none() || f.outcome == Some(Outcome::Ok) {
                f.outcome = Some(Outcome::Limit);
            }
            f.error = Some(ErrorCode::StorageCleanupUnconfirmed);
            f.detail = Some(
                "host operations outlived cleanup_timeout_ms; their outcome is unknown".into(),
            );
        });
    }

    /// Records that the guest ended cleanly, unless a failure came first,
    /// and whether its generation was retired after it.
    pub fn succeed(&self, retired: Option<RetiredBecause>) {
        self.with(|f| {
            if f.outcome.is_none() {
                f.outcome = Some(Outcome::Ok);
            }
            f.retired = retired;
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

    /// Records that the guest was entered `at`, on `generation`.
    pub fn entered_wasm(&self, generation: u64, at: Instant) {
        self.with(|f| {
            f.generation = Some(generation);
            f.wasm_entered_at = Some(at);
        });
    }

    /// Records that the response's head, of `status`, went out now, and
    /// says when that was (the session's deadline counts from it).
    pub fn headers_sent(&self, status: u16) -> Instant {
        let now = Instant::now();
        self.with(|f| {
            f.status = status;
            f.headers_at = Some(now);
        });
        now
    }

    /// Records what the guest's call left when it ended: the memory its
    /// instance holds, and the host operations the event started and
    /// refused for capacity.
    pub fn call_ended(&self, memory_bytes: usize, started: usize, refused: usize) {
        self.with(|f| {
            f.memory_bytes = memory_bytes;
            f.operations = started;
            f.operations_refused = refused;
        });
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

/// The log target of worker event receipts.
pub const WORKER_TARGET: &str = "weir::receipt";

/// What only a worker event's receipt has, after the app and the version
/// (which its book encodes once: [`worker_head`]). Its `Serialize` is the
/// documented shape the hand-written [`WorkerFields::write_fields`] is
/// held to.
#[derive(Serialize)]
struct WorkerFields {
    #[serde(skip_serializing_if = "Option::is_none")]
    lane: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    generation: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admission: Option<u64>,
    bytes_in: u64,
    bytes_out: u64,
    memory_bytes: usize,
    /// Why the generation was retired after this event, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    retired: Option<&'static str>,
}

/// The first two fields of a worker's receipt, which its book encodes
/// once.
fn worker_head(app: &str, version: &str) -> Box<[u8]> {
    let mut head = Vec::new();
    put_text(&mut head, "app", app);
    put_text(&mut head, "version", version);
    head.into()
}

impl WorkerFields {
    /// The worker's fields as its `Serialize` writes them (a test holds
    /// the two alike), by hand: the request path's one log line. `head`
    /// is [`worker_head`] of the app and the version.
    fn write_fields(&self, buf: &mut Vec<u8>, head: &[u8]) {
        buf.extend_from_slice(head);
        if let Some(lane) = self.lane {
            put_number(buf, "lane", lane);
        }
        if let Some(generation) = self.generation {
            put_number(buf, "generation", generation);
        }
        if let Some(admission) = self.admission {
            put_number(buf, "admission", admission);
        }
        put_number(buf, "bytes_in", self.bytes_in);
        put_number(buf, "bytes_out", self.bytes_out);
        put_number(buf, "memory_bytes", self.memory_bytes);
        if let Some(retired) = self.retired {
            put_text(buf, "retired", retired);
        }
    }
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
        self.book.metrics.event(outcome, total, wasm);
        let Some(sink) = &self.book.sink else { return };
        let worker = WorkerFields {
            lane: f.lane,
            generation: f.generation,
            admission: f.admission,
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            memory_bytes: f.memory_bytes,
            retired: f.retired.map(RetiredBecause::as_str),
        };
        write_line(
            sink.as_ref(),
            WORKER_TARGET,
            "receipt",
            SystemTime::now(),
            |buf| {
                worker.write_fields(buf, &self.book.head);
                Ok(())
            },
            &Terminal {
                outcome: outcome.as_str(),
                error: f.error.map(|e| e.as_str()),
                status: Some(f.status),
                queued_us: f.admitted_at.map(|a| micros(a - self.arrived)),
                wasm_us: wasm.map(micros),
                total_us: micros(total),
                operations: f.operations,
                operations_refused: f.operations_refused,
                detail: f.detail.as_deref(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::receipt_line::{encode_line, splice_fields};

    /// The line as serde writes it with the kind's and the terminal's
    /// fields flattened into `fields`: the shape receipts always had.
    fn flattened<K: Serialize>(
        target: &'static str,
        message: &'static str,
        ended: SystemTime,
        kind: &K,
        terminal: &Terminal<'_>,
    ) -> Vec<u8> {
        #[derive(Serialize)]
        struct Line<'a, K: Serialize> {
            timestamp: String,
            level: &'static str,
            target: &'static str,
            fields: LineFields<'a, K>,
        }
        #[derive(Serialize)]
        struct LineFields<'a, K: Serialize> {
            message: &'static str,
            #[serde(flatten)]
            kind: &'a K,
            #[serde(flatten)]
            terminal: &'a Terminal<'a>,
        }
        let mut out = serde_json::to_vec(&Line {
            timestamp: humantime::format_rfc3339_micros(ended).to_string(),
            level: if terminal.error.is_some() {
                "WARN"
            } else {
                "INFO"
            },
            target,
            fields: LineFields {
                message,
                kind,
                terminal,
            },
        })
        .unwrap();
        out.push(b'\n');
        out
    }

    fn encoded<K: Serialize>(
        target: &'static str,
        message: &'static str,
        ended: SystemTime,
        kind: &K,
        terminal: &Terminal<'_>,
    ) -> Vec<u8> {
        let mut buf = Vec::new();
        encode_line(
            &mut buf,
            target,
            message,
            ended,
            |buf| splice_fields(buf, kind),
            terminal,
        )
        .unwrap();
        buf
    }

    /// A worker's line, its fields written by hand as the request path
    /// writes them.
    fn encoded_worker(ended: SystemTime, kind: &Worker<'_>, terminal: &Terminal<'_>) -> Vec<u8> {
        let mut buf = Vec::new();
        encode_line(
            &mut buf,
            WORKER_TARGET,
            "receipt",
            ended,
            |buf| {
                kind.fields
                    .write_fields(buf, &worker_head(kind.app, kind.version));
                Ok(())
            },
            terminal,
        )
        .unwrap();
        buf
    }

    #[derive(Serialize)]
    struct Empty {}

    /// A worker's kind as serde would write it: the book's head (app and
    /// version), then the event's own fields.
    #[derive(Serialize)]
    struct Worker<'a> {
        app: &'a str,
        version: &'a str,
        #[serde(flatten)]
        fields: &'a WorkerFields,
    }

    proptest::proptest! {
        /// Whatever the time, the kind's fields and the terminal's, the
        /// line is byte for byte the flattened one (escapes included).
        #[test]
        fn a_receipt_line_is_the_flattened_line(
            secs in 0u64..8_000_000_000,
            nanos in 0u32..1_000_000_000,
            app in ".{0,12}",
            detail in proptest::option::of(".{0,24}"),
            lane in proptest::option::of(0usize..64),
            failed in proptest::bool::ANY,
            operations in 0usize..3,
        ) {
            let ended = std::time::UNIX_EPOCH + Duration::new(secs, nanos);
            let fields = WorkerFields {
                lane,
                generation: lane.map(|l| l as u64 * 7),
                admission: None,
                bytes_in: secs % 977,
                bytes_out: 16,
                memory_bytes: 1 << 20,
                retired: failed.then_some("trapped"),
            };
            let kind = Worker { app: &app, version: "sha256:0f\"\\u{1}", fields: &fields };
            let terminal = Terminal {
                outcome: if failed { "trap" } else { "ok" },
                error: failed.then_some("guest_trap"),
                status: (!failed).then_some(200),
                queued_us: Some(8),
                wasm_us: lane.map(|l| l as u64),
                total_us: 232,
                operations,
                operations_refused: operations / 2,
                detail: detail.as_deref(),
            };
            let expected =
                String::from_utf8(flattened(WORKER_TARGET, "receipt", ended, &kind, &terminal)).unwrap();
            // The worker's fields written by hand, and through serde as a
            // layer's kind is written: both the flattened line.
            proptest::prop_assert_eq!(
                String::from_utf8(encoded_worker(ended, &kind, &terminal)).unwrap(),
                expected.clone()
            );
            proptest::prop_assert_eq!(
                String::from_utf8(encoded(WORKER_TARGET, "receipt", ended, &kind, &terminal)).unwrap(),
                expected
            );
            // A kind with no fields of its own adds none.
            proptest::prop_assert_eq!(
                encoded("weir::x", "turn", ended, &Empty {}, &terminal),
                flattened("weir::x", "turn", ended, &Empty {}, &terminal)
            );
        }
    }
}
