//! Log output: receipts and diagnostics as JSON lines on stderr, batched.
//!
//! Invariant owned here: writing a log line never costs a system call on the
//! request path. Lines are appended to one buffer that is written out when
//! it passes [`FLUSH_BYTES`], by a flusher thread every [`FLUSH_INTERVAL`],
//! and when `weir` exits normally. A `SIGKILL` can lose at most the last
//! interval's lines — logs, never data.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use weir_runtime::receipt::ReceiptSink;

/// A buffer this large is written out at once: large enough to batch a few
/// hundred receipts into one write, small enough to stay in cache.
pub const FLUSH_BYTES: usize = 64 * 1024;

/// Longest a line waits in the buffer: short enough that someone tailing
/// the log sees events as they happen.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(50);

#[derive(Clone, Default)]
struct Batched {
    buf: Arc<Mutex<Vec<u8>>>,
}

impl Batched {
    fn flush(&self) {
        let mut buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        if !buf.is_empty() {
            let _ = std::io::stderr().lock().write_all(&buf);
            buf.clear();
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

impl Batched {
    fn append(&self, data: &[u8]) {
        let mut buf = self.buf.lock().unwrap_or_else(|p| p.into_inner());
        buf.extend_from_slice(data);
        if buf.len() >= FLUSH_BYTES {
            let _ = std::io::stderr().lock().write_all(&buf);
            buf.clear();
        }
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
    if !tracing::enabled!(target: "weir::receipt", tracing::Level::INFO) {
        return None;
    }
    let output = OUTPUT.get_or_init(Batched::default).clone();
    Some(Arc::new(output))
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
        .spawn(move || {
            loop {
                std::thread::sleep(FLUSH_INTERVAL);
                output.flush();
            }
        });
}

/// Writes out whatever is buffered; called before `weir` exits.
pub fn flush() {
    if let Some(output) = OUTPUT.get() {
        output.flush();
    }
}
