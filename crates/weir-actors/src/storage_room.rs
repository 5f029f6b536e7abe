//! The storage room: the bytes all of an app's actors take on this
//! server's disk together (their databases and their storage slots),
//! against `max_actor_storage_bytes`.
//!
//! `max_database_bytes` bounds one database, `max_slot_bytes` one actor's
//! storage slots and `max_actors` the number of actors; without a bound on
//! the whole, an app that makes many actors and fills each could fill the
//! disk that every other app on the server writes to. The room counts
//! what each actor's files (its database and its WAL) take: at start,
//! when it wakes, after each turn of it that wrote, and when it closes. A turn's WAL frames are on disk before
//! anything counts them: the new pages among them are bounded (below), the
//! pages it rewrites are not, and are counted when the turn ends. SQLite
//! checkpoints a WAL past 1,000 pages at a commit, and the file is cut
//! back at its next write. What the layer above keeps in an actor's
//! storage slots is counted as that layer counts it (`max_slot_bytes`:
//! bytes, and 4 KiB per file, directory and link): found at start, and
//! then taken from the room before it is written
//! ([`StorageRoom::take_slot_bytes`]) and given back when it is removed.
//!
//! Invariants owned here:
//! - a live actor's database is bounded at the pages it has plus what the
//!   room has free, whenever that is less than `max_database_bytes`
//!   ([`StorageRoom::bound_for`]): once the room is full, a write that
//!   needs a new page is refused as at `max_database_bytes` (named
//!   `database_full`, nothing of it kept), while reads, deletes and writes
//!   into pages the database already has (those its deletes freed
//!   included) go on; deleting an actor gives back what its files took;
//! - actors that write at once may together pass the bound by at most
//!   what was free when each of them was bounded (each is bounded at the
//!   room's free bytes, not at a share of them); the first turn after
//!   that finds the room full;
//! - a storage slot grows only by bytes the room has free: growth that
//!   does not fit is refused whole, so slots never pass the bound, and
//!   the room they take is the room the databases cannot;
//! - a new actor is made only while the room has room for its first
//!   pages ([`StorageRoom::has_room`]); an actor that exists always
//!   opens;
//! - every change of an actor's measure moves the count by the
//!   difference, so the count follows the disk as actors wake, write,
//!   hibernate and are deleted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use weir_store::actor::{ActorDb, ActorStoreError};

/// Free bytes the room must have for a new actor to be made. A new
/// actor's database starts with Weir's schema, about 12 KiB of pages;
/// with this much free, making one never passes the bound.
pub const NEW_ACTOR_BYTES: u64 = 64 << 10;

/// The bytes of an actor database's files on disk: the database and its
/// WAL (0 for a file that is not there).
pub fn files_bytes(path: &Path) -> u64 {
    [PathBuf::from(path), wal_path(path)]
        .iter()
        .map(|file| std::fs::metadata(file).map_or(0, |m| m.len()))
        .sum()
}

fn wal_path(path: &Path) -> PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// Adds `bytes` to `counter` if the sum stays at most `max`, else nothing
/// (false): a reservation under a bound, all or none. Nothing always fits
/// (a counter others passed the bound on still takes no growth).
pub fn take_within(counter: &AtomicU64, bytes: u64, max: u64) -> bool {
    bytes == 0
        || counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                n.checked_add(bytes).filter(|&total| total <= max)
            })
            .is_ok()
}

/// Takes `bytes` off `counter`, never below zero; what it took.
pub fn give_back(counter: &AtomicU64, bytes: u64) -> u64 {
    let held = counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            Some(n.saturating_sub(bytes))
        })
        .unwrap_or_else(|n| n);
    held.min(bytes)
}

/// What the actors of one app take on disk together, and the bound.
#[derive(Debug)]
pub struct StorageRoom {
    /// Everything counted: databases and storage slots.
    used: AtomicU64,
    /// The part of `used` that storage slots hold.
    slots: AtomicU64,
    max: AtomicU64,
}

impl Default for StorageRoom {
    fn default() -> Self {
        StorageRoom {
            used: AtomicU64::new(0),
            slots: AtomicU64::new(0),
            max: AtomicU64::new(u64::MAX),
        }
    }
}

