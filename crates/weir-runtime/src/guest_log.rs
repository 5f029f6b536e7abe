//! A guest's standard output and error as records in Weir's log.
//!
//! Weir's log is JSON lines that operators and their tools trust: a
//! receipt says how a call ended, a diagnostic what Weir did. Invariant
//! owned here: a guest's bytes reach that log only inside records Weir
//! frames — one line per line the guest wrote, with the app that wrote it
//! (and the actor or process, when it is one) and the stream, the guest's
//! text as an escaped JSON string (bytes that are not UTF-8 replaced). So a guest cannot write a line that passes for
//! one of Weir's (a forged receipt), cut one of Weir's lines in two by
//! leaving its own unfinished, or put control bytes into the log.
//!
//! A line is written when the guest ends it (`\n`), when it reaches
//! [`MAX_GUEST_LINE_BYTES`] (written in pieces, each but the last marked
//! `"cut":true`), or when the event ends with it unfinished. What an event
//! adds to the log this way — the records, framing and escapes included —
//! counts against its output budget (`MAX_GUEST_OUTPUT_BYTES`, set by
//! `crate::guest_output`); the first record that does not fit is replaced
//! by one short record saying the rest of the event's output was dropped,
//! and the rest is dropped.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::receipt_line::{ReceiptSink, encode_record, put_text};

/// The log target of guest output: `WEIR_LOG=info,weir::guest=off`
/// silences it.
pub const GUEST_TARGET: &str = "weir::guest";

/// The longest line a guest writes as one record, in its bytes: a long
/// line is readable in a log viewer, and an unfinished line held for the
/// event's end takes at most this much host memory per stream.
pub const MAX_GUEST_LINE_BYTES: usize = 16 << 10;

/// What a stream keeps of its line buffer between events: a stream that
/// once held a long line does not keep its 16 KiB for every idle instance
/// (a hundred thousand hibernation-free actors would hold gigabytes).
const KEPT_LINE_CAPACITY: usize = 256;

