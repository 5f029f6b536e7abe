//! What an actor's storage slots may hold on disk.
//!
//! Invariant owned here: the files, directories and links in one owner's
//! storage slots — its durable slots and the ephemeral slots of its running
//! processes — never count more than `max_slot_bytes` together. A file
//! counts its length (a sparse file its apparent length: holes are not
//! free here), and each file, directory and link counts [`ENTRY_BYTES`]
//! more, so that empty files and deep trees are not free either; a slot's
//! own directory, which Weir makes, does not count. The count
//! is measured from the disk when an owner's first process starts, and
//! then kept by every change its processes make ([`crate::slot_filesystem`]).
//! Growth is reserved before it is written: a write that would pass the
//! bound fails with `insufficient-space` (ENOSPC to the program) and
//! writes nothing.
//!
//! Every owner's slots also take from the app's storage room
//! (`max_actor_storage_bytes`, [`weir_actors::StorageRoom`]), which their
//! databases share: growth is reserved from both, or from neither. The
//! room counts every owner's durable slots from the disk when the slots
//! open ([`Slots`](crate::storage_slot::Slots), at the app's start), and
//! then by the same reservations and releases as each owner's quota.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use weir_actors::StorageRoom;
use weir_actors::storage_room::{give_back, take_within};

/// What each file, directory or link counts besides its bytes: one block
/// of a common file system, which is about what its inode and directory
/// entry cost the disk.
pub const ENTRY_BYTES: u64 = 4096;

/// One owner's storage slots, counted.
#[derive(Debug)]
pub struct SlotQuota {
    used: AtomicU64,
    max: u64,
    /// The app's room, which every owner's slots share with the actors'
    /// databases.
    room: Arc<StorageRoom>,
}

impl SlotQuota {
    pub fn new(used: u64, max: u64, room: Arc<StorageRoom>) -> SlotQuota {
        SlotQuota {
            used: AtomicU64::new(used),
            max,
            room,
        }
    }

    /// Takes `bytes` from what is left to the owner and from the app's
    /// room, or nothing if they do not fit in both.
    pub fn reserve(&self, bytes: u64) -> bool {
        if !take_within(&self.used, bytes, self.max) {
            return false;
        }
        if !self.room.take_slot_bytes(bytes) {
            give_back(&self.used, bytes);
            return false;
        }
        true
    }

    /// Gives `bytes` back, to the owner and to the app's room.
    pub fn release(&self, bytes: u64) {
        give_back(&self.used, bytes);
        self.room.give_slot_bytes(bytes);
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

/// What the tree under `dir` counts (not `dir` itself; nothing when it
/// does not exist). Links are counted, never followed.
pub fn measure(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut total = 0;
    for entry in entries.flatten() {
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        total += ENTRY_BYTES;
        if meta.is_dir() {
            total += measure(&entry.path());
        } else if meta.is_file() {
            total += meta.len();
        }
    }
    total
}

/// What the slots under one owner's directory count: each slot's
/// contents, its own directory not.
pub(crate) fn owner_bytes(owner_dir: &Path) -> u64 {
    subdirectories(owner_dir).map(|slot| measure(&slot)).sum()
}

/// The directories right under `dir` (links not followed).
fn subdirectories(dir: &Path) -> impl Iterator<Item = PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .map(|entry| entry.path())
}

/// What every owner's durable slots under `durable` (`<class>/<owner>/<slot>`)
/// count together, as their quotas count them.
pub fn measure_durable(durable: &Path) -> u64 {
    subdirectories(durable)
        .flat_map(|class| subdirectories(&class).collect::<Vec<_>>())
        .map(|owner| owner_bytes(&owner))
        .sum()
}

/// The quotas of the owners that have a process running, by the owner's
/// directory of durable slots: every process of one owner counts against
/// the same one. All of them take from the app's storage room.
pub struct SlotQuotas {
    live: Mutex<HashMap<PathBuf, Weak<SlotQuota>>>,
    room: Arc<StorageRoom>,
}

impl SlotQuotas {
    pub fn new(room: Arc<StorageRoom>) -> SlotQuotas {
        SlotQuotas {
            live: Mutex::default(),
            room,
        }
    }

    /// The quota of the owner whose durable slots are under `owner_dir`:
    /// the one its running processes share, or a new one measured from
    /// the disk (blocking: call it off the async workers).
    pub fn for_owner(&self, owner_dir: &Path, max: u64) -> Arc<SlotQuota> {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(quota) = live.get(owner_dir).and_then(Weak::upgrade) {
            return quota;
        }
        live.retain(|_, q| q.strong_count() > 0);
        // The room counts these bytes already (found at start, or taken
        // when they were written).
        let used = owner_bytes(owner_dir);
        let quota = Arc::new(SlotQuota::new(used, max, self.room.clone()));
        live.insert(owner_dir.to_path_buf(), Arc::downgrade(&quota));
        quota
    }

