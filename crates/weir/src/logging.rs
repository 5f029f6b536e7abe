//! Log output: receipts and diagnostics as JSON lines on stderr, batched.
//!
//! Invariant owned here: writing a log line costs no system call on the
//! request path, and lines come out in the order they were appended.
//! Lines are appended to one buffer. A buffer that passes
//! [`FLUSH_BYTES`] is handed to the flusher thread, which also takes
//! whatever has gathered every [`FLUSH_INTERVAL`]; `weir` writes the rest
//! when it exits normally. Only a writer that finds the flusher still
//! [`MAX_PENDING_BYTES`] behind (stderr slower than the lines come) waits
//! for it: memory stays bounded. A `SIGKILL` can lose at most the last
//! interval's lines — logs, never data.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use weir_runtime::receipt::ReceiptSink;

/// A buffer this large is handed to the flusher at once: large enough to
/// batch a few hundred receipts into one write, small enough to stay in
/// cache.
pub const FLUSH_BYTES: usize = 64 * 1024;

/// Lines a writer may gather while the flusher is still writing the last
/// full buffer, before it waits for it: past this, stderr is slower than
/// the lines come, and waiting is the only bound on memory.
pub const MAX_PENDING_BYTES: usize = 16 * FLUSH_BYTES;

/// Longest a line waits in the buffer: short enough that someone tailing
/// the log sees events as they happen.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(50);

#[derive(Default)]
struct Buffers {
    /// Where lines are appended.
    filling: Vec<u8>,
    /// A full buffer handed over, not yet taken by the flusher.
    full: Option<Vec<u8>>,
    /// A written buffer given back, to fill next (its capacity reused).
    spare: Vec<u8>,
}

/// Where batches go: stderr, or a test's collector.
type Sink = Box<dyn Fn(&[u8]) + Send + Sync>;

struct Output {
    sink: Sink,
    buffers: Mutex<Buffers>,
    /// Wakes the flusher when a full buffer is handed over.
    handed_over: Condvar,
    /// Wakes writers waiting for the flusher to take the full buffer.
    taken: Condvar,
    /// Held while a batch is taken and written: batches come out in
    /// the order they were taken, which is the order of their lines.
    writing: Mutex<()>,
}

#[derive(Clone)]
struct Batched(Arc<Output>);

