//! Residency: which actors stay in memory. An actor is in memory (its
//! instance and its open database in a cell) or hibernated (only its
//! database file and its entry in the timer index).
//!
//! Invariants owned here:
//! - an actor with no event in flight is evicted after `actor_idle_ms`: its
//!   instance and its database are dropped; its timers stay in the index
//!   and wake it;
//! - past the live-actor cap, or when the guest memory budget needs room,
//!   the least recently used idle actors go first; an actor somebody holds
//!   or waits for is never evicted;
//! - evicted actors are closed off the async workers, on one thread, and
//!   their memory is handed back to the kernel.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use weir_store::actor::CHECKPOINT_ON_CLOSE_COMMITS;

use crate::address::ActorAddress;
use crate::host::{ActorHost, Cell};

/// Shortest pause between hibernation sweeps; the sweep interval is a
/// quarter of `actor_idle_ms`, but never busier than this.
pub const MIN_SWEEP_INTERVAL: Duration = Duration::from_millis(50);

/// Longest pause between hibernation sweeps, so an idle actor is evicted
/// within `actor_idle_ms` plus at most this.
pub const MAX_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Idle actors hibernated at once when a new actor needs room, at most: a
/// batch amortizes the search for the least recently used.
pub const EVICTION_BATCH: usize = 32;

/// A batch is also at most this fraction of the live-actor cap (1/8), so
/// that under a small cap most recently used actors stay in memory.
pub const EVICTION_BATCH_DIVISOR: usize = 8;

impl ActorHost {
    /// Hibernates up to [`EVICTION_BATCH`] idle actors, least recently
    /// active first, to make room for a new one.
    pub(crate) fn evict_least_recent(&self, cells: &mut HashMap<ActorAddress, Arc<Cell>>) {
        let mut idle: Vec<(u64, ActorAddress)> = cells
            .iter()
            .filter(|(_, c)| c.pending.load(Ordering::Acquire) == 0)
            .map(|(a, c)| (c.last_turn.load(Ordering::Relaxed), a.clone()))
            .collect();
        let batch = (self.max_live / EVICTION_BATCH_DIVISOR).clamp(1, EVICTION_BATCH);
        let n = idle.len().min(batch);
        if n == 0 {
            return;
        }
        if n < idle.len() {
            idle.select_nth_unstable(n - 1);
        }
        let evicted: Vec<Arc<Cell>> = idle[..n]
            .iter()
            .filter_map(|(_, a)| cells.remove(a))
            .inspect(|c| c.class.load().actor_metrics.hibernated())
            .collect();
        self.counters
            .hibernations
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        self.close_evicted(evicted);
    }

