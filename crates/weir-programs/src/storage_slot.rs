//! Storage slots: the one directory a resident process may be given,
//! preopened at `/data`, under `<data-dir>/slots`.
//!
//! Invariants owned here:
//! - a process names nothing else on the host: its slot is preopened
//!   through wasmtime-wasi's capability-based directory (no `..` above it,
//!   no absolute path, no symlink out), and without a slot it has no
//!   directory at all;
//! - a durable slot's directory is a function of its owner and name only
//!   (`durable/<class>/<digest of the actor's name>/<slot>`), so the same
//!   owner finds it again after a kill, a crash or a restart, and no other
//!   owner can reach it; it goes only when its owner removes it, or when
//!   the owner itself is deleted (see [`crate::holdings`]);
//! - an ephemeral slot is the process's own (`ephemeral/…-<pid>`) and is
//!   deleted when the process ends; what a crash left behind is deleted at
//!   the next start.
//! - what the durable slots hold when they open is counted in the app's
//!   storage room before any process writes (see [`crate::slot_quota`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use crate::process_table::Owner;
use weir_actors::StorageRoom;

use crate::slot_quota::{SlotQuotas, measure_durable};

/// The data dir's subdirectory of storage slots.
pub const SLOTS_DIR: &str = "slots";

/// Where a process sees its slot.
pub const SLOT_GUEST_PATH: &str = "/data";

/// Longest slot name: a directory name on every file system Weir runs on.
pub const MAX_SLOT_NAME_BYTES: usize = 64;

/// A valid slot name: 1 to 64 of `a-z`, `0-9`, `_`, `-`.
pub fn valid_name(name: &str) -> bool {
    (1..=MAX_SLOT_NAME_BYTES).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// The slots of one data dir.
pub struct Slots {
    root: PathBuf,
    /// What the owners with a running process hold in their slots.
    pub quotas: SlotQuotas,
}

impl Slots {
    /// Opens `<data-dir>/slots`, deleting the ephemeral slots a crash left
    /// and counting what the durable ones hold in the app's `room`
    /// (blocking: it reads every durable slot's tree).
    pub fn open(root: &Path, room: Arc<StorageRoom>) -> std::io::Result<Slots> {
        let ephemeral = root.join("ephemeral");
        match std::fs::remove_dir_all(&ephemeral) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::create_dir_all(&ephemeral)?;
        let durable = root.join("durable");
        std::fs::create_dir_all(&durable)?;
        room.found_slot_bytes(measure_durable(&durable));
        Ok(Slots {
            root: root.to_path_buf(),
            quotas: SlotQuotas::new(room),
        })
    }

    fn owner_key(owner: &Owner) -> String {
        // Actor names may hold any character: the directory is named by
        // their digest, never by the name itself.
        let digest = Sha256::digest(owner.name.as_bytes());
        digest[..16].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The directory of `owner`'s durable slots (not created).
    pub fn owner_dir(&self, owner: &Owner) -> PathBuf {
        self.root
            .join("durable")
            .join(&owner.class)
            .join(Self::owner_key(owner))
    }

    /// Removes `dir` — one of `owner`'s slots, or its whole directory of
    /// durable slots — and gives back to the owner's quota (if a process
    /// of it runs) and to the app's room what `count` says it held. True
    /// if it existed. Blocking.
    pub(crate) fn remove(
        &self,
        owner: &Owner,
        dir: &Path,
        count: impl Fn(&Path) -> u64,
    ) -> std::io::Result<bool> {
        let held = count(dir);
        let removed = std::fs::remove_dir_all(dir);
        // What is left of it (a removal that failed half way) is still
        // counted.
        let left = count(dir);
        self.quotas
            .released(&self.owner_dir(owner), held.saturating_sub(left));
        match removed {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The durable slot `name` of `owner` (not created).
    pub fn durable(&self, owner: &Owner, name: &str) -> PathBuf {
        self.owner_dir(owner).join(name)
    }

    /// The ephemeral slot of `owner`'s process `pid` (not created).
    pub fn ephemeral(&self, owner: &Owner, pid: u64) -> PathBuf {
        self.root.join("ephemeral").join(format!(
            "{}-{}-{pid}",
            owner.class,
            Self::owner_key(owner)
        ))
    }
}
