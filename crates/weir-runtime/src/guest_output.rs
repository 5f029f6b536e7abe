//! A guest's standard output and error: into Weir's log, bounded.
//!
//! Invariant owned here: one event (or turn of a layer above) adds at most
//! [`MAX_GUEST_OUTPUT_BYTES`] to Weir's log for its guest's output, stdout
//! and stderr together, records and their framing included (the records
//! are [`crate::guest_log`]'s); the rest is accepted from the guest and
//! dropped. A guest that prints in a loop adds no more than that per
//! event, and a panic message (a few hundred bytes) always gets through.
//! A one-shot run's output from the command line goes to Weir's own
//! stdout and stderr as it is (the operator's own program, its output its
//! result). A program's output
//! ([`GuestOutput::shared`]) has a budget of its own, past which writes
//! fail and [`GuestOutput::exceeded`] says so: its output is never more
//! than the budget, and a cut output never passes for a whole one.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

use crate::guest_log::{GuestLog, LogStream};

/// Bytes a guest's output adds to Weir's log per event, at most: room for
/// any diagnostic, and a bound on what one event adds to Weir's log.
pub const MAX_GUEST_OUTPUT_BYTES: u64 = 64 << 10;

/// Where a guest stream's bytes go.
#[derive(Clone)]
pub enum Sink {
    /// Weir's own standard output, as it is.
    Stdout,
    /// Weir's own standard error, as it is.
    Stderr,
    /// Records in Weir's log ([`crate::guest_log`]).
    Log(Arc<LogStream>),
    /// Nowhere (no log takes guest output).
    Nowhere,
    /// Kept in memory for the caller (a program's output handed back, a
    /// process's tail).
    Capture(Arc<dyn Keep>),
}

/// What keeps a captured stream's bytes.
pub trait Keep: Send + Sync {
    /// Takes bytes the guest wrote (all of them: what is kept is the
    /// keeper's to bound).
    fn keep(&self, bytes: &[u8]);
}

/// The whole output, for a caller that bounds it with a budget.
impl Keep for Mutex<Vec<u8>> {
    fn keep(&self, bytes: &[u8]) {
        self.lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
    }
}

/// What happens to bytes past the budget.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PastBudget {
    /// Accepted from the guest and dropped: a handler's diagnostics are
    /// not its result, and a chatty handler still answers.
    Drop,
    /// Refused: the guest's write fails. A program's output is its result,
    /// so a cut one must not look whole.
    Refuse,
}

/// A guest's stdout or stderr, sharing one budget with its sibling.
#[derive(Clone)]
pub struct GuestOutput {
    left: Arc<AtomicU64>,
    budget: u64,
    exceeded: Arc<AtomicBool>,
    past: PastBudget,
    sink: Sink,
    /// Both streams of a pair into the log, to finish their lines when
    /// an event ends.
    logs: Option<Arc<[Arc<LogStream>; 2]>>,
}

impl GuestOutput {
    /// The stdout and stderr of one generation, as records in `log` (or
    /// nowhere without one), with one budget of [`MAX_GUEST_OUTPUT_BYTES`]
    /// per event; the rest is dropped.
    pub fn pair(log: Option<&Arc<GuestLog>>) -> (GuestOutput, GuestOutput) {
        let Some(log) = log else {
            return Self::shared(0, PastBudget::Drop, Sink::Nowhere, Sink::Nowhere);
        };
        let left = Arc::new(AtomicU64::new(MAX_GUEST_OUTPUT_BYTES));
        let exceeded = Arc::new(AtomicBool::new(false));
        let stream = |name| {
            Arc::new(LogStream::new(
                log.clone(),
                name,
                left.clone(),
                exceeded.clone(),
            ))
        };
        let streams = Arc::new([stream("stdout"), stream("stderr")]);
        let one = |sink| GuestOutput {
            left: left.clone(),
            budget: MAX_GUEST_OUTPUT_BYTES,
            exceeded: exceeded.clone(),
            past: PastBudget::Drop,
            sink,
            logs: Some(streams.clone()),
        };
        (
            one(Sink::Log(streams[0].clone())),
            one(Sink::Log(streams[1].clone())),
        )
    }

