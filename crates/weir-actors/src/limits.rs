//! The limits of actor classes, declared once like the runtime's
//! (`weir_runtime::limit_table!`) and set from the same `[limits]` table.

use std::time::Duration;

use weir_runtime::limit_table;
use weir_runtime::limits::{MAX_DURATION_MS, MAX_QUEUED};

/// Events that may wait for one actor: an actor runs one turn at a time, so
/// a hot actor's queue is its latency; 128 turns of ~100 µs is ~13 ms of
/// waiting, past which refusing fast (503 `actor_overloaded`) serves
/// callers better than queueing.
pub const DEFAULT_ACTOR_MAX_QUEUED: u64 = 128;

/// Actors an app may have on disk, by default. Every name a caller uses
/// makes one (an actor route lets any client name one), and each is a
/// database file with its WAL: about 24 KiB at the least (measured: 5,000
/// fresh chat rooms took 120 MB). A million is more than a keyed app of one
/// server is known to need, and bounds what made-up names can cost at about
/// 24 GB and a million files.
pub const DEFAULT_MAX_ACTORS: u64 = 1_000_000;

/// What all of an app's actors (their databases and their storage slots)
/// may take on this server's disk together, by default. `max_actors` (a
/// million) times `max_database_bytes` (512 MiB) or `max_slot_bytes`
/// (1 GiB) bounds nothing a disk has; 32 GiB holds
/// a million fresh actors (about 24 KiB each with their WAL files) or 64
/// full ones, and keeps one app from filling a disk the server's other
/// apps write to.
pub const DEFAULT_MAX_ACTOR_STORAGE_BYTES: u64 = 32 << 30;

/// Alarm deliveries an app runs at once, by default: as many as a worker
/// app has lanes (`max_concurrent`), so background turns can keep the
/// workers as busy as requests can, and never queue more beside a request.
/// An alarm that waits on something slow (an outbound call) holds its
/// place while it waits; raise it for apps whose alarms mostly wait.
pub const DEFAULT_MAX_CONCURRENT_ALARMS: u64 = 32;

limit_table! {
    /// The limits of the actor classes of a server.
    pub struct ActorLimits {
        actor_idle: Duration = "actor_idle_ms" {
            default: 10_000, range: 1, MAX_DURATION_MS, unit: Millis,
            meaning: "an actor with no event in flight and no timer due is hibernated after this long",
        },
        actor_max_queued: usize = "actor_max_queued" {
            default: DEFAULT_ACTOR_MAX_QUEUED, range: 1, MAX_QUEUED, unit: Count,
            meaning: "events waiting for one actor's turn; more are refused with actor_overloaded",
        },
        max_live_actors: usize = "max_live_actors" {
            default: 100_000, range: 16, 10_000_000, unit: Count,
            meaning: "actors in memory at once (also bounded by the open-file limit: 2 files each); beyond it the least recently used idle ones hibernate",
        },
        max_actors: usize = "max_actors" {
            default: DEFAULT_MAX_ACTORS, range: 1, 1_000_000_000, unit: Count,
            meaning: "actors with a database on this server, all classes of the app together; a call that would make one more is refused with too_many_actors, and existing actors are never refused",
        },
        max_actor_storage_bytes: u64 = "max_actor_storage_bytes" {
            default: DEFAULT_MAX_ACTOR_STORAGE_BYTES, range: 64 << 10, 1 << 50, unit: Bytes,
            meaning: "disk taken by all the app's actors on this server together: their database and WAL files and their storage slots; once reached, a write that needs a new page fails with database_full and keeps nothing, a slot write fails with insufficient-space, deletes still run, and a new actor is refused with actor_storage_full",
        },
        max_concurrent_alarms: usize = "max_concurrent_alarms" {
            default: DEFAULT_MAX_CONCURRENT_ALARMS, range: 1, 65_536, unit: Count,
            meaning: "actors whose due timers are being delivered at once, all classes of the app together; due actors past it wait their turn, earliest deadline first",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_table_says_what_the_code_does() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .unwrap();
        let wrong = weir_runtime::limit_table::readme_disagreements(ActorLimits::SPECS, &readme);
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn names_do_not_collide_with_the_runtimes() {
        for spec in ActorLimits::SPECS {
            assert!(
                weir_runtime::limits::spec(spec.name).is_err(),
                "{}",
                spec.name
            );
        }
    }
}
