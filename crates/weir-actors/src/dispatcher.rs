//! The dispatcher: hands every actor whose timer is due to a delivery of
//! its own, which runs the due alarms as turns.
//!
//! Invariants owned here: one task watches the whole timer index and
//! sleeps until its earliest deadline (or until the index changes); an
//! actor is delivered by one task at a time (taking it from the index is
//! the hand-off), and a delivery that cannot wake the actor puts it back
//! to be tried after `WAKE_RETRY_MS`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::address::ActorAddress;
use crate::host::ActorHost;
use crate::placement::Location;
use crate::receipts::{TurnKind, TurnNotes};
use crate::timers::{MAX_DISPATCH_SLEEP_MS, WAKE_RETRY_MS, now_ms};
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
            Ok(()) => {
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

/// The timer dispatcher: sleeps until the earliest deadline, then hands
/// each due actor to a delivery task of its own.
pub(crate) async fn dispatch(host: std::sync::Weak<ActorHost>) {
    loop {
        let Some(h) = host.upgrade() else { return };
        let now = now_ms();
        for actor in h.timers.take_due(now) {
            tokio::spawn(h.clone().deliver(actor));
        }
        let sleep_ms = h.timers.earliest().map_or(MAX_DISPATCH_SLEEP_MS, |at| {
            (at - now_ms()).clamp(0, MAX_DISPATCH_SLEEP_MS)
        });
        let changed = async {
            h.timers.changed().await;
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(sleep_ms as u64)) => {}
            _ = changed => {}
        }
    }
}
