//! The event scope: every host operation a guest starts during one event
//! is registered here, bounded, abortable, and drained when the event ends.
//!
//! Invariants owned here:
//! - at most `max_operations` operations are live at once; one more is
//!   refused with `event_operation_capacity` and nothing is started; after
//!   the scope closes, `event_scope_closed`, nothing started;
//! - `abort` is idempotent and tells each live operation to stop exactly
//!   once; an operation ends by dropping its [`Operation`] handle;
//! - `invalidate` fences at once: a completion checked after it is dropped,
//!   never delivered into this or any later generation;
//! - `drain` waits, within one total budget, until every operation —
//!   including ones registered by late completions before close — has ended,
//!   and says whether it did. Nothing is retried or rolled back: an
//!   operation cut off mid-way stays of unknown outcome;
//! - the scope knows its event's current deadline, so host work that
//!   cannot be awaited away (a SQLite statement on its own thread) stops
//!   itself at that deadline, or at once on invalidation
//!   ([`EventScope::stop_check`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

/// The origin every scope's deadline is counted from: one for the
/// process, so that making a scope reads no clock. A deadline before it
/// counts as at it (already passed).
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Why an operation could not be registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    #[error("event_operation_capacity")]
    Capacity,
    #[error("event_scope_closed")]
    Closed,
}

struct Counts {
    live: usize,
    closed: bool,
    aborted: bool,
    /// Made at the first registration: an event that starts no host
    /// operation (most of them) pays for no channel, and its abort
    /// notifies nobody.
    abort: Option<watch::Sender<bool>>,
}

/// One event's scope. Shared (`Arc`) between the event task and the host
/// operations it starts.
pub struct EventScope {
    max_operations: usize,
    /// The live count, and the abort flag that operations watch (it flips
    /// to true once, on the first abort).
    counts: Mutex<Counts>,
    invalid: AtomicBool,
    drained: Notify,
    /// Operations ever refused for capacity, for receipts and metrics.
    refused: AtomicUsize,
    /// Operations ever registered, for receipts.
    started: AtomicUsize,
    /// The event's current deadline, in ns after [`origin`] (`u64::MAX`:
    /// none set).
    deadline_ns: AtomicU64,
}

/// A registered host operation. Dropping it ends the operation's hold on
/// the scope.
pub struct Operation {
    scope: Arc<EventScope>,
    aborted: watch::Receiver<bool>,
}

impl EventScope {
    pub fn new(max_operations: usize) -> Arc<Self> {
        Arc::new(EventScope {
            max_operations,
            counts: Mutex::new(Counts {
                live: 0,
                closed: false,
                aborted: false,
                abort: None,
            }),
            invalid: AtomicBool::new(false),
            drained: Notify::new(),
            refused: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            deadline_ns: AtomicU64::new(u64::MAX),
        })
    }