    /// Two streams into `stdout` and `stderr` with one budget of `budget`
    /// bytes, and `past` for what comes after it.
    pub fn shared(
        budget: u64,
        past: PastBudget,
        stdout: Sink,
        stderr: Sink,
    ) -> (GuestOutput, GuestOutput) {
        let left = Arc::new(AtomicU64::new(budget));
        let exceeded = Arc::new(AtomicBool::new(false));
        let one = |sink| GuestOutput {
            left: left.clone(),
            budget,
            exceeded: exceeded.clone(),
            past,
            sink,
            logs: None,
        };
        (one(stdout), one(stderr))
    }

    /// A new event starts with a full budget.
    pub fn reset(&self) {
        self.left.store(self.budget, Ordering::Relaxed);
        self.exceeded.store(false, Ordering::Relaxed);
    }

    /// The event ended: a line the guest left unfinished on either stream
    /// goes to the log now, within the event's budget.
    pub fn end_event(&self) {
        for stream in self.logs.iter().flat_map(|logs| logs.iter()) {
            stream.end_event();
        }
    }

    /// True once the guest wrote more than the budget.
    pub fn exceeded(&self) -> bool {
        self.exceeded.load(Ordering::Relaxed)
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        let budget = Budget {
            left: self.left.clone(),
            exceeded: self.exceeded.clone(),
            past: self.past,
        };
        match &self.sink {
            Sink::Stdout => Box::new(Bounded {
                inner: tokio::io::stdout(),
                budget,
            }),
            Sink::Stderr => Box::new(Bounded {
                inner: tokio::io::stderr(),
                budget,
            }),
            Sink::Capture(into) => Box::new(Bounded {
                inner: Captured(into.clone()),
                budget,
            }),
            // The records count themselves against the budget.
            Sink::Log(stream) => Box::new(Logged(stream.clone())),
            Sink::Nowhere => Box::new(tokio::io::sink()),
        }
    }
}

/// The shared budget as one stream sees it.
struct Budget {
    left: Arc<AtomicU64>,
    exceeded: Arc<AtomicBool>,
    past: PastBudget,
}

/// Writes through to `inner` while the budget lasts, then drops or
/// refuses.
struct Bounded<W> {
    inner: W,
    budget: Budget,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Bounded<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let left = self.budget.left.load(Ordering::Relaxed) as usize;
        if left == 0 && !buf.is_empty() {
            self.budget.exceeded.store(true, Ordering::Relaxed);
            return Poll::Ready(match self.budget.past {
                PastBudget::Drop => Ok(buf.len()),
                PastBudget::Refuse => Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    "the output limit is reached",
                )),
            });
        }
        let n = left.min(buf.len());
        match Pin::new(&mut self.inner).poll_write(cx, &buf[..n]) {
            Poll::Ready(Ok(written)) => {
                let _ = self
                    .budget
                    .left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
                        Some(l.saturating_sub(written as u64))
                    });
                Poll::Ready(Ok(written))
            }
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Output into the log, as records.
struct Logged(Arc<LogStream>);

impl AsyncWrite for Logged {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0.write(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Output kept in memory.
struct Captured(Arc<dyn Keep>);

impl AsyncWrite for Captured {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0.keep(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn bounded(left: u64, past: PastBudget) -> Bounded<Vec<u8>> {
        Bounded {
            inner: Vec::new(),
            budget: Budget {
                left: Arc::new(AtomicU64::new(left)),
                exceeded: Arc::new(AtomicBool::new(false)),
                past,
            },
        }
    }

    #[tokio::test]
    async fn output_past_the_budget_is_accepted_and_dropped() {
        let mut out = bounded(10, PastBudget::Drop);
        out.write_all(b"0123456789abcdef").await.unwrap();
        out.write_all(b"more").await.unwrap();
        assert_eq!(out.inner, b"0123456789");
        assert_eq!(out.budget.left.load(Ordering::Relaxed), 0);
        assert!(out.budget.exceeded.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn output_past_a_refusing_budget_fails_the_write() {
        let mut out = bounded(4, PastBudget::Refuse);
        out.write_all(b"0123").await.unwrap();
        assert!(!out.budget.exceeded.load(Ordering::Relaxed));
        let err = out.write_all(b"4").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert_eq!(out.inner, b"0123");
        assert!(out.budget.exceeded.load(Ordering::Relaxed));
    }
}
