//! Receipts: every event ends with exactly one.
//!
//! Invariant owned here: a receipt is emitted once, when the last party that
//! can still change it lets go. The transport (which counts bytes out) and
//! the event task (which knows the generation and how the guest ended) each
//! hold the same [`PendingReceipt`]; it is written — one JSON line to the
//! app's [`ReceiptSink`] plus metrics — when the last holder drops, so an
//! event cannot end without one, and never has two. Receipts are encoded
//! directly (not through a generic log formatter): they are the one log
//! line every event pays for. The first failure recorded wins: a cancellation
//! stays a cancellation even if the generation is abandoned afterwards.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::error_code::ErrorCode;
use crate::metrics::AppMetrics;
use crate::outcome::Outcome;
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

/// Where receipt lines go: one complete JSON line (newline included) per
/// call. Implementations must not block for long: they run on the event's
/// task.
pub trait ReceiptSink: Send + Sync + 'static {
    fn write_line(&self, line: &[u8]);
}

/// What every receipt of one version of an app shares: the app's name,
/// the version, its metrics and, if receipts are logged, the sink they go
/// to.
pub struct ReceiptBook {
    app: Arc<str>,
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
            app,
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

    /// Records that the guest was entered `at`, on `generation`.
    pub fn entered_wasm(&self, generation: u64, at: Instant) {
        self.with(|f| {
            f.generation = Some(generation);
            f.wasm_entered_at = Some(at);
        });
    }

    /// Records that the response's head went out now, and says when that
    /// was (the session's deadline counts from it).
    pub fn headers_sent(&self) -> Instant {
        let now = Instant::now();
        self.with(|f| f.headers_at = Some(now));
        now
    }

    /// Host operations the event started, and refused for capacity.
    pub fn operations(&self, started: usize, refused: usize) {
        self.with(|f| {
            f.operations = started;
            f.operations_refused = refused;
        });
    }