    /// Sets the event's deadline as it moves (entry, headers, a client
    /// that left).
    pub fn set_deadline(&self, at: Instant) {
        let ns = at.saturating_duration_since(origin()).as_nanos();
        self.deadline_ns
            .store(u64::try_from(ns).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The event's current deadline, if one is set: how long host work on
    /// its behalf may take at most.
    pub fn deadline(&self) -> Option<Instant> {
        match self.deadline_ns.load(Ordering::Relaxed) {
            u64::MAX => None,
            ns => Some(origin() + std::time::Duration::from_nanos(ns)),
        }
    }

    /// True once the event's deadline has passed or the scope is
    /// invalidated: work on the event's behalf must stop.
    pub fn should_stop(&self) -> bool {
        if !self.is_valid() {
            return true;
        }
        let deadline = self.deadline_ns.load(Ordering::Relaxed);
        deadline != u64::MAX
            && u64::try_from(origin().elapsed().as_nanos()).unwrap_or(u64::MAX) >= deadline
    }

    /// [`EventScope::should_stop`] as a check that host work can carry to
    /// another thread.
    pub fn stop_check(self: &Arc<Self>) -> weir_store::statement_bounds::StopCheck {
        let scope = self.clone();
        Arc::new(move || scope.should_stop())
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers one operation, or refuses it without starting anything.
    pub fn register(self: &Arc<Self>) -> Result<Operation, ScopeError> {
        let mut counts = self.counts();
        if counts.closed {
            return Err(ScopeError::Closed);
        }
        if counts.live >= self.max_operations {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(ScopeError::Capacity);
        }
        counts.live += 1;
        self.started.fetch_add(1, Ordering::Relaxed);
        let aborted = counts.aborted;
        let aborted = counts
            .abort
            .get_or_insert_with(|| watch::Sender::new(aborted))
            .subscribe();
        Ok(Operation {
            scope: self.clone(),
            aborted,
        })
    }

    /// Operations live now.
    pub fn live(&self) -> usize {
        self.counts().live
    }

    /// Operations registered so far.
    pub fn started(&self) -> usize {
        self.started.load(Ordering::Relaxed)
    }

    /// Operations refused for capacity so far.
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::Relaxed)
    }

    /// Tells every live operation to stop. Idempotent.
    pub fn abort(&self) {
        let mut counts = self.counts();
        if !std::mem::replace(&mut counts.aborted, true)
            && let Some(abort) = &counts.abort
        {
            abort.send_replace(true);
        }
    }

    /// Fences the scope: completions checked from now on are dropped.
    pub fn invalidate(&self) {
        self.invalid.store(true, Ordering::SeqCst);
        self.abort();
    }

    /// True until the scope is invalidated.
    pub fn is_valid(&self) -> bool {
        !self.invalid.load(Ordering::SeqCst)
    }

    /// Refuses new operations from now on.
    pub fn close(&self) {
        self.counts().closed = true;
    }

    /// Waits until no operation is live, up to `budget`. True if drained.
    pub async fn drain(&self, budget: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.drained.notified();
                if self.live() == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(budget, wait).await.is_ok()
    }

    /// Waits without a bound until no operation is live.
    pub async fn settled(&self) {
        while !self.drain(Duration::from_secs(3600)).await {}
    }
}

impl Operation {
    /// Resolves when the scope aborts this operation.
    pub async fn aborted(&mut self) {
        // An error means the scope is gone, which also means: stop.
        let _ = self.aborted.wait_for(|aborted| *aborted).await;
    }

    /// True until the scope is invalidated; a completion must check this
    /// before it delivers anything.
    pub fn is_valid(&self) -> bool {
        self.scope.is_valid()
    }
}

impl Drop for Operation {
    fn drop(&mut self) {
        let mut counts = self.scope.counts();
        counts.live -= 1;
        if counts.live == 0 {
            drop(counts);
            self.scope.drained.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn capacity_close_abort_and_drain() {
        let scope = EventScope::new(2);
        let a = scope.register().unwrap();
        let mut b = scope.register().unwrap();
        assert_eq!(scope.register().err(), Some(ScopeError::Capacity));
        assert_eq!(scope.refused(), 1);
        assert_eq!(scope.started(), 2);
        drop(a);
        let c = scope.register().unwrap();
        scope.close();
        assert_eq!(scope.register().err(), Some(ScopeError::Closed));
        assert!(
            !scope.drain(Duration::from_millis(20)).await,
            "two still live"
        );
        scope.abort();
        scope.abort();
        b.aborted().await;
        drop(b);
        drop(c);
        assert!(scope.drain(Duration::from_millis(20)).await);
    }

    #[test]
    fn work_stops_at_the_deadline_or_on_invalidation() {
        let scope = EventScope::new(4);
        let stop = scope.stop_check();
        assert!(!stop(), "no deadline yet");
        scope.set_deadline(Instant::now() + Duration::from_secs(60));
        assert!(!stop());
        scope.set_deadline(Instant::now());
        assert!(stop(), "the deadline passed");
        let scope = EventScope::new(4);
        let stop = scope.stop_check();
        scope.invalidate();
        assert!(stop(), "abandoned");
    }

    #[tokio::test]
    async fn an_operation_registered_after_the_abort_is_aborted_at_once() {
        // The abort channel is made lazily: an abort that found no
        // operation must still reach the ones that come after it.
        let scope = EventScope::new(4);
        scope.abort();
        let mut late = scope.register().unwrap();
        tokio::time::timeout(Duration::from_secs(5), late.aborted())
            .await
            .expect("aborted at once");
        // And one registered before the abort is told once it comes.
        let scope = EventScope::new(4);
        let mut early = scope.register().unwrap();
        let mut second = scope.register().unwrap();
        scope.abort();
        early.aborted().await;
        second.aborted().await;
    }

    #[tokio::test]
    async fn invalidation_fences_and_aborts() {
        let scope = EventScope::new(4);
        let mut op = scope.register().unwrap();
        assert!(op.is_valid());
        scope.invalidate();
        assert!(!op.is_valid());
        op.aborted().await;
    }
}