impl Default for Batched {
    fn default() -> Self {
        Batched::new(|batch| {
            let _ = std::io::stderr().lock().write_all(batch);
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Batched {
    fn new(sink: impl Fn(&[u8]) + Send + Sync + 'static) -> Self {
        Batched(Arc::new(Output {
            sink: Box::new(sink),
            buffers: Mutex::default(),
            handed_over: Condvar::new(),
            taken: Condvar::new(),
            writing: Mutex::new(()),
        }))
    }

    fn append(&self, data: &[u8]) {
        let out = &*self.0;
        let mut b = lock(&out.buffers);
        b.filling.extend_from_slice(data);
        if b.filling.len() < FLUSH_BYTES {
            return;
        }
        while b.full.is_some() {
            if b.filling.len() < MAX_PENDING_BYTES {
                // The flusher is writing the last one; keep gathering.
                return;
            }
            b = out.taken.wait(b).unwrap_or_else(|p| p.into_inner());
        }
        let next = std::mem::take(&mut b.spare);
        let full = std::mem::replace(&mut b.filling, next);
        b.full = Some(full);
        out.handed_over.notify_one();
    }

    /// Takes the oldest lines not yet written: the handed-over buffer if
    /// there is one, else whatever has gathered (if `gathered`).
    fn take(b: &mut Buffers, gathered: bool) -> Option<Vec<u8>> {
        if let Some(full) = b.full.take() {
            return Some(full);
        }
        if gathered && !b.filling.is_empty() {
            let next = std::mem::take(&mut b.spare);
            return Some(std::mem::replace(&mut b.filling, next));
        }
        None
    }

    /// Writes out what is buffered, oldest first: a full buffer when one is
    /// handed over, else (if `gathered`) what has gathered.
    fn write_out(&self, gathered: bool) {
        let out = &*self.0;
        let _writing = lock(&out.writing);
        // At most the handed-over buffer and then what has gathered: under
        // a steady load there is always more, and it waits for the next
        // round.
        for _ in 0..2 {
            let batch = {
                let mut b = lock(&out.buffers);
                let batch = Self::take(&mut b, gathered);
                out.taken.notify_all();
                batch
            };
            let Some(mut batch) = batch else { return };
            (out.sink)(&batch);
            batch.clear();
            let mut b = lock(&out.buffers);
            // A buffer that grew while stderr was slow is let go, not kept.
            if batch.capacity() <= 2 * FLUSH_BYTES && b.spare.capacity() < batch.capacity() {
                b.spare = batch;
            }
            if !gathered {
                return;
            }
        }
    }

    /// The flusher thread: writes each full buffer as it is handed over,
    /// and what has gathered every [`FLUSH_INTERVAL`].
    fn flusher(self) {
        loop {
            let handed = {
                let b = lock(&self.0.buffers);
                let (b, waited) = self
                    .0
                    .handed_over
                    .wait_timeout_while(b, FLUSH_INTERVAL, |b| b.full.is_none())
                    .unwrap_or_else(|p| p.into_inner());
                drop(b);
                !waited.timed_out()
            };
            self.write_out(!handed);
        }
    }
}

/// One log line's writer.
struct Line<'a>(&'a Batched);

impl Write for Line<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.append(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Batched {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line(self)
    }
}

impl ReceiptSink for Batched {
    fn write_line(&self, line: &[u8]) {
        self.append(line);
    }
}

static OUTPUT: OnceLock<Batched> = OnceLock::new();

/// Where receipts go: the same batched stderr as every other log line, or
/// nowhere when `WEIR_LOG` filters out `weir::receipt` at `info`.
pub fn receipt_sink() -> Option<Arc<dyn ReceiptSink>> {
    tracing::enabled!(target: "weir::receipt", tracing::Level::INFO).then(batched)
}

/// The batched stderr as a line sink.
fn batched() -> Arc<dyn ReceiptSink> {
    Arc::new(OUTPUT.get_or_init(Batched::default).clone())
}

/// Where guests' stdout and stderr go: records in the same batched
/// stderr, or nowhere when `WEIR_LOG` filters out `weir::guest` at `info`.
pub fn guest_sink() -> Option<Arc<dyn ReceiptSink>> {
    tracing::enabled!(target: "weir::guest", tracing::Level::INFO).then(batched)
}

/// Installs the JSON subscriber; `WEIR_LOG` takes a `tracing` filter.
pub fn init() {
    let output = OUTPUT.get_or_init(Batched::default).clone();
    let filter = EnvFilter::try_from_env("WEIR_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(output.clone())
        .with_current_span(false)
        .init();
    let _ = std::thread::Builder::new()
        .name("weir-log".into())
        .spawn(move || output.flusher());
}

/// Writes out whatever is buffered; called before `weir` exits.
pub fn flush() {
    if let Some(output) = OUTPUT.get() {
        output.write_out(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collector() -> (Batched, Arc<Mutex<Vec<u8>>>) {
        let written = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = written.clone();
        let output = Batched::new(move |batch| lock(&sink).extend_from_slice(batch));
        (output, written)
    }

    fn numbered(i: usize) -> Vec<u8> {
        format!("{i:08}\n").into_bytes()
    }

    fn assert_in_order(written: &Mutex<Vec<u8>>, lines: usize) {
        let written = lock(written).clone();
        let expected: Vec<u8> = (0..lines).flat_map(numbered).collect();
        assert!(written == expected, "every line once, in order");
    }

    #[test]
    fn a_handed_over_buffer_is_written_before_what_gathered_after_it() {
        let (output, written) = collector();
        let mut i = 0;
        while lock(&output.0.buffers).full.is_none() {
            output.append(&numbered(i));
            i += 1;
        }
        output.append(&numbered(i));
        output.append(&numbered(i + 1));
        // What the flusher does when its interval passes.
        output.write_out(true);
        assert_in_order(&written, i + 2);
        assert!(lock(&output.0.buffers).filling.is_empty());
    }

    #[test]
    fn a_writer_past_the_pending_bound_waits_for_the_flusher() {
        let (output, written) = collector();
        let lines = 2 * MAX_PENDING_BYTES / numbered(0).len();
        let writer = {
            let output = output.clone();
            std::thread::spawn(move || {
                for i in 0..lines {
                    output.append(&numbered(i));
                }
            })
        };
        // With no flusher running, the writer gathers up to the bound and
        // then waits: memory does not grow past it.
        while lock(&output.0.buffers).filling.len() < MAX_PENDING_BYTES {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(!writer.is_finished(), "the writer waits for the flusher");
        assert!(lock(&output.0.buffers).filling.len() < MAX_PENDING_BYTES + numbered(0).len());
        // The flusher takes the full buffer; the writer goes on.
        while !writer.is_finished() {
            output.write_out(false);
            std::thread::yield_now();
        }
        writer.join().unwrap();
        output.write_out(true);
        assert_in_order(&written, lines);
    }

    /// Writers on several threads, a sink slower than they are: every line
    /// comes out once, whole, and each thread's lines in their order.
    #[test]
    fn every_line_comes_out_once_and_in_order_past_a_slow_sink() {
        let written = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = written.clone();
        let output = Batched::new(move |batch| {
            std::thread::sleep(Duration::from_millis(2));
            lock(&sink).extend_from_slice(batch);
        });
        let flusher = output.clone();
        std::thread::spawn(move || flusher.flusher());
        const THREADS: usize = 4;
        const LINES: usize = 20_000;
        let writers: Vec<_> = (0..THREADS)
            .map(|t| {
                let output = output.clone();
                std::thread::spawn(move || {
                    for i in 0..LINES {
                        output.append(format!("{t} {i} {}\n", "x".repeat(40)).as_bytes());
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        output.write_out(true);
        let written = String::from_utf8(lock(&written).clone()).unwrap();
        let mut next = [0usize; THREADS];
        for line in written.lines() {
            let mut parts = line.split(' ');
            let t: usize = parts.next().unwrap().parse().unwrap();
            let i: usize = parts.next().unwrap().parse().unwrap();
            assert_eq!(i, next[t], "thread {t}'s lines out of order");
            next[t] += 1;
        }
        assert_eq!(next, [LINES; THREADS], "every line, once");
    }
}
