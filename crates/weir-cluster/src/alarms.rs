//! Orphaned alarms: actors whose timer is due while no live node owns them
//! (their owner died) are claimed by some live node and woken there; a
//! node also wakes the due actors it owns but does not hold (claimed for a
//! call whose turn never opened them). Owners of resident processes (their
//! launch journal has rows) whose node died are claimed the same way, at
//! once, and opened there, which takes their processes over.
//!
//! Invariant owned here: every actor's earliest timer is mirrored in its
//! owner row by the same fenced commit that set it, so a due alarm is
//! found whatever became of the node that set it; the claim that takes it
//! skips rows another node is claiming at that moment (`SKIP LOCKED`), and
//! the woken actor runs its due timers from its own restored storage, so a
//! timer fires at least once and under the usual retry rule; the journal
//! flag is mirrored by the same fenced commits, so an owner whose node
//! died is opened elsewhere within a sweep of that node's lease ending.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use weir_actors::ActorHost;

use crate::actors::parse_actor_key;
use crate::coordinator::DueObject;
use crate::ownership::Ownership;

/// Orphaned actors claimed in one sweep at most.
pub const SWEEP_BATCH: i64 = 256;

/// The shortest pause between sweeps.
pub const MIN_SWEEP_INTERVAL: Duration = Duration::from_millis(100);

/// The longest pause between sweeps: an orphaned alarm fires at most this
/// late, past the lease of the node that died.
pub const MAX_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Sweeps for orphaned due alarms every third of the lease (within the
/// bounds above) until `stop` turns true, waking each claimed actor of the
/// apps' hosts.
pub async fn sweep(
    ownership: Arc<Ownership>,
    actors: HashMap<String, Arc<ActorHost>>,
    stop: watch::Receiver<bool>,
) {
    sweep_with(ownership, stop, move |object| {
        parse_actor_key(&object.key)
            .and_then(|(app, class, name)| {
                let host = actors.get(app)?;
                let mut woken = Ok(());
                if object.journaled {
                    woken = host.take_over(class, name);
                }
                if let Some(at) = object.alarm_at {
                    woken = woken.and(host.wake_at(class, name, at));
                }
                Some(woken)
            })
            .is_some_and(|woken| woken.is_ok())
    })
    .await
}

/// [`sweep`], handing each claimed object to `wake` (false: this node has
/// nothing to wake it with).
pub async fn sweep_with(
    ownership: Arc<Ownership>,
    mut stop: watch::Receiver<bool>,
    wake: impl Fn(&DueObject) -> bool,
) {
    let interval = (ownership.lease().ttl() / 3).clamp(MIN_SWEEP_INTERVAL, MAX_SWEEP_INTERVAL);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = crate::lease::stopped(&mut stop) => return,
        }
        let Some(held) = ownership.lease().held() else {
            continue;
        };
        let due = match ownership
            .coordinator()
            .claim_due(held.session, SWEEP_BATCH)
            .await
        {
            Ok(due) => due,
            Err(e) => {
                tracing::warn!(error = %e, "cannot sweep for orphaned alarms");
                continue;
            }
        };
        for object in due {
            ownership.adopt(&object.key, object.state, held);
            let why = if object.journaled {
                "its resident processes"
            } else {
                "its due alarm"
            };
            if wake(&object) {
                tracing::info!(key = %object.key, epoch = object.state.epoch, why, "claimed an actor whose owner is gone");
            } else {
                tracing::warn!(key = %object.key, why, "claimed an orphaned actor this node has no class for");
            }
        }
    }
}