impl StorageRoom {
    /// Sets the bound (`max_actor_storage_bytes`).
    pub fn set_max(&self, max: u64) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// Bytes counted, and the bound.
    pub fn usage(&self) -> (u64, u64) {
        (
            self.used.load(Ordering::Relaxed),
            self.max.load(Ordering::Relaxed),
        )
    }

    /// Bytes left under the bound.
    pub fn free(&self) -> u64 {
        let (used, max) = self.usage();
        max.saturating_sub(used)
    }

    /// True while a new actor may be made ([`NEW_ACTOR_BYTES`] free).
    pub fn has_room(&self) -> bool {
        self.free() >= NEW_ACTOR_BYTES
    }

    /// Moves the count from what an actor took (`from`) to what it takes
    /// now (`to`).
    pub fn moved(&self, from: u64, to: u64) {
        if to >= from {
            self.used.fetch_add(to - from, Ordering::Relaxed);
        } else {
            give_back(&self.used, from - to);
        }
    }

    /// Bytes the storage slots hold (a part of [`StorageRoom::usage`]).
    pub fn slot_bytes(&self) -> u64 {
        self.slots.load(Ordering::Relaxed)
    }

    /// Counts what storage slots already hold (found on disk at start).
    pub fn found_slot_bytes(&self, bytes: u64) {
        self.used.fetch_add(bytes, Ordering::Relaxed);
        self.slots.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Takes `bytes` for a storage slot to grow by, all of them if they
    /// fit under the bound, else none (false).
    pub fn take_slot_bytes(&self, bytes: u64) -> bool {
        let took = take_within(&self.used, bytes, self.max.load(Ordering::Relaxed));
        if took {
            self.slots.fetch_add(bytes, Ordering::Relaxed);
        }
        took
    }

    /// Gives back what a storage slot no longer holds.
    pub fn give_slot_bytes(&self, bytes: u64) {
        // Only what the slots were counted for leaves the whole.
        give_back(&self.used, give_back(&self.slots, bytes));
    }

    /// The bound for a live database of `footprint` bytes of pages whose
    /// own bound is `max_database_bytes`: what it has plus what the room
    /// has free, if that is less.
    pub fn bound_for(&self, footprint: u64, max_database_bytes: u64) -> u64 {
        footprint
            .saturating_add(self.free())
            .min(max_database_bytes)
    }
}

/// A live actor's place in the room: the bytes of its files when last
/// counted, and the bound its connection has now. Made when the actor's
/// database opens; counted again after each turn that wrote and when it
/// closes.
#[derive(Debug)]
pub struct RoomShare {
    room: Arc<StorageRoom>,
    path: PathBuf,
    max_database_bytes: u64,
    /// Its files (database and WAL) when last counted.
    counted: u64,
    /// The bound on its pages its connection has now.
    bound: u64,
    /// Its pages when the room first bounded the current turn below its
    /// own bound: the turn may grow from there by what is free, however
    /// many writes it makes.
    turn_pages: Option<u64>,
}

impl RoomShare {
    /// The share of an actor whose database at `path` was just opened as
    /// `db`; `files` is what the room counted for it before (its files as
    /// they were before the open, 0 for a new actor).
    pub fn open(
        room: Arc<StorageRoom>,
        path: PathBuf,
        db: &mut ActorDb,
        files: u64,
        max_database_bytes: u64,
    ) -> Result<RoomShare, ActorStoreError> {
        let counted = db.files_bytes()?;
        room.moved(files, counted);
        let mut share = RoomShare {
            room,
            path,
            max_database_bytes,
            counted,
            bound: 0,
            turn_pages: None,
        };
        share.bound(db)?;
        Ok(share)
    }

