//! The timer index: the next deadline of every actor, live or hibernated,
//! and the one dispatcher that wakes actors when their timers are due.
//!
//! Invariants owned here:
//! - the index holds at most one entry per actor — the earliest deadline in
//!   its database, refreshed after every turn — so one sorted set serves
//!   every actor and the dispatcher sleeps until exactly the next one;
//! - taking the due actors removes them from the index: each is delivered
//!   by one task, which puts the actor's next deadline back when it is done.
//!   A deadline that a handler sets for "now" is therefore seen by a later
//!   dispatch, never by the one that ran the handler.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

use crate::address::ActorAddress;

/// Milliseconds since the Unix epoch: the clock timers are kept in.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Longest the dispatcher sleeps without looking at the index again: a
/// bound on how late a wall-clock jump (suspend, NTP step) is noticed.
pub const MAX_DISPATCH_SLEEP_MS: i64 = 1_000;

/// Backoff before a due actor whose wake failed (its instance could not be
/// made, its database not opened) is tried again.
pub const WAKE_RETRY_MS: i64 = 1_000;

/// First wait before a failed alarm is delivered again; it doubles each
/// time.
pub const ALARM_RETRY_START_MS: i64 = 2_000;

/// Retries of one alarm after its first failed delivery; after the last,
/// the timer is dropped with an error receipt.
pub const ALARM_MAX_RETRIES: u32 = 6;

/// First wait before an actor whose alarm turn could not commit (the
/// actor was reset; its timers are as they were before the turn) is
/// dispatched again: long enough that a failure that repeats (a full disk,
/// a constraint the handler always breaks) does not spin, short enough
/// that one that passes costs little. It doubles with each such failure
/// in a row, up to [`ALARM_COMMIT_RETRY_MAX_MS`].
pub const ALARM_COMMIT_RETRY_START_MS: i64 = 1_000;

/// Longest wait between dispatches of an actor whose alarm turns keep
/// failing to commit: about a minute, as between the last alarm retries.
pub const ALARM_COMMIT_RETRY_MAX_MS: i64 = 64_000;

/// When an actor whose alarm turns failed to commit `failures` times in a
/// row is dispatched again.
pub fn commit_retry_at(now_ms: i64, failures: u32) -> i64 {
    let wait = ALARM_COMMIT_RETRY_START_MS * (1i64 << failures.saturating_sub(1).min(30));
    now_ms + wait.min(ALARM_COMMIT_RETRY_MAX_MS)
}

/// When attempt `attempt` (1-based) of a failed alarm is retried.
pub fn retry_at(now_ms: i64, attempt: u32) -> i64 {
    now_ms + ALARM_RETRY_START_MS * (1i64 << attempt.saturating_sub(1).min(30))
}

#[derive(Default)]
struct State {
    by_time: BTreeSet<(i64, ActorAddress)>,
    by_actor: HashMap<ActorAddress, i64>,
}

/// Every actor's next deadline.
#[derive(Default)]
pub struct TimerIndex {
    state: Mutex<State>,
    changed: Notify,
}

impl TimerIndex {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets (or clears) an actor's next deadline.
    pub fn set(&self, actor: &ActorAddress, next: Option<i64>) {
        self.set_locked(self.lock(), actor, next);
    }

    /// Brings an actor's deadline down to `at`, or indexes it at `at` if
    /// it has none; a later `at` changes nothing. What the timer ledger
    /// gives at a start: a bound no later than the actor's earliest timer,
    /// read while turns may already be setting exact values.
    pub fn lower(&self, actor: &ActorAddress, at: i64) {
        let state = self.lock();
        if state
            .by_actor
            .get(actor)
            .is_none_or(|&current| at < current)
        {
            self.set_locked(state, actor, Some(at));
        }
    }

