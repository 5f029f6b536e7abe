//! The share of the request workers that long guest computations may take.
//!
//! Every store yields to tokio at each epoch tick ([`crate::engine`]), but
//! a yield only puts the call at the back of the workers' queue: with a
//! few calls computing, every other request waits behind one slice of each
//! of them at every step of its way through the server (measured: 8
//! computing calls made another request take 204 ms at p50).
//!
//! Invariant owned here: a call that has been interrupted
//! [`LONG_CALL_SLICES`] times is a long computation, and long computations
//! together start at most `slices_per_tick` slices per epoch tick, first
//! come, first served. With one fewer than there are workers, the calls
//! that answer within their first slices — the usual request — always find
//! a worker, however many long computations run.
//!
//! The share's ticker advances the epoch of the engines it serves and
//! then hands out the tick's slices, so a slice given at a tick lasts the
//! whole tick. A long computation waits for its next slice as a pending
//! future: its call's own deadline still ends it, and it holds no worker
//! while it waits. Between two slices it holds nothing, so one that then
//! waits on I/O takes nothing from the others.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::engine::EpochTicker;

/// Interruptions after which a call is a long computation. The first
/// interruption of a call can come as it enters the guest (its store's
/// deadline passed while it was idle), the next at the first tick it
/// computes through; the third means it has computed through at least
/// one whole tick (5 ms), while a request that answers takes well under a
/// millisecond.
pub const LONG_CALL_SLICES: u32 = 3;

/// The slices long computations may start per tick on a runtime of
/// `workers` worker threads: `long_call_workers` as the operator set it,
/// or else every worker but one, so that one is always free for the calls
/// that answer (and at least one).
pub fn slices_per_tick(workers: usize, long_call_workers: usize) -> usize {
    match long_call_workers {
        0 => workers.saturating_sub(1),
        n => n,
    }
    .max(1)
}

/// The slices long computations may start per tick, shared by every
/// engine that serves requests.
pub struct ComputeShare {
    slices: Arc<Semaphore>,
    slices_per_tick: usize,
    engines: Arc<Mutex<Vec<wasmtime::Engine>>>,
    counters: Arc<ShareCounters>,
    _ticker: EpochTicker,
}

/// What operators see of the share ([`ComputeShare::status`]).
#[derive(Default)]
struct ShareCounters {
    /// Slices long computations were given.
    granted: AtomicU64,
    /// Long computations waiting for a slice now.
    waiting: AtomicU64,
}

/// A moment's view of the share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareStatus {
    pub slices_per_tick: usize,
    pub slices_granted: u64,
    pub waiting: u64,
}

/// The share's ticker could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the compute share's epoch ticker: {cause}")]
pub struct ShareError {
    cause: std::io::Error,
}

impl ComputeShare {
    /// A share of `slices_per_tick` slices per tick (at least one).
    pub fn new(slices_per_tick: usize) -> Result<Arc<Self>, ShareError> {
        let slices_per_tick = slices_per_tick.max(1);
        let slices = Arc::new(Semaphore::new(slices_per_tick));
        let engines: Arc<Mutex<Vec<wasmtime::Engine>>> = Arc::default();
        let ticker = {
            let slices = slices.clone();
            let engines = engines.clone();
            EpochTicker::start(move || {
                for engine in engines.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    engine.increment_epoch();
                }
                // The slices not taken do not add up: at most a tick's worth
                // is ever there.
                let taken = slices_per_tick.saturating_sub(slices.available_permits());
                slices.add_permits(taken);
            })
            .map_err(|cause| ShareError { cause })?
        };
        Ok(Arc::new(ComputeShare {
            slices,
            slices_per_tick,
            engines,
            counters: Arc::default(),
            _ticker: ticker,
        }))
    }

    /// From now on the share's ticker advances `engine`'s epoch.
    pub(crate) fn tick(&self, engine: wasmtime::Engine) {
        self.engines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(engine);
    }

    /// What a long computation does at an interruption: it yields to
    /// tokio (its call's timers run), then waits for a slice of the share.
    pub(crate) fn next_slice(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let slices = self.slices.clone();
        let counters = self.counters.clone();
        Box::pin(async move {
            tokio::task::yield_now().await;
            let waiting = Waiting::new(&counters);
            // Closed never: the share lives as long as its engines.
            if let Ok(slice) = slices.acquire().await {
                slice.forget();
            }
            drop(waiting);
            counters.granted.fetch_add(1, Ordering::Relaxed);
        })
    }

    pub fn status(&self) -> ShareStatus {
        ShareStatus {
            slices_per_tick: self.slices_per_tick,
            slices_granted: self.counters.granted.load(Ordering::Relaxed),
            waiting: self.counters.waiting.load(Ordering::Relaxed),
        }
    }
}

/// A long computation counted as waiting until it has its slice or its
/// call ends.
struct Waiting<'a>(&'a ShareCounters);

impl<'a> Waiting<'a> {
    fn new(counters: &'a ShareCounters) -> Self {
        counters.waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(counters)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EPOCH_TICK;

    #[test]
    fn a_share_leaves_one_worker_unless_the_operator_says_and_has_at_least_one_slice() {
        assert_eq!(slices_per_tick(1, 0), 1);
        assert_eq!(slices_per_tick(2, 0), 1);
        assert_eq!(slices_per_tick(8, 0), 7);
        assert_eq!(slices_per_tick(2, 2), 2);
        assert_eq!(slices_per_tick(2, 5), 5);
        assert_eq!(ComputeShare::new(0).unwrap().status().slices_per_tick, 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn slices_beyond_a_ticks_share_come_with_later_ticks() {
        let share = ComputeShare::new(2).unwrap();
        // Within one tick at most two; five take at least two more ticks.
        for _ in 0..5 {
            tokio::time::timeout(EPOCH_TICK * 200, share.next_slice())
                .await
                .expect("the ticker hands out slices");
        }
        let status = share.status();
        assert_eq!(status.slices_granted, 5);
        assert_eq!(status.waiting, 0);
        // Nothing taken for a while: a tick's worth there, never more.
        tokio::time::timeout(EPOCH_TICK * 200, async {
            while share.slices.available_permits() < 2 {
                tokio::time::sleep(EPOCH_TICK).await;
            }
        })
        .await
        .expect("the ticker tops the slices up");
        tokio::time::sleep(EPOCH_TICK * 4).await;
        assert_eq!(share.slices.available_permits(), 2);
    }
}