thread_local! {
    /// Each thread encodes records into its own reused buffer.
    static RECORD: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Where one app's guests' output goes: the log, and the app's name,
/// encoded once.
pub struct GuestLog {
    sink: Arc<dyn ReceiptSink>,
    /// `,"app":…`.
    head: Box<[u8]>,
}

impl GuestLog {
    pub fn new(sink: Arc<dyn ReceiptSink>, app: &str) -> GuestLog {
        let mut head = Vec::new();
        put_text(&mut head, "app", app);
        GuestLog {
            sink,
            head: head.into(),
        }
    }

    /// The same log, its records also naming `fields` (an actor's class
    /// and name, a process's pid): one per instance, made when it starts.
    pub fn with_fields(&self, fields: &[(&'static str, &str)]) -> GuestLog {
        let mut head = self.head.to_vec();
        for (key, value) in fields {
            put_text(&mut head, key, value);
        }
        GuestLog {
            sink: self.sink.clone(),
            head: head.into(),
        }
    }

    /// One record of `stream` into `buf`: its `line` (and whether it was
    /// cut), or, without one, the note that the rest of the event's
    /// output was dropped.
    fn encode(&self, buf: &mut Vec<u8>, stream: &'static str, line: Option<(&[u8], bool)>) {
        buf.clear();
        let message = match line {
            Some(_) => "guest output",
            None => "guest output past the event's budget dropped",
        };
        encode_record(
            buf,
            line.is_none(),
            GUEST_TARGET,
            message,
            SystemTime::now(),
            |buf| {
                buf.extend_from_slice(&self.head);
                put_text(buf, "stream", stream);
                if let Some((line, cut)) = line {
                    put_text(buf, "line", &String::from_utf8_lossy(line));
                    if cut {
                        buf.extend_from_slice(b",\"cut\":true");
                    }
                }
            },
        );
    }
}

/// One stream of one instance into the log: its unfinished line, and the
/// event's budget it shares with its sibling stream.
pub struct LogStream {
    log: Arc<GuestLog>,
    stream: &'static str,
    /// Bytes the event may still add to the log.
    left: Arc<AtomicU64>,
    /// Set when a record did not fit.
    exceeded: Arc<AtomicBool>,
    /// Set by a write, cleared at the event's end: an event whose guest
    /// wrote nothing ends without taking the lock.
    wrote: AtomicBool,
    /// The guest's bytes since its last line ended.
    unfinished: Mutex<Vec<u8>>,
}

impl LogStream {
    /// `stream` of an instance into `log`, within the event's budget:
    /// `left` bytes, and `exceeded` once a record did not fit.
    pub(crate) fn new(
        log: Arc<GuestLog>,
        stream: &'static str,
        left: Arc<AtomicU64>,
        exceeded: Arc<AtomicBool>,
    ) -> LogStream {
        LogStream {
            log,
            stream,
            left,
            exceeded,
            wrote: AtomicBool::new(false),
            unfinished: Mutex::default(),
        }
    }

    /// Takes what the guest wrote: every line it ends, and every
    /// [`MAX_GUEST_LINE_BYTES`] of a line it does not, is written.
    pub(crate) fn write(&self, mut bytes: &[u8]) {
        self.wrote.store(true, Ordering::Relaxed);
        let mut line = self.unfinished.lock().unwrap_or_else(|p| p.into_inner());
        while !bytes.is_empty() {
            let room = MAX_GUEST_LINE_BYTES - line.len();
            let end = bytes.iter().take(room).position(|&b| b == b'\n');
            match end {
                Some(at) => {
                    line.extend_from_slice(&bytes[..at]);
                    bytes = &bytes[at + 1..];
                    self.emit(&mut line, false);
                }
                None if bytes.len() > room => {
                    line.extend_from_slice(&bytes[..room]);
                    bytes = &bytes[room..];
                    // Cut here, unless the line ends right after.
                    let ends = bytes.first() == Some(&b'\n');
                    if ends {
                        bytes = &bytes[1..];
                    }
                    self.emit(&mut line, !ends);
                }
                None => {
                    line.extend_from_slice(bytes);
                    bytes = &[];
                }
            }
        }
    }

    /// The event ended: a line the guest left unfinished is written, and
    /// the buffer shrinks back.
    pub(crate) fn end_event(&self) {
        if !self.wrote.swap(false, Ordering::Relaxed) {
            return;
        }
        let mut line = self.unfinished.lock().unwrap_or_else(|p| p.into_inner());
        if !line.is_empty() {
            self.emit(&mut line, false);
        }
        line.shrink_to(KEPT_LINE_CAPACITY);
    }

    /// Writes `line` as one record and empties it, if the budget has room
    /// for the record; else the first time, the note that the rest is
    /// dropped.
    fn emit(&self, line: &mut Vec<u8>, cut: bool) {
        RECORD.with(|record| {
            let mut record = record.borrow_mut();
            self.log.encode(&mut record, self.stream, Some((line, cut)));
            let size = record.len() as u64;
            let fits = self
                .left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                    left.checked_sub(size)
                })
                .is_ok();
            if fits {
                self.log.sink.write_line(&record);
            } else if !self.exceeded.swap(true, Ordering::Relaxed) {
                self.log.encode(&mut record, self.stream, None);
                self.log.sink.write_line(&record);
            }
        });
        line.clear();
    }
}

impl Drop for LogStream {
    /// An instance dropped mid-line (a trap, a retirement) still leaves
    /// its last line in the log: often the reason it ended.
    fn drop(&mut self) {
        self.end_event();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Collected(Mutex<Vec<u8>>);

    impl ReceiptSink for Collected {
        fn write_line(&self, line: &[u8]) {
            self.0.lock().unwrap().extend_from_slice(line);
        }
    }

    fn stream(budget: u64) -> (LogStream, Arc<Collected>, Arc<AtomicBool>) {
        let sink = Arc::new(Collected::default());
        let exceeded = Arc::new(AtomicBool::new(false));
        let log = Arc::new(GuestLog::new(sink.clone(), "shop"));
        let left = Arc::new(AtomicU64::new(budget));
        let stream = LogStream::new(log, "stderr", left, exceeded.clone());
        (stream, sink, exceeded)
    }

    fn records(sink: &Collected) -> Vec<serde_json::Value> {
        let bytes = sink.0.lock().unwrap().clone();
        bytes
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).expect("every line is JSON"))
            .collect()
    }

    #[test]
    fn a_forged_line_and_an_unfinished_one_stay_inside_their_records() {
        let (stream, sink, _) = stream(1 << 20);
        let forged = "{\"timestamp\":\"2026-12-04T00:00:00Z\",\"level\":\"INFO\",\
                      \"target\":\"weir::receipt\",\"fields\":{\"outcome\":\"ok\"}}";
        stream.write(format!("{forged}\nhalf a li").as_bytes());
        stream.write(b"ne\n\x1b[31m\x00\xff\r");
        stream.end_event();
        let records = records(&sink);
        let lines: Vec<&str> = records
            .iter()
            .map(|r| r["fields"]["line"].as_str().unwrap())
            .collect();
        assert_eq!(lines, [forged, "half a line", "\x1b[31m\0\u{fffd}\r"]);
        let keyed = GuestLog::new(sink.clone(), "shop")
            .with_fields(&[("class", "cart"), ("name", "\"x\"")]);
        let keyed = LogStream::new(
            Arc::new(keyed),
            "stdout",
            Arc::new(AtomicU64::new(1 << 20)),
            Arc::default(),
        );
        keyed.write(b"hi\n");
        let records = self::records(&sink);
        let last = &records.last().unwrap()["fields"];
        assert_eq!(
            (&last["class"], &last["name"], &last["line"]),
            (&"cart".into(), &"\"x\"".into(), &"hi".into())
        );
        for r in &records[..3] {
            assert_eq!(r["target"], GUEST_TARGET);
            assert_eq!(r["fields"]["app"], "shop");
            assert_eq!(r["fields"]["stream"], "stderr");
        }
    }

    #[test]
    fn an_idle_stream_keeps_no_long_line_buffer() {
        let (stream, _, _) = stream(1 << 20);
        stream.write(&vec![b'z'; MAX_GUEST_LINE_BYTES - 1]);
        stream.end_event();
        let kept = stream.unfinished.lock().unwrap().capacity();
        assert!(kept <= KEPT_LINE_CAPACITY, "{kept}");
    }

    #[test]
    fn a_long_line_is_written_in_cut_pieces() {
        let (stream, sink, _) = stream(1 << 20);
        let long = vec![b'x'; 2 * MAX_GUEST_LINE_BYTES + 5];
        stream.write(&long);
        stream.write(b"\n");
        // A line exactly as long as the bound is one record, not cut.
        stream.write(&vec![b'y'; MAX_GUEST_LINE_BYTES]);
        stream.write(b"\n");
        let records = records(&sink);
        let pieces: Vec<(usize, bool)> = records
            .iter()
            .map(|r| {
                let f = &r["fields"];
                (f["line"].as_str().unwrap().len(), f["cut"] == true)
            })
            .collect();
        assert_eq!(
            pieces,
            [
                (MAX_GUEST_LINE_BYTES, true),
                (MAX_GUEST_LINE_BYTES, true),
                (5, false),
                (MAX_GUEST_LINE_BYTES, false)
            ]
        );
    }

    #[test]
    fn an_event_adds_at_most_its_budget_to_the_log_and_says_what_it_dropped() {
        let (stream, sink, exceeded) = stream(4096);
        for _ in 0..1000 {
            stream.write(b"\0\0\0\0\0\0\0\0\n");
        }
        let written = sink.0.lock().unwrap().len();
        let records = records(&sink);
        let last = records.last().unwrap();
        assert_eq!(last["level"], "WARN");
        assert_eq!(
            last["fields"]["message"],
            "guest output past the event's budget dropped"
        );
        let kept: usize = records[..records.len() - 1]
            .iter()
            .map(|r| serde_json::to_vec(r).unwrap().len() + 1)
            .sum();
        assert!(kept <= 4096, "{kept}");
        assert!(written - kept < 300, "one short note: {}", written - kept);
        assert!(exceeded.load(Ordering::Relaxed));
    }
}