    fn set_locked(
        &self,
        mut state: std::sync::MutexGuard<'_, State>,
        actor: &ActorAddress,
        next: Option<i64>,
    ) {
        let old = match next {
            Some(at) => state.by_actor.insert(actor.clone(), at),
            None => state.by_actor.remove(actor),
        };
        if let Some(old) = old {
            state.by_time.remove(&(old, actor.clone()));
        }
        if let Some(at) = next {
            state.by_time.insert((at, actor.clone()));
        }
        let earliest = state.by_time.first().map(|(t, _)| *t);
        drop(state);
        if next.is_some() && earliest == next {
            self.changed.notify_one();
        }
    }

    /// An actor's next deadline, as indexed.
    pub fn get(&self, actor: &ActorAddress) -> Option<i64> {
        self.lock().by_actor.get(actor).copied()
    }

    /// Removes and returns the actors due at `now_ms`, at most `most`,
    /// earliest deadline first; the rest stay due in the index.
    pub fn take_due(&self, now_ms: i64, most: usize) -> Vec<ActorAddress> {
        let mut state = self.lock();
        let mut due = Vec::new();
        while let Some((at, _)) = state.by_time.first() {
            if *at > now_ms || due.len() >= most {
                break;
            }
            let (_, actor) = state.by_time.pop_first().expect("first exists");
            state.by_actor.remove(&actor);
            due.push(actor);
        }
        due
    }

    /// Actors due at `now_ms` and not yet taken.
    pub fn due(&self, now_ms: i64) -> usize {
        self.lock()
            .by_time
            .iter()
            .take_while(|(at, _)| *at <= now_ms)
            .count()
    }

    /// Wakes the dispatcher to look at the index again (a delivery ended,
    /// so one more due actor may be taken).
    pub fn poke(&self) {
        self.changed.notify_one();
    }

    /// The earliest deadline of all.
    pub fn earliest(&self) -> Option<i64> {
        self.lock().by_time.first().map(|(t, _)| *t)
    }

    /// Actors with a pending timer.
    pub fn len(&self) -> usize {
        self.lock().by_actor.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until the index changes in a way that may move the earliest
    /// deadline closer.
    pub async fn changed(&self) {
        self.changed.notified().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(name: &str) -> ActorAddress {
        ActorAddress::new("c", name).unwrap()
    }

    #[test]
    fn one_entry_per_actor_and_due_ones_are_taken_once() {
        let index = TimerIndex::default();
        index.set(&actor("a"), Some(300));
        index.set(&actor("a"), Some(100));
        index.set(&actor("b"), Some(200));
        index.set(&actor("c"), Some(900));
        assert_eq!(index.len(), 3);
        assert_eq!(index.earliest(), Some(100));
        assert_eq!(index.due(250), 2);
        assert_eq!(index.take_due(250, 1), vec![actor("a")], "at most one");
        assert_eq!(index.due(250), 1);
        assert_eq!(index.take_due(250, 8), vec![actor("b")]);
        assert!(index.take_due(250, 8).is_empty(), "taken once");
        assert_eq!(index.due(250), 0);
        assert_eq!(index.earliest(), Some(900));
        index.set(&actor("c"), None);
        assert!(index.is_empty());
    }

    #[test]
    fn lowering_indexes_or_brings_forward_and_never_raises() {
        let index = TimerIndex::default();
        index.lower(&actor("a"), 500);
        assert_eq!(index.get(&actor("a")), Some(500));
        index.lower(&actor("a"), 800);
        assert_eq!(index.get(&actor("a")), Some(500), "never raised");
        index.lower(&actor("a"), 200);
        assert_eq!(index.get(&actor("a")), Some(200));
        assert_eq!(index.earliest(), Some(200));
        assert_eq!(index.len(), 1);
    }

    #[test]
    fn retries_back_off_from_two_seconds() {
        assert_eq!(retry_at(0, 1), 2_000);
        assert_eq!(retry_at(0, 2), 4_000);
        assert_eq!(retry_at(0, ALARM_MAX_RETRIES), 64_000);
    }
}
