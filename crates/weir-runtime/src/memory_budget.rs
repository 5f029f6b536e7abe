//! The memory budget: the linear memory of every live instance together,
//! and what one instance may make the host allocate.
//!
//! Invariants owned here:
//! - one instance's linear memory never exceeds `memory_limit_bytes`; all
//!   live instances' together (every engine's) never
//!   exceed `max_total_guest_memory_bytes`: every byte is reserved from
//!   the [`MemoryBudget`] before the memory grows, and given back when the
//!   instance's store is dropped;
//! - when a growth does not fit, a layer above lets idle instances go first (the
//!   [`Reclaim`] hook) and the growth waits, up to [`RECLAIM_WAIT`], for
//!   their memory to come back; if it still does not fit, it is refused
//!   and the event or turn fails with `memory_budget_exceeded`;
//! - what a layer above holds in the host for a guest's call, beside the
//!   guest's own copy (a program run's stdin and captured output), is
//!   held out of the same budget while the call lasts ([`Held`]);
//! - tables, instances, tables and memories per store are bounded, so one
//!   `table.grow` or a composed component cannot make the host allocate
//!   without limit, whatever allocator the engine uses.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Longest a growth that does not fit waits for instances let go to give
/// their memory back: dropping one takes well under a millisecond, so
/// this covers a batch of them on a loaded machine while keeping a refusal
/// prompt.
pub const RECLAIM_WAIT: Duration = Duration::from_millis(500);

/// Elements one table may hold, on both engines: wasmtime's pooling
/// default, which workers have always run under. Each element is a pointer
/// or two of host memory, so one table stays under ~320 KB.
pub const MAX_TABLE_ELEMENTS: usize = 20_000;

/// Core instances, tables and memories one store may hold. A component
/// built for wasm32-wasip2 has one main module plus the adapter shims;
/// 16 leaves room for composed components.
pub const MAX_INSTANCES_PER_STORE: usize = 16;
pub const MAX_TABLES_PER_STORE: usize = 16;
pub const MAX_MEMORIES_PER_STORE: usize = 16;

/// Something that can give guest memory back on demand: a layer above
/// that keeps idle instances (it lets the least recently used go).
pub trait Reclaim: Send + Sync {
    /// Starts freeing at least `bytes` of guest memory if it can; returns
    /// the bytes it expects to free.
    fn reclaim(&self, bytes: u64) -> u64;
}

/// The guest memory of every live instance of the process.
pub struct MemoryBudget {
    limit: u64,
    used: AtomicU64,
    released: Notify,
    reclaimer: OnceLock<Weak<dyn Reclaim>>,
    refusals: AtomicU64,
}

