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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// What each file, directory or link counts besides its bytes: one block
/// of a common file system, which is about what its inode and directory
/// entry cost the disk.
pub const ENTRY_BYTES: u64 = 4096;

/// One owner's storage slots, counted.
#[derive(Debug)]
pub struct SlotQuota {
    used: AtomicU64,
    max: u64,
}

impl SlotQuota {
    pub fn new(used: u64, max: u64) -> SlotQuota {
        SlotQuota {
            used: AtomicU64::new(used),
            max,
        }
    }

    /// Takes `bytes` from what is left, or nothing if they do not fit.
    pub fn reserve(&self, bytes: u64) -> bool {
        bytes == 0
            || self
                .used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                    used.checked_add(bytes).filter(|&total| total <= self.max)
                })
                .is_ok()
    }

    /// Gives `bytes` back.
    pub fn release(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
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

/// The quotas of the owners that have a process running, by the owner's
/// directory of durable slots: every process of one owner counts against
/// the same one.
#[derive(Default)]
pub struct SlotQuotas {
    live: Mutex<HashMap<PathBuf, Weak<SlotQuota>>>,
}

impl SlotQuotas {
    /// The quota of the owner whose durable slots are under `owner_dir`:
    /// the one its running processes share, or a new one measured from
    /// the disk (blocking: call it off the async workers).
    pub fn for_owner(&self, owner_dir: &Path, max: u64) -> Arc<SlotQuota> {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(quota) = live.get(owner_dir).and_then(Weak::upgrade) {
            return quota;
        }
        live.retain(|_, q| q.strong_count() > 0);
        // Each slot's contents; its own directory does not count.
        let used = std::fs::read_dir(owner_dir)
            .map(|slots| {
                slots
                    .flatten()
                    .filter(|slot| slot.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|slot| measure(&slot.path()))
                    .sum()
            })
            .unwrap_or(0);
        let quota = Arc::new(SlotQuota::new(used, max));
        live.insert(owner_dir.to_path_buf(), Arc::downgrade(&quota));
        quota
    }

    /// The quota of the owner under `owner_dir`, if a process of it runs.
    pub fn running(&self, owner_dir: &Path) -> Option<Arc<SlotQuota>> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.get(owner_dir).and_then(Weak::upgrade)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_bytes_never_pass_the_bound() {
        let quota = SlotQuota::new(10, 100);
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
        let quotas = SlotQuotas::default();
        let first = quotas.for_owner(&owner, 1 << 20);
        assert_eq!(first.used(), 2 * ENTRY_BYTES + 1000);
        assert!(first.reserve(7));
        let second = quotas.for_owner(&owner, 1 << 20);
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(second.used(), 2 * ENTRY_BYTES + 1007);
        drop((first, second));
        assert!(quotas.running(&owner).is_none());
        // Measured again once nobody holds it.
        assert_eq!(
            quotas.for_owner(&owner, 1 << 20).used(),
            2 * ENTRY_BYTES + 1000
        );
    }
}
