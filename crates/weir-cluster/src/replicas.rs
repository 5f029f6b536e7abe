//! Local copies: before an owned object's database is opened here, its
//! local copy is made exactly the state the coordinator's head names.
//!
//! Invariant owned here: a replica is opened only at the head its owner
//! row holds now, with that head's checksum: after a commit of it failed
//! here (its answer lost, so it may have been kept all the same), the row
//! is read again rather than trusted from memory. The local copy is kept when
//! this node knows it is there (every commit it made on it was accepted)
//! or when the file's checksum says so; otherwise it is rebuilt from the
//! newest snapshot and the log after it, and a rebuild that does not end
//! at the row's head and checksum is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use weir_store::replica::restore::{restore, settle};
use weir_store::replica::{Checksum, ReplicaStart};

use crate::coordinator::Owner;
use crate::counters::add;
use crate::error_code::ClusterErrorCode;
use crate::ownership::{Owned, Ownership};
use crate::shipper::Records;

/// Makes local copies current.
pub struct Replicas {
    pub ownership: Arc<Ownership>,
    pub records: Arc<Records>,
}

fn remove(path: &Path) -> std::io::Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        match std::fs::remove_file(PathBuf::from(format!("{}{suffix}", path.display()))) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn failed(key: &str, what: &str, e: impl std::fmt::Display) -> ClusterErrorCode {
    tracing::error!(key, error = %e, "{what}");
    ClusterErrorCode::StorageUnavailable
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ClusterErrorCode> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| ClusterErrorCode::StorageUnavailable)
}

impl Replicas {
    /// Makes the local copy of `key` at `path` the state its owner row
    /// names, and says where its history resumes, with the claim to open
    /// it under (`owned`, its state read again if a commit failed since
    /// the copy was last opened).
    pub async fn prepare(
        &self,
        key: &str,
        path: &Path,
        page_size: u32,
        owned: Owned,
    ) -> Result<(ReplicaStart, Owned), ClusterErrorCode> {
        let owned = if self.records.failed(key) {
            self.reread(key, owned).await?
        } else {
            owned
        };
        self.make_current(key, path, page_size, owned)
            .await
            .map(|start| (start, owned))
    }

    /// `owned` as the owner row holds it now: a commit of `key` failed
    /// here, and its answer may be what was lost, so the head this node
    /// last knew may be behind the row's.
    async fn reread(&self, key: &str, owned: Owned) -> Result<Owned, ClusterErrorCode> {
        let row = self
            .ownership
            .coordinator()
            .lookup(key, owned.held.session)
            .await
            .map_err(|e| failed(key, "cannot read an object's row again", e))?;
        match row {
            Owner::Me(state) if state.epoch == owned.state.epoch => {
                if state.head != owned.state.head {
                    tracing::info!(
                        key,
                        was = owned.state.head,
                        head = state.head,
                        "a commit whose answer was lost had been kept"
                    );
                }
                self.ownership.adopt(key, state, owned.held);
                Ok(Owned {
                    state,
                    held: owned.held,
                })
            }
            _ => {
                self.ownership.lost(key);
                Err(ClusterErrorCode::OwnershipLost)
            }
        }
    }

    async fn make_current(
        &self,
        key: &str,
        path: &Path,
        page_size: u32,
        owned: Owned,
    ) -> Result<ReplicaStart, ClusterErrorCode> {
        let state = owned.state;
        let wanted = Checksum::new(state.checksum);
        let resume = ReplicaStart::Resume {
            head: state.head,
            checksum: wanted,
        };
        let path = path.to_path_buf();
        if state.head == 0 {
            // New everywhere: whatever is here is not its history.
            blocking({
                let path = path.clone();
                move || remove(&path)
            })
            .await?
            .map_err(|e| failed(key, "cannot clear an old local copy", e))?;
            self.records.opened(key, 0, wanted.into_inner());
            return Ok(ReplicaStart::Fresh);
        }
        if self.records.clean(key) == Some((state.head, wanted.into_inner())) {
            add(&self.ownership.counters().copies_kept, 1);
            return Ok(resume);
        }
        let local = blocking({
            let path = path.clone();
            move || settle(&path, page_size)
        })
        .await?
        .map_err(|e| failed(key, "cannot read the local copy", e))?;
        if local.is_some_and(|(checksum, _)| checksum == wanted) {
            self.records.opened(key, state.head, wanted.into_inner());
            add(&self.ownership.counters().copies_kept, 1);
            return Ok(resume);
        }
        let history = self
            .ownership
            .coordinator()
            .history(state.id, state.head)
            .await
            .map_err(|e| failed(key, "cannot read an object's history", e))?;
        let last = history
            .log
            .last()
            .map(|(h, _)| *h)
            .or(history.snapshot.as_ref().map(|(h, _)| *h));
        if last != Some(state.head) {
            return Err(failed(
                key,
                "an object's history does not reach its head",
                format!("head {} but the history ends at {last:?}", state.head),
            ));
        }
        let restored = blocking(move || {
            restore(
                &path,
                page_size,
                history.snapshot.as_ref().map(|(_, ltx)| ltx.as_slice()),
                history.log.iter().map(|(_, ltx)| ltx.as_slice()),
            )
        })
        .await?
        .map_err(|e| failed(key, "cannot rebuild an object from its history", e))?;
        if restored.head != state.head || restored.checksum != wanted {
            return Err(failed(
                key,
                "a rebuilt object is not the state its owner row names",
                format!(
                    "rebuilt head {} checksum {}, the row says head {} checksum {}",
                    restored.head, restored.checksum, state.head, wanted
                ),
            ));
        }
        tracing::info!(key, head = state.head, "rebuilt from the cluster's history");
        add(&self.ownership.counters().rebuilt, 1);
        self.records.opened(key, state.head, wanted.into_inner());
        Ok(resume)
    }
}