    /// Bounds the database's pages at what the room leaves it, before a
    /// write: its pages when the turn began writing plus what the room
    /// has free now, when that is less than its own bound. While the room
    /// has more free than that, this reads nothing and runs no pragma
    /// (and a turn grows by less than was free when it began).
    pub fn bound(&mut self, db: &mut ActorDb) -> Result<(), ActorStoreError> {
        let free = self.room.free();
        let bound = if free >= self.max_database_bytes {
            self.max_database_bytes
        } else {
            let pages = match self.turn_pages {
                Some(pages) => pages,
                None => *self.turn_pages.insert(db.footprint_bytes()?),
            };
            self.room.bound_for(pages, self.max_database_bytes)
        };
        if bound != self.bound {
            db.set_max_bytes(bound)?;
            self.bound = bound;
        }
        Ok(())
    }

    /// Counts its files again, after a turn (or a write outside one) that
    /// may have changed them: read from the files the open database holds.
    pub fn recount(&mut self, db: &ActorDb) {
        self.turn_pages = None;
        if let Ok(now) = db.files_bytes() {
            self.moved_to(now);
        }
    }

    fn moved_to(&mut self, now: u64) {
        self.room.moved(self.counted, now);
        self.counted = now;
    }
}

impl Drop for RoomShare {
    fn drop(&mut self) {
        // The database has closed: its files are what it takes now (none,
        // if it was deleted meanwhile).
        self.moved_to(files_bytes(&self.path));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_follows_moves_and_bounds_follow_the_count() {
        let room = StorageRoom::default();
        room.set_max(NEW_ACTOR_BYTES + 1000);
        assert!(room.has_room());
        room.moved(0, NEW_ACTOR_BYTES + 1);
        assert!(!room.has_room(), "a new actor needs NEW_ACTOR_BYTES free");
        room.moved(NEW_ACTOR_BYTES + 1, 0);
        room.set_max(1000);
        room.moved(0, 600);
        assert_eq!(room.usage(), (600, 1000));
        // A database of 100 bytes may grow by what is free (400), or up to
        // its own bound when that is less.
        assert_eq!(room.bound_for(100, 10_000), 500);
        assert_eq!(room.bound_for(100, 300), 300);
        room.moved(100, 500);
        assert_eq!(room.free(), 0);
        // Full: no growth, but what a database has it keeps.
        assert_eq!(room.bound_for(500, 10_000), 500);
        // Passed by writers at once: still no growth, and no underflow.
        room.moved(0, 300);
        assert_eq!(room.usage(), (1300, 1000));
        assert_eq!(room.bound_for(200, 10_000), 200);
        // A deletion gives back what it took, never below zero.
        room.moved(1000, 0);
        assert_eq!(room.usage(), (300, 1000));
        room.moved(5000, 0);
        assert_eq!(room.usage(), (0, 1000));
    }

    #[test]
    fn slots_take_only_what_is_free_and_the_databases_see_it_taken() {
        let room = StorageRoom::default();
        room.set_max(1000);
        room.found_slot_bytes(100);
        room.moved(0, 300);
        assert_eq!((room.usage(), room.slot_bytes()), ((400, 1000), 100));
        assert!(room.take_slot_bytes(500));
        // All or nothing: 101 does not fit in 100.
        assert!(!room.take_slot_bytes(101));
        assert_eq!((room.usage(), room.slot_bytes()), ((900, 1000), 600));
        // The databases may grow by what the slots left.
        assert_eq!(room.bound_for(300, 10_000), 400);
        room.give_slot_bytes(600);
        assert_eq!((room.usage(), room.slot_bytes()), ((300, 1000), 0));
        // Never below zero, neither part.
        room.give_slot_bytes(50);
        assert_eq!((room.usage(), room.slot_bytes()), ((300, 1000), 0));
        assert!(room.take_slot_bytes(0));
    }

    #[test]
    fn files_are_the_database_and_its_wal() {
        let dir = weir_scratch::dir("storage-room-files");
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("a.sqlite3");
        assert_eq!(files_bytes(&db), 0);
        std::fs::write(&db, [0u8; 100]).unwrap();
        std::fs::write(dir.join("a.sqlite3-wal"), [0u8; 20]).unwrap();
        std::fs::write(dir.join("a.sqlite3-shm"), [0u8; 7]).unwrap();
        assert_eq!(files_bytes(&db), 120);
    }
}
