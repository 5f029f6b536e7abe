//! The timer pacemaker: keeps tokio's timer driver from being woken for
//! each call's deadline.
//!
//! Invariant owned here: while a server serves, some timer of its
//! runtime always expires within [`PACEMAKER_INTERVAL`]. tokio's timer
//! driver parks until the earliest timer it knows of, and a timer
//! registered earlier than that wakes it (an `eventfd` write, then a
//! parked worker thread wakes, finds nothing to do and parks again).
//! Calls end long before their deadlines, so when the driver parks there
//! is usually no call timer left, only hyper's header-read timers
//! (`header_read_timeout_ms` away): the next call's timer
//! (`event_limit_ms` away, shorter) then woke it. Measured under hello's
//! load, that was about one request in twenty, and a fifth of all
//! context switches (bench/RESULTS.md). With the pacemaker's timer
//! always nearer, a call's timer is almost never the earliest. Its own
//! cost is [`PACEMAKER_INTERVAL`]'s wakes, a few per second.
//!
//! Deadlines nearer than the interval still wake the driver as before:
//! the pacemaker makes nothing later.

use std::time::Duration;

/// How often the pacemaker's timer fires: shorter than the default
/// `event_limit_ms` (1 s), so that calls under the default limits never
/// have the earliest timer; long enough that an idle server's wakes for
/// it cost nothing measurable.
pub const PACEMAKER_INTERVAL: Duration = Duration::from_millis(250);

/// Runs the pacemaker until the returned task is aborted or the runtime
/// stops. Call it from inside the runtime that serves.
pub fn start() -> tokio::task::JoinHandle<()> {
    tokio::spawn(async {
        let mut beat = tokio::time::interval(PACEMAKER_INTERVAL);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            beat.tick().await;
        }
    })
}