    /// Records that the event's generation was retired after it, and why.
    pub fn retired(&self, why: RetiredBecause) {
        self.with(|f| f.retired = Some(why));
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

/// The fields every receipt has, whatever kind of call it tells of.
#[derive(Serialize)]
pub struct Terminal<'a> {
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Waiting before the call began (for a lane, for a keyed instance).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wasm_us: Option<u64>,
    pub total_us: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub operations: usize,
    #[serde(skip_serializing_if = "is_zero")]
    pub operations_refused: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<&'a str>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

thread_local! {
    /// Each thread encodes receipts into its own reused buffer.
    static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// The second of the last timestamp this thread wrote, and its text
    /// up to the fraction (`2026-12-02T16:03:19`): every receipt has a
    /// timestamp, and formatting a calendar date is most of its cost.
    static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// `at` in RFC 3339 with microseconds, in UTC, as `humantime` writes it
/// (`2026-12-02T16:03:19.167153Z`); the date and time of day are formatted
/// once per second per thread.
fn write_timestamp(buf: &mut Vec<u8>, at: SystemTime) {
    let Ok(since) = at.duration_since(std::time::UNIX_EPOCH) else {
        buf.extend_from_slice(humantime::format_rfc3339_micros(at).to_string().as_bytes());
        return;
    };
    SECOND.with(|second| {
        let mut second = second.borrow_mut();
        if second.0 != since.as_secs() {
            let whole = std::time::UNIX_EPOCH + Duration::from_secs(since.as_secs());
            let text = humantime::format_rfc3339_seconds(whole).to_string();
            *second = (since.as_secs(), text.trim_end_matches('Z').to_string());
        }
        buf.extend_from_slice(second.1.as_bytes());
    });
    let micros = since.subsec_micros();
    buf.push(b'.');
    let mut digits = [b'0'; 6];
    let mut rest = micros;
    for d in digits.iter_mut().rev() {
        *d = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    buf.extend_from_slice(&digits);
    buf.push(b'Z');
}

/// Appends the fields of `value` (a struct, serialized as a JSON object)
/// to the object being written in `buf`, as if they were its own: the
/// object's braces are dropped and a comma leads. A value with no fields
/// adds nothing; a value that is not an object is refused, as serde's
/// `flatten` refuses it.
fn splice_fields(buf: &mut Vec<u8>, value: &impl Serialize) -> serde_json::Result<()> {
    let start = buf.len();
    serde_json::to_writer(&mut *buf, value)?;
    if buf.get(start) != Some(&b'{') || buf.last() != Some(&b'}') {
        buf.truncate(start);
        return Err(serde::ser::Error::custom("receipt fields must be a struct"));
    }
    if buf.len() - start <= 2 {
        buf.truncate(start);
    } else {
        buf[start] = b',';
        buf.pop();
    }
    Ok(())
}

/// A JSON string, escaped as serde_json escapes it. Most strings in a
/// receipt (names, codes, outcomes) need no escape, and are copied as
/// they are after one scan.
fn put_str(buf: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        buf.reserve(s.len() + 2);
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
    } else {
        // Writing a str into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *buf, s);
    }
}

/// `,"key":` — the receipt's keys are its own identifiers, never escaped.
fn put_key(buf: &mut Vec<u8>, key: &'static str) {
    debug_assert!(key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    buf.extend_from_slice(b",\"");
    buf.extend_from_slice(key.as_bytes());
    buf.extend_from_slice(b"\":");
}

fn put_number(buf: &mut Vec<u8>, key: &'static str, n: impl itoa::Integer) {
    put_key(buf, key);
    buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn put_text(buf: &mut Vec<u8>, key: &'static str, s: &str) {
    put_key(buf, key);
    put_str(buf, s);
}

impl Terminal<'_> {
    /// The terminal's fields, in the order and with the omissions of its
    /// `Serialize` (the receipts' documented shape; a test holds the two
    /// byte for byte alike). Written by hand: every call pays for them.
    fn write_fields(&self, buf: &mut Vec<u8>) {
        put_text(buf, "outcome", self.outcome);
        if let Some(error) = self.error {
            put_text(buf, "error", error);
        }
        if let Some(status) = self.status {
            put_number(buf, "status", status);
        }
        if let Some(queued) = self.queued_us {
            put_number(buf, "queued_us", queued);
        }
        if let Some(wasm) = self.wasm_us {
            put_number(buf, "wasm_us", wasm);
        }
        put_number(buf, "total_us", self.total_us);
        if self.operations != 0 {
            put_number(buf, "operations", self.operations);
        }
        if self.operations_refused != 0 {
            put_number(buf, "operations_refused", self.operations_refused);
        }
        if let Some(detail) = self.detail {
            put_text(buf, "detail", detail);
        }
    }
}

/// One receipt line, in the shape of Weir's other log lines:
/// `{"timestamp":…,"level":…,"target":…,"fields":{"message":…, <kind's
/// fields>, <terminal's fields>}}`. `kind` appends the kind's fields, each
/// led by a comma.
fn encode_line(
    buf: &mut Vec<u8>,
    target: &'static str,
    message: &'static str,
    ended: SystemTime,
    kind: impl FnOnce(&mut Vec<u8>) -> serde_json::Result<()>,
    terminal: &Terminal<'_>,
) -> serde_json::Result<()> {
    buf.extend_from_slice(b"{\"timestamp\":\"");
    write_timestamp(buf, ended);
    // Every kind alike: a call that failed is a warning.
    buf.extend_from_slice(if terminal.error.is_some() {
        b"\",\"level\":\"WARN\",\"target\":"
    } else {
        b"\",\"level\":\"INFO\",\"target\":"
    });
    put_str(buf, target);
    buf.extend_from_slice(b",\"fields\":{\"message\":");
    put_str(buf, message);
    kind(buf)?;
    terminal.write_fields(buf);
    buf.extend_from_slice(b"}}\n");
    Ok(())
}

/// Encodes one line in this thread's reused buffer and hands it to `sink`.
fn write_line(
    sink: &dyn ReceiptSink,
    target: &'static str,
    message: &'static str,
    ended: SystemTime,
    kind: impl FnOnce(&mut Vec<u8>) -> serde_json::Result<()>,
    terminal: &Terminal<'_>,
) {
    LINE.with(|buf| {
        let mut buf = buf.borrow_mut();
        buf.clear();
        if encode_line(&mut buf, target, message, ended, kind, terminal).is_ok() {
            sink.write_line(&buf);
        }
    });
}

/// Writes one receipt to `sink`: the one encoder of every kind of call.
/// `kind` holds what only that kind has (an app's lane and generation, or
/// what a layer above adds: see [`crate::extension`]), a struct whose
/// fields follow the message; `ended` is when the call ended.
pub fn write_receipt<K: Serialize>(
    sink: &dyn ReceiptSink,
    target: &'static str,
    message: &'static str,
    ended: SystemTime,
    kind: &K,
    terminal: &Terminal<'_>,
) {
    write_line(
        sink,
        target,
        message,
        ended,
        |buf| splice_fields(buf, kind),
        terminal,
    );
}

/// The log target of worker event receipts.
pub const WORKER_TARGET: &str = "weir::receipt";

/// What only a worker event's receipt has.
#[derive(Serialize)]
struct WorkerFields<'a> {
    app: &'a str,
    version: &'a str,
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

impl WorkerFields<'_> {
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
        self.book
            .metrics
            .event(outcome, total.as_secs_f64(), wasm.map(|w| w.as_secs_f64()));
        let Some(sink) = &self.book.sink else { return };
        let worker = WorkerFields {
            app: &self.book.app,
            version: &self.book.version,
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
    fn encoded_worker(
        ended: SystemTime,
        kind: &WorkerFields<'_>,
        terminal: &Terminal<'_>,
    ) -> Vec<u8> {
        let mut buf = Vec::new();
        encode_line(
            &mut buf,
            WORKER_TARGET,
            "receipt",
            ended,
            |buf| {
                kind.write_fields(buf, &worker_head(kind.app, kind.version));
                Ok(())
            },
            terminal,
        )
        .unwrap();
        buf
    }

    #[derive(Serialize)]
    struct Empty {}

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
            let kind = WorkerFields {
                app: &app,
                version: "sha256:0f\"\\u{1}",
                lane,
                generation: lane.map(|l| l as u64 * 7),
                admission: None,
                bytes_in: secs % 977,
                bytes_out: 16,
                memory_bytes: 1 << 20,
                retired: failed.then_some("trapped"),
            };
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

    proptest::proptest! {
        /// Any string at all is written as serde_json writes it: control
        /// characters, quotes and backslashes escaped, the rest as is.
        #[test]
        fn a_string_is_escaped_as_serde_escapes_it(s in proptest::prelude::any::<String>()) {
            let mut buf = Vec::new();
            put_str(&mut buf, &s);
            proptest::prop_assert_eq!(buf, serde_json::to_vec(&s).unwrap());
        }
    }

    #[test]
    fn fields_that_are_not_an_object_write_no_line() {
        let terminal = Terminal {
            outcome: "ok",
            error: None,
            status: Some(200),
            queued_us: None,
            wasm_us: None,
            total_us: 1,
            operations: 0,
            operations_refused: 0,
            detail: None,
        };
        let mut buf = Vec::new();
        assert!(
            encode_line(
                &mut buf,
                "weir::x",
                "turn",
                SystemTime::now(),
                |buf| splice_fields(buf, &7u32),
                &terminal
            )
            .is_err()
        );
    }

    #[test]
    fn timestamps_across_a_second_keep_humantimes_text() {
        let base = std::time::UNIX_EPOCH + Duration::from_secs(1_796_227_199);
        for offset_us in [0u64, 1, 999_999, 1_000_000, 1_000_001, 86_400_000_000, 5] {
            let at = base + Duration::from_micros(offset_us);
            let mut buf = Vec::new();
            write_timestamp(&mut buf, at);
            assert_eq!(
                String::from_utf8(buf).unwrap(),
                humantime::format_rfc3339_micros(at).to_string()
            );
        }
    }
}
