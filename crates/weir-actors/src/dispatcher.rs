//! The dispatcher: hands every actor whose timer is due to a delivery of
//! its own, which runs the due alarms as turns.
//!
//! Invariants owned here: one task watches the whole timer index and
//! sleeps until its earliest deadline (or until the index changes); an
//! actor is delivered by one task at a time (taking it from the index is
//! the hand-off), and a delivery that cannot wake the actor puts it back
//! to be tried after `WAKE_RETRY_MS`, and one whose alarm turn could not
//! commit (its actor reset, its timers as they were) puts it back to be
//! tried after a wait that grows with each such failure in a row; at most `max_concurrent_alarms`
//! deliveries run at once, and due actors past it wait in the index,
//! earliest deadline first, so alarms that re-arm themselves for "now"
//! take turns with each other instead of crowding out requests; a
//! delivery whose actor was deleted while it waited for its turn ends
//! without waking anything.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::address::ActorAddress;
use crate::host::ActorHost;
use crate::placement::Location;
use crate::receipts::{TurnKind, TurnNotes};
use crate::timers::{MAX_DISPATCH_SLEEP_MS, WAKE_RETRY_MS, commit_retry_at, now_ms};
use crate::turn::{AlarmOutcome, alarm_turns};

impl ActorHost {
    /// Delivers the due timers of one actor.
    async fn deliver(self: Arc<Self>, address: ActorAddress) {
        let Ok(class) = self.class(&address.class) else {
            return;
        };
        if let Some(placement) = &self.placement {
            match placement.locate(&address, false, true).await {
                Ok(Location::Here) => {}
                // Its owner delivers its timers.
                Ok(Location::Elsewhere(_)) => return,
                Err(_) => {
                    self.timers.set(&address, Some(now_ms() + WAKE_RETRY_MS));
                    return;
                }
            }
        }
        let claim = self.claim_always(&address, &class);
        let cell = claim.cell.clone();
        let mut live = cell.live.lock().await;
        if live.gate.is_none() && !self.has_storage(&address) {
            // Deleted while this waited for its turn (or its row in the
            // timer ledger outlived it): its timers went with it, and
            // waking it would make a new actor of its name.
            self.ledger_remove(&address);
            return;
        }
        let class = cell.class.load_full();
        let started = Instant::now();
        let host = self.clone();
        let dispatch = self.counters.dispatches.fetch_add(1, Ordering::Relaxed) + 1;
        let result = alarm_turns(
            &self.context(&cell, &class),
            &mut live,
            |reason, outcome, report| {
                host.counters.alarms.fetch_add(1, Ordering::Relaxed);
                let (label, attempt) = match outcome {
                    AlarmOutcome::Delivered { .. } => ("ok", None),
                    AlarmOutcome::Retrying { attempt, .. } => ("retrying", Some(*attempt)),
                    AlarmOutcome::Dropped { attempts, .. } => {
                        host.counters.alarms_dropped.fetch_add(1, Ordering::Relaxed);
                        class.actor_metrics.alarm_dropped();
                        ("dropped", Some(*attempts))
                    }
                    AlarmOutcome::CommitFailed(_) => ("failed", None),
                };
                host.receipt(
                    &cell,
                    &class,
                    TurnKind::Alarm,
                    report,
                    TurnNotes {
                        outcome: Some(label),
                        reason: Some(reason),
                        attempt,
                        dispatch: Some(dispatch),
                        ..Default::default()
                    },
                    started,
                    Instant::now(),
                );
            },
        )
        .await;
        match result {
            Ok(()) if live.gate.is_none() => {
                // A turn could not commit and the actor was reset: its
                // timers are as they were before that turn, and nothing
                // reads them again until it is dispatched again, later
                // after each such failure in a row.
                self.after_turn(&cell, &live, true);
                let failures = cell.alarm_commit_failures.fetch_add(1, Ordering::Relaxed) + 1;
                let at = commit_retry_at(now_ms(), failures);
                tracing::warn!(actor = %address, failures, retry_in_ms = at - now_ms(), "an alarm turn could not commit; its timers are dispatched again later");
                self.timers.set(&address, Some(at));
            }
            Ok(()) => {
                cell.alarm_commit_failures.store(0, Ordering::Relaxed);
                self.after_turn(&cell, &live, true);
                crate::mailbox::compact(&address, live.gate.clone()).await;
                // Held until its commits settled: an actor leaves memory
                // (and its WAL may be checkpointed) only once what it
                // committed is durable where its placement keeps it.
                if let Some(settled) = live.gate.as_ref().and_then(|g| g.settled()) {
                    let _ = settled.await;
                }
            }
            Err(why) => {
                tracing::warn!(actor = %address, error = %why, "cannot wake an actor for its timers; retrying");
                self.timers.set(&address, Some(now_ms() + WAKE_RETRY_MS));
            }
        }
        drop(live);
        drop(claim);
    }
}

