//! The timer pass: after a start, the timers of the actors on disk are
//! indexed by one pass over their databases that runs while the server
//! already serves, so that a start takes a directory listing per class,
//! not an open of every actor's database (about 110 µs each on a warm
//! cache, 350 µs on a cold one: half a minute for 100,000 actors). Before
//! it reads any database, the timer ledger's rows are indexed in one read
//! ([`crate::timer_ledger`]), so timers fire on time while it runs; the
//! pass is what makes the index exact.
//!
//! Invariants owned here:
//! - under each actor's hold the pass sets the index and the ledger's row
//!   to what the actor's database says: a row a power loss took from the
//!   ledger is put back, one left by a timer since cancelled is removed;
//! - every actor with a database when the pass began has its next timer
//!   indexed by the time the pass ends (a timer that fell due meanwhile is
//!   delivered then, late, never lost);
//! - the pass reads an actor under its hold (as a turn, an operator or a
//!   timer delivery does), so it never races a turn: a woken actor's next
//!   timer is read from its open database, a hibernated one's by opening
//!   it, which neither writes it nor changes its files (closing does not
//!   checkpoint), and an actor deleted meanwhile is skipped, not made
//!   again;
//! - the pass never hibernates anything and leaves no actor in memory: the
//!   hold it takes is let go of at once;
//! - an actor held when the pass comes to it (an owner under recovery, a
//!   long turn) is read at the end, so no hold delays the other actors'
//!   timers;
//! - a database that cannot be opened is reported (`unreadable` in the
//!   operators' status, and a warning), never fatal;
//! - it runs on a thread of its own, off the async workers: its reads
//!   block on the disk, and requests are served meanwhile;
//! - its progress is counted (`timer_pass` in the operators' status).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::address::ActorAddress;
use crate::directory::Unreadable;
use crate::host::ActorHost;

/// How far the pass has come.
#[derive(Debug, Default)]
pub struct TimerPass {
    /// Actors read so far.
    read: AtomicUsize,
    /// Actors it found when it began.
    of: AtomicUsize,
    /// Actors whose next deadline was indexed from the timer ledger before
    /// the pass read any database.
    ledgered: AtomicUsize,
    done: AtomicBool,
}

/// The pass's progress, as operators see it.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct PassProgress {
    pub read: usize,
    pub of: usize,
    /// Actors indexed from the timer ledger at the start, before the pass.
    #[serde(default)]
    pub ledgered: usize,
    pub done: bool,
}

impl TimerPass {
    pub fn progress(&self) -> PassProgress {
        PassProgress {
            read: self.read.load(Ordering::Relaxed),
            of: self.of.load(Ordering::Relaxed),
            ledgered: self.ledgered.load(Ordering::Relaxed),
            done: self.done.load(Ordering::Acquire),
        }
    }
}

impl ActorHost {
    /// Runs the timer pass over every class's actors on disk, on a thread
    /// of its own (its reads block on the disk; the async workers serve
    /// meanwhile).
    pub(crate) fn timer_pass(self: Arc<Self>) {
        // First what the ledger says, in one read: every timer is then
        // indexed at its row's deadline (or an earlier one) while the pass
        // below reads the databases.
        let ledgered = self.arm_from_ledger();
        self.pass.ledgered.store(ledgered, Ordering::Relaxed);
        let mut classes: Vec<String> = self.classes.keys().cloned().collect();
        classes.sort();
        let mut actors = Vec::new();
        for class in &classes {
            match self.directory.scan(class) {
                Ok(found) => actors.extend(found.actors),
                Err(e) => {
                    tracing::warn!(class, error = %e, "cannot list the actors of a class for their timers")
                }
            }
        }
        self.pass.of.store(actors.len(), Ordering::Relaxed);
        let mut held = Vec::new();
        for actor in actors {
            if self.arm_from_disk(&actor, false) {
                self.pass.read.fetch_add(1, Ordering::Relaxed);
            } else {
                held.push(actor);
            }
        }
        // Those held when the pass came (a recovery, a turn): read last,
        // waiting for each, so that one long hold delays no other
        // actor's timers.
        for actor in held {
            self.arm_from_disk(&actor, true);
            self.pass.read.fetch_add(1, Ordering::Relaxed);
        }
        // What the pass set is written before it says it is done.
        if let Some(ledger) = &self.ledger
            && let Err(e) = ledger.flush()
        {
            tracing::warn!(error = %e, "cannot write the timer pass's rows to the timer ledger");
        }
        self.pass.done.store(true, Ordering::Release);
        tracing::info!(
            actors = self.pass.of.load(Ordering::Relaxed),
            ledgered,
            timers = self.timers.len(),
            "indexed the timers of the actors on disk"
        );
    }

    /// Indexes one actor's next timer from its database, under its hold;
    /// unless `wait`, only if nobody holds it now (false when somebody
    /// does: nothing was read).
    fn arm_from_disk(&self, actor: &ActorAddress, wait: bool) -> bool {
        let Ok(class) = self.class(&actor.class) else {
            return true;
        };
        let claim = self.claim_passing(actor, &class);
        let read = {
            let live = if wait {
                claim.cell.live.blocking_lock()
            } else if let Ok(live) = claim.cell.live.try_lock() {
                live
            } else {
                drop(claim);
                self.forget_unopened(actor);
                return false;
            };
            let next = match &live.gate {
                Some(gate) => gate
                    .with_db(|db| db.next_deadline())
                    .map_err(|e| e.to_string()),
                // Deleted since the listing: nothing to index, and
                // opening it would make a new actor of its name.
                None if !self.directory.exists(actor) => Ok(None),
                None => {
                    // Opening does not change its files, unless it is of
                    // an older schema and is brought up to date: then the
                    // room counts what they take now.
                    let before = self.directory.files_bytes(actor);
                    let next = self
                        .directory
                        .open(actor)
                        .map_err(|e| e.to_string())
                        .and_then(|db| db.next_deadline().map_err(|e| e.to_string()));
                    let after = self.directory.files_bytes(actor);
                    self.directory.room().moved(before, after);
                    next
                }
            };
            // Under the hold the database is the truth: no turn has
            // changed it since, and the next one re-indexes what it
            // changes.
            if let Ok(next) = next {
                self.timers.set(actor, next);
                self.ledger_exact(actor, next);
            }
            next
        };
        drop(claim);
        self.forget_unopened(actor);
        if let Err(error) = read {
            let path = self.directory.path(actor);
            tracing::warn!(path = %path.display(), %error, "skipping an actor database that cannot be used");
            self.unreadable
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Unreadable { path, error });
        }
        true
    }
}
