//! A receipt line: the one encoding of every kind of call's receipt.
//!
//! Invariant owned here: every receipt, whatever kind of call it tells of,
//! is one JSON line in the shape of Weir's other log lines
//! (`{"timestamp":…,"level":…,"target":…,"fields":{"message":…, <kind's
//! fields>, <terminal's fields>}}`), byte for byte what serde writes with
//! the kind's and the terminal's fields flattened into `fields` (the
//! receipts' tests hold the two alike). Lines are encoded directly, not
//! through a generic log formatter: they are the one log line every event
//! pays for.

use std::cell::RefCell;
use std::time::{Duration, SystemTime};

use serde::Serialize;

/// Where receipt lines go: one complete JSON line (newline included) per
/// call. Implementations must not block for long: they run on the event's
/// task.
pub trait ReceiptSink: Send + Sync + 'static {
    fn write_line(&self, line: &[u8]);
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
pub(crate) fn splice_fields(buf: &mut Vec<u8>, value: &impl Serialize) -> serde_json::Result<()> {
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
pub(crate) fn put_str(buf: &mut Vec<u8>, s: &str) {
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
pub(crate) fn put_key(buf: &mut Vec<u8>, key: &'static str) {
    debug_assert!(key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    buf.extend_from_slice(b",\"");
    buf.extend_from_slice(key.as_bytes());
    buf.extend_from_slice(b"\":");
}

pub(crate) fn put_number(buf: &mut Vec<u8>, key: &'static str, n: impl itoa::Integer) {
    put_key(buf, key);
    buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

pub(crate) fn put_text(buf: &mut Vec<u8>, key: &'static str, s: &str) {
    put_key(buf, key);
    put_str(buf, s);
}

impl Terminal<'_> {
    /// The terminal's fields, in the order and with the omissions of its
    /// `Serialize` (the receipts' documented shape; a test holds the two
    /// byte for byte alike). Written by hand: every call pays for them.
    pub(crate) fn write_fields(&self, buf: &mut Vec<u8>) {
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
pub(crate) fn encode_line(
    buf: &mut Vec<u8>,
    target: &'static str,
    message: &'static str,
    ended: SystemTime,
    kind: impl FnOnce(&mut Vec<u8>) -> serde_json::Result<()>,
    terminal: &Terminal<'_>,
) -> serde_json::Result<()> {
    // Every kind alike: a call that failed is a warning.
    let warn = terminal.error.is_some();
    let mut fields = Ok(());
    encode_record(buf, warn, target, message, ended, |buf| {
        fields = kind(buf);
        terminal.write_fields(buf);
    });
    fields
}

/// One log line in the shape of Weir's others: `{"timestamp":…,
/// "level":"INFO"|"WARN","target":…,"fields":{"message":…<fields>}}` and
/// a newline; `fields` appends each of its fields led by a comma.
pub(crate) fn encode_record(
    buf: &mut Vec<u8>,
    warn: bool,
    target: &'static str,
    message: &'static str,
    at: SystemTime,
    fields: impl FnOnce(&mut Vec<u8>),
) {
    buf.extend_from_slice(b"{\"timestamp\":\"");
    write_timestamp(buf, at);
    buf.extend_from_slice(if warn {
        b"\",\"level\":\"WARN\",\"target\":"
    } else {
        b"\",\"level\":\"INFO\",\"target\":"
    });
    put_str(buf, target);
    buf.extend_from_slice(b",\"fields\":{\"message\":");
    put_str(buf, message);
    fields(buf);
    buf.extend_from_slice(b"}}\n");
}

/// Encodes one line in this thread's reused buffer and hands it to `sink`.
pub(crate) fn write_line(
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

#[cfg(test)]
mod tests {
    use super::*;

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