    /// Counts `bytes` an owner's slots no longer hold out of its quota,
    /// if a process of it runs, and always out of the app's room.
    pub fn released(&self, owner_dir: &Path, bytes: u64) {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        match live.get(owner_dir).and_then(Weak::upgrade) {
            Some(quota) => quota.release(bytes),
            None => self.room.give_slot_bytes(bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(max: u64) -> Arc<StorageRoom> {
        let room = Arc::new(StorageRoom::default());
        room.set_max(max);
        room
    }

    #[test]
    fn reserved_bytes_never_pass_the_bound() {
        let quota = SlotQuota::new(10, 100, room(u64::MAX));
        assert!(quota.reserve(90));
        assert!(!quota.reserve(1));
        assert_eq!(quota.used(), 100);
        quota.release(50);
        assert!(!quota.reserve(51));
        assert!(quota.reserve(50));
        quota.release(1000);
        assert_eq!(quota.used(), 0);
        assert!(!quota.reserve(u64::MAX));
    }

    #[test]
    fn growth_takes_from_the_owner_and_the_room_or_from_neither() {
        let room = room(150);
        room.moved(0, 50); // the actors' databases
        let a = SlotQuota::new(0, 100, room.clone());
        let b = SlotQuota::new(0, 100, room.clone());
        assert!(a.reserve(60));
        // b's own quota has room for 60, the app's room not: nothing of
        // it is taken from either.
        assert!(!b.reserve(60));
        assert_eq!((b.used(), room.usage().0, room.slot_bytes()), (0, 110, 60));
        assert!(b.reserve(40));
        assert_eq!(room.free(), 0);
        // What one owner gives back, another may take.
        a.release(60);
        assert!(b.reserve(60));
        assert_eq!((a.used(), b.used(), room.slot_bytes()), (0, 100, 100));
    }

    #[test]
    fn a_tree_counts_its_bytes_and_its_entries_and_one_owner_has_one_quota() {
        let dir = weir_scratch::dir("slot-measure");
        let owner = dir.join("owner");
        std::fs::create_dir_all(owner.join("a/b")).unwrap();
        std::fs::write(owner.join("a/b/f"), vec![1u8; 1000]).unwrap();
        std::fs::write(owner.join("empty"), b"").unwrap();
        std::os::unix::fs::symlink("/etc", owner.join("out")).unwrap();
        // a, a/b, a/b/f, empty, out: five entries and 1,000 bytes; the
        // link is not followed.
        assert_eq!(measure(&owner), 5 * ENTRY_BYTES + 1000);
        assert_eq!(measure(&dir.join("none")), 0);

        // As an owner's directory, `a` is a slot: its own entry does not
        // count, and neither do `empty` and `out`, which are no slots.
        let room = room(u64::MAX);
        let quotas = SlotQuotas::new(room.clone());
        let first = quotas.for_owner(&owner, 1 << 20);
        assert_eq!(first.used(), 2 * ENTRY_BYTES + 1000);
        assert!(first.reserve(7));
        let second = quotas.for_owner(&owner, 1 << 20);
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(second.used(), 2 * ENTRY_BYTES + 1007);
        assert_eq!(room.slot_bytes(), 7, "the room counted the rest before");
        quotas.released(&owner, 3);
        assert_eq!(
            (second.used(), room.slot_bytes()),
            (2 * ENTRY_BYTES + 1004, 4)
        );
        drop((first, second));
        // With no process of the owner running, only the room counts.
        quotas.released(&owner, 4);
        assert_eq!(room.slot_bytes(), 0);
        // Measured again once nobody holds it.
        assert_eq!(
            quotas.for_owner(&owner, 1 << 20).used(),
            2 * ENTRY_BYTES + 1000
        );
    }

    #[test]
    fn the_durable_slots_of_every_owner_count_as_their_quotas_count_them() {
        let durable = weir_scratch::dir("slot-durable");
        for (owner, bytes) in [("c1/o1", 10), ("c1/o2", 20), ("c2/o1", 30)] {
            let slot = durable.join(owner).join("slot");
            std::fs::create_dir_all(&slot).unwrap();
            std::fs::write(slot.join("f"), vec![0u8; bytes]).unwrap();
        }
        // A file where a class or owner directory belongs is no slot.
        std::fs::write(durable.join("c1/stray"), b"x").unwrap();
        std::fs::write(durable.join("stray"), b"x").unwrap();
        assert_eq!(measure_durable(&durable), 3 * ENTRY_BYTES + 60);
        assert_eq!(
            measure_durable(&durable),
            ["c1/o1", "c1/o2", "c2/o1"]
                .iter()
                .map(|o| owner_bytes(&durable.join(o)))
                .sum::<u64>()
        );
        assert_eq!(measure_durable(&durable.join("none")), 0);
    }
}