impl MemoryBudget {
    pub fn new(limit: u64) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            limit,
            used: AtomicU64::new(0),
            released: Notify::new(),
            reclaimer: OnceLock::new(),
            refusals: AtomicU64::new(0),
        })
    }

    /// Connects the reclaimer (later calls are ignored).
    pub fn set_reclaimer(&self, reclaimer: &Arc<dyn Reclaim>) {
        let _ = self.reclaimer.set(Arc::downgrade(reclaimer));
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes reserved by live instances now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Growths refused so far.
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    /// Reserves `bytes` if they fit now.
    pub fn try_reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|n| *n <= self.limit)
            })
            .is_ok()
    }

    /// Reserves `bytes`, asking the reclaimer for room and waiting up to
    /// [`RECLAIM_WAIT`] for memory to come back if they do not fit now.
    pub async fn reserve(&self, bytes: u64) -> bool {
        if self.try_reserve(bytes) {
            return true;
        }
        if bytes > self.limit {
            self.refusals.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let reclaimer = self.reclaimer.get().and_then(Weak::upgrade);
        if let Some(r) = &reclaimer {
            let short = (self.used() + bytes).saturating_sub(self.limit);
            r.reclaim(short.max(bytes));
        }
        let deadline = Instant::now() + RECLAIM_WAIT;
        loop {
            let released = self.released.notified();
            if self.try_reserve(bytes) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, released).await.is_err() {
                if self.try_reserve(bytes) {
                    return true;
                }
                self.refusals.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
    }

    /// Holds `bytes` out of the budget until the returned [`Held`] is
    /// dropped, as [`MemoryBudget::reserve`] would; `None` when they do not
    /// fit (counted as a refusal).
    pub async fn hold(self: &Arc<Self>, bytes: u64) -> Option<Held> {
        self.reserve(bytes).await.then(|| Held {
            budget: self.clone(),
            bytes,
        })
    }

    /// Gives `bytes` back.
    pub fn release(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        self.released.notify_waiters();
    }
}

/// Bytes held out of the budget for as long as this lives.
pub struct Held {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

/// What one store may allocate: its memory limit, its share of the budget
/// and the table and instance bounds. Dropped with the store, it gives the
/// store's memory back to the budget.
pub struct MemoryLimiter {
    limit: usize,
    budget: Arc<MemoryBudget>,
    /// Bytes this store holds from the budget.
    charged: u64,
    /// Reserved for a growth wasmtime has not confirmed yet.
    pending: u64,
    /// The guest asked for more than `memory_limit_bytes`.
    pub(crate) exceeded: bool,
    /// The guest's growth did not fit in the total budget.
    pub(crate) over_budget: bool,
    /// Largest linear memory this store has reached, for receipts.
    pub(crate) peak: usize,
    /// Where the peak is also kept for readers outside the store (a
    /// long-lived process's ledger), if anywhere.
    pub(crate) mirror: Option<Arc<std::sync::atomic::AtomicU64>>,
}

impl MemoryLimiter {
    /// The store's `memory_limit_bytes`.
    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn new(limit: usize, budget: Arc<MemoryBudget>) -> MemoryLimiter {
        MemoryLimiter {
            limit,
            budget,
            charged: 0,
            pending: 0,
            exceeded: false,
            over_budget: false,
            peak: 0,
            mirror: None,
        }
    }
}

#[async_trait::async_trait]
impl wasmtime::ResourceLimiterAsync for MemoryLimiter {
    async fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.exceeded = true;
            return Ok(false);
        }
        let more = desired.saturating_sub(current) as u64;
        if !self.budget.reserve(more).await {
            self.over_budget = true;
            return Ok(false);
        }
        self.charged += more;
        self.pending = more;
        self.peak = self.peak.max(desired);
        if let Some(mirror) = &self.mirror {
            mirror.store(self.peak as u64, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        let failed = std::mem::take(&mut self.pending);
        self.charged -= failed;
        self.budget.release(failed);
        Ok(())
    }

    async fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES_PER_STORE
    }

    fn tables(&self) -> usize {
        MAX_TABLES_PER_STORE
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES_PER_STORE
    }
}

impl Drop for MemoryLimiter {
    fn drop(&mut self) {
        self.budget.release(self.charged);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test]
    async fn reservations_fit_the_limit_and_come_back() {
        let budget = MemoryBudget::new(100);
        assert!(budget.reserve(60).await);
        assert!(budget.try_reserve(40));
        assert!(!budget.try_reserve(1));
        budget.release(50);
        assert_eq!(budget.used(), 50);
        assert!(!budget.reserve(101).await, "more than the whole budget");
        assert_eq!(budget.refusals(), 1);
    }

    struct Freer {
        budget: Arc<MemoryBudget>,
        asked: AtomicUsize,
    }

    impl Reclaim for Freer {
        fn reclaim(&self, bytes: u64) -> u64 {
            self.asked.fetch_add(1, Ordering::SeqCst);
            let budget = self.budget.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                budget.release(bytes);
            });
            bytes
        }
    }

    #[tokio::test]
    async fn a_growth_that_does_not_fit_waits_for_reclaimed_memory() {
        let budget = MemoryBudget::new(100);
        assert!(budget.try_reserve(100));
        let freer: Arc<dyn Reclaim> = Arc::new(Freer {
            budget: budget.clone(),
            asked: AtomicUsize::new(0),
        });
        budget.set_reclaimer(&freer);
        assert!(budget.reserve(30).await, "the reclaimed 30 bytes were used");
        assert_eq!(budget.used(), 100);
        // Without a reclaimer nothing comes back, and the wait is bounded.
        let alone = MemoryBudget::new(10);
        assert!(alone.try_reserve(10));
        let started = Instant::now();
        assert!(!alone.reserve(1).await);
        assert!(started.elapsed() >= RECLAIM_WAIT);
    }
}