    /// Hands evicted actors to the closer thread.
    pub(crate) fn close_evicted(&self, evicted: Vec<Arc<Cell>>) {
        if evicted.is_empty() {
            return;
        }
        // If the closer is gone, the batch comes back and drops here.
        let n = evicted.len();
        self.closing.fetch_add(n, Ordering::AcqRel);
        if self.closer.send(evicted).is_err() {
            self.closing.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Takes out of memory the cell of an actor that was never opened (its
    /// making was refused) if nobody holds or waits for it: a flood of
    /// made-up names would otherwise fill the live-actor cap with empty
    /// cells until the idle sweep, and hibernate actors that exist.
    pub(crate) fn forget_unopened(&self, address: &ActorAddress) {
        let mut cells = self.lock_cells();
        let Some(cell) = cells.get(address) else {
            return;
        };
        if cell.pending.load(Ordering::Acquire) > 0 {
            return;
        }
        let unopened = cell
            .live
            .try_lock()
            .is_ok_and(|live| live.gate.is_none() && live.generation.is_none());
        if unopened {
            cells.remove(address);
        }
    }

    /// Evicts actors idle for `actor_idle_ms` with nobody waiting for them.
    fn hibernate_idle(&self) -> usize {
        let now = self.elapsed_ms();
        let mut evicted = Vec::new();
        {
            let mut cells = self.lock_cells();
            cells.retain(|_, cell| {
                if cell.pending.load(Ordering::Acquire) > 0 {
                    return true;
                }
                let idle_ms = cell.class.load().limits.actor_idle.as_millis() as u64;
                let idle_for = now.saturating_sub(cell.last_active_ms.load(Ordering::Relaxed));
                if idle_for < idle_ms {
                    return true;
                }
                cell.class.load().actor_metrics.hibernated();
                evicted.push(cell.clone());
                false
            });
            if let Some(class) = self.classes.values().next() {
                class.load().actor_metrics.set_in_memory(cells.len());
            }
        }
        let n = evicted.len();
        self.counters
            .hibernations
            .fetch_add(n as u64, Ordering::Relaxed);
        self.close_evicted(evicted);
        n
    }
}

impl weir_runtime::memory_budget::Reclaim for ActorHost {
    /// Hibernates idle actors, least recently used first, until their
    /// instances hold at least `bytes`; their memory comes back to the
    /// budget when the closer drops them.
    fn reclaim(&self, bytes: u64) -> u64 {
        let mut cells = self.lock_cells();
        let mut idle: Vec<(u64, ActorAddress, Arc<Cell>)> = cells
            .iter()
            .filter(|(_, c)| c.pending.load(Ordering::Acquire) == 0)
            .map(|(a, c)| (c.last_turn.load(Ordering::Relaxed), a.clone(), c.clone()))
            .collect();
        idle.sort_unstable_by_key(|(order, _, _)| *order);
        let mut freed = 0u64;
        let mut evicted = Vec::new();
        for (_, address, cell) in idle {
            if freed >= bytes {
                break;
            }
            // A cell nobody claims has a free lock; one taken meanwhile is
            // skipped.
            let held = match cell.live.try_lock() {
                Ok(live) => live.generation.as_ref().map_or(0, |g| g.memory_bytes()),
                Err(_) => continue,
            };
            if held == 0 {
                continue;
            }
            freed += held as u64;
            if let Some(cell) = cells.remove(&address) {
                cell.class.load().actor_metrics.hibernated();
                evicted.push(cell);
            }
        }
        self.counters
            .hibernations
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        drop(cells);
        if !evicted.is_empty() {
            tracing::info!(
                actors = evicted.len(),
                bytes = freed,
                "hibernating idle actors to make room in the guest memory budget"
            );
        }
        self.close_evicted(evicted);
        freed
    }
}

/// Closes hibernated actors on one thread of its own: their instances and
/// databases are dropped outside the map lock and off the async workers
/// (thousands of stores take a while to free), an actor with a long WAL is
/// checkpointed first so its next wake does not replay it, and the heap is
/// trimmed whenever the queue runs dry. One thread, whatever the rate of
/// evictions: a thread per batch would itself hold memory.
pub(crate) fn start_closer(closing: Arc<AtomicUsize>) -> std::sync::mpsc::Sender<Vec<Arc<Cell>>> {
    let (tx, rx) = std::sync::mpsc::channel::<Vec<Arc<Cell>>>();
    let spawned = std::thread::Builder::new()
        .name("weir-actor-closer".into())
        .spawn(move || {
            while let Ok(batch) = rx.recv() {
                let mut closed = batch.len();
                close(batch);
                while let Ok(batch) = rx.try_recv() {
                    closed += batch.len();
                    close(batch);
                }
                release_freed_memory();
                // Counted down only once their memory is back.
                closing.fetch_sub(closed, Ordering::AcqRel);
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the actor closer thread; evicted actors close where they are dropped");
    }
    tx
}

fn close(evicted: Vec<Arc<Cell>>) {
    for cell in evicted {
        // Nobody holds an evicted cell: the lock is free.
        if let Ok(live) = cell.live.try_lock()
            && let Some(gate) = &live.gate
            && gate.broken().is_none()
        {
            gate.with_db(|db| {
                if db.commits_since_checkpoint() >= CHECKPOINT_ON_CLOSE_COMMITS {
                    let _ = db.checkpoint();
                }
            });
        }
    }
}

/// Hands memory freed by hibernated actors back to the kernel. glibc keeps
/// freed heap pages in its arenas; thousands of evicted stores leave them
/// fragmented, so without a trim the server's RSS would stay at its peak.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas; it takes no
    // pointers from us and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The hibernation sweeper.
pub(crate) async fn sweep(host: std::sync::Weak<ActorHost>) {
    loop {
        let interval = {
            let Some(h) = host.upgrade() else { return };
            let idle = h
                .classes
                .values()
                .map(|c| c.load().limits.actor_idle)
                .min()
                .unwrap_or(MAX_SWEEP_INTERVAL);
            h.hibernate_idle();
            (idle / 4).clamp(MIN_SWEEP_INTERVAL, MAX_SWEEP_INTERVAL)
        };
        tokio::time::sleep(interval).await;
    }
}
