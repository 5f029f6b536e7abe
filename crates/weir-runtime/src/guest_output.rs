//! A guest's standard output and error: written to Weir's own, bounded.
//!
//! Invariant owned here: one event (or turn of a layer above) makes Weir write at most
//! [`MAX_GUEST_OUTPUT_BYTES`] of its guest's output, stdout and stderr
//! together; the rest is accepted from the guest and dropped. A guest that
//! prints in a loop cannot fill the operator's logs or disk, and a panic
//! message (a few hundred bytes) always gets through.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

/// Bytes of a guest's output written per event, at most: room for any
/// diagnostic, and a bound on what one event adds to Weir's log.
pub const MAX_GUEST_OUTPUT_BYTES: u64 = 64 << 10;

/// Which of Weir's streams a guest stream goes to.
#[derive(Clone, Copy)]
enum Target {
    Stdout,
    Stderr,
}

/// A guest's stdout or stderr, sharing one budget per generation.
#[derive(Clone)]
pub struct GuestOutput {
    left: Arc<AtomicU64>,
    target: Target,
}

impl GuestOutput {
    /// The stdout and stderr of one generation, with one budget.
    pub fn pair() -> (GuestOutput, GuestOutput) {
        let left = Arc::new(AtomicU64::new(MAX_GUEST_OUTPUT_BYTES));
        (
            GuestOutput {
                left: left.clone(),
                target: Target::Stdout,
            },
            GuestOutput {
                left,
                target: Target::Stderr,
            },
        )
    }

    /// A new event starts with a full budget.
    pub fn reset(&self) {
        self.left.store(MAX_GUEST_OUTPUT_BYTES, Ordering::Relaxed);
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        match self.target {
            Target::Stdout => Box::new(Bounded {
                inner: tokio::io::stdout(),
                left: self.left.clone(),
            }),
            Target::Stderr => Box::new(Bounded {
                inner: tokio::io::stderr(),
                left: self.left.clone(),
            }),
        }
    }
}

/// Writes through to `inner` while the budget lasts, then accepts and
/// drops.
struct Bounded<W> {
    inner: W,
    left: Arc<AtomicU64>,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Bounded<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let left = self.left.load(Ordering::Relaxed) as usize;
        if left == 0 {
            return Poll::Ready(Ok(buf.len()));
        }
        let n = left.min(buf.len());
        match Pin::new(&mut self.inner).poll_write(cx, &buf[..n]) {
            Poll::Ready(Ok(written)) => {
                let _ = self
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn output_past_the_budget_is_accepted_and_dropped() {
        let left = Arc::new(AtomicU64::new(10));
        let mut out = Bounded {
            inner: Vec::new(),
            left: left.clone(),
        };
        out.write_all(b"0123456789abcdef").await.unwrap();
        out.write_all(b"more").await.unwrap();
        assert_eq!(out.inner, b"0123456789");
        assert_eq!(left.load(Ordering::Relaxed), 0);
    }
}