/// Alarm deliveries running at once, and how many may.
///
/// Each delivery runs turns on the same workers as requests. Unbounded, an
/// actor whose alarm re-arms itself for "now" is due again as soon as its
/// turn ends, so a thousand of them kept a thousand deliveries queued
/// beside every request: measured on a release build, a worker's answer
/// went from 0.6 ms to 111 ms, and grew with the number of such actors.
/// Bounded, a request waits behind at most `max_concurrent_alarms` of them
/// whatever their number, and they share those places in deadline order.
#[derive(Default)]
pub(crate) struct Deliveries {
    running: AtomicUsize,
    /// The most that ran at once since start: what `/actors` shows, so an
    /// operator sees whether the bound is reached.
    peak: AtomicUsize,
    max: AtomicUsize,
}

impl Deliveries {
    /// Sets the bound (`max_concurrent_alarms`); running deliveries finish.
    pub(crate) fn set_max(&self, max: usize) {
        self.max.store(max.max(1), Ordering::Relaxed);
    }

    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    pub(crate) fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Places free now. Only the dispatcher starts deliveries, so what it
    /// reads here it may start.
    fn free(&self) -> usize {
        self.max().saturating_sub(self.running())
    }
}

/// One running delivery's place, given back (and the dispatcher woken to
/// fill it) however the delivery ends.
struct Place(Arc<ActorHost>);

impl Place {
    fn take(host: &Arc<ActorHost>) -> Place {
        let d = &host.deliveries;
        let now = d.running.fetch_add(1, Ordering::Relaxed) + 1;
        d.peak.fetch_max(now, Ordering::Relaxed);
        Place(host.clone())
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.deliveries.running.fetch_sub(1, Ordering::Relaxed);
        self.0.timers.poke();
    }
}

/// The timer dispatcher: sleeps until the earliest deadline, then hands
/// each due actor to a delivery task of its own, as many as there are
/// free places.
pub(crate) async fn dispatch(host: std::sync::Weak<ActorHost>) {
    loop {
        let Some(h) = host.upgrade() else { return };
        let now = now_ms();
        for actor in h.timers.take_due(now, h.deliveries.free()) {
            let place = Place::take(&h);
            tokio::spawn(async move {
                place.0.clone().deliver(actor).await;
                drop(place);
            });
        }
        // With no place free, the next look is when a delivery ends (it
        // pokes the index), not at a deadline that has already passed.
        let sleep_ms = match h.timers.earliest() {
            _ if h.deliveries.free() == 0 => MAX_DISPATCH_SLEEP_MS,
            Some(at) => (at - now_ms()).clamp(0, MAX_DISPATCH_SLEEP_MS),
            None => MAX_DISPATCH_SLEEP_MS,
        };
        let changed = async {
            h.timers.changed().await;
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(sleep_ms as u64)) => {}
            _ = changed => {}
        }
    }
}
