//! Handover (cluster mode): a resident process runs on the node that holds
//! its owner, and only while that node holds it; its launch journal row is
//! in the owner's storage, which the cluster keeps, so the node that holds
//! the owner next starts it again, by the rules a crash's restart follows
//! ([`crate::fenced_work`]).
//!
//! Invariants owned here:
//! - a process runs only while its node holds its owner under a lease it
//!   holds by its own clock: that is checked every
//!   [`HANDOVER_CHECK_INTERVAL`], and a process whose owner is no longer
//!   held is stopped with its journal row kept (receipt `stopped`), before
//!   any other node may claim the owner (the node's own end of its lease
//!   comes a safety margin before the cluster's);
//! - wherever an owner's storage opens, the rows of processes not running
//!   there are owed, and are re-driven (once, then lost) before any turn
//!   of the owner runs; the row of a process that ended by itself there,
//!   whose deletion is still on its way, is not owed;
//! - an owner whose processes this node stopped is taken over again as
//!   soon as this node holds it again (its lease came back), without
//!   waiting for a call; if another node holds it, that node does;
//! - an owner whose node died is claimed by a live node (its journal is
//!   mirrored in its cluster row) and opened there, which takes it over.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_actors::gate::TurnGate;
use weir_actors::placement::BoxFuture;
use weir_actors::{ActorAddress, ActorHost, Handover, Location};
use weir_store::actor::JournalRow;

use crate::host::ProgramsHost;
use crate::process_table::Owner;
use crate::recovery::tell;

/// How often a node checks that it still holds the owners of its
/// processes: half the smallest safety margin between a node's own end of
/// its lease and the cluster's (50 ms), so a process is stopped before any
/// other node may claim its owner.
pub const HANDOVER_CHECK_INTERVAL: Duration = Duration::from_millis(25);

/// Owners whose processes this node stopped because it no longer held
/// them: taken over again if it holds them again.
#[derive(Default)]
pub struct Stopped(Mutex<HashSet<Owner>>);

impl Stopped {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<Owner>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn address(owner: &Owner) -> Option<ActorAddress> {
    ActorAddress::new(&owner.class, &owner.name).ok()
}

impl ProgramsHost {
    /// Binds this node's programs to its clustered actor host: told of
    /// each opening of an owner's storage, and checking every
    /// [`HANDOVER_CHECK_INTERVAL`] that it still holds its processes'
    /// owners, until either is dropped.
    pub(crate) fn start_handover(self: &Arc<Self>, actors: &Arc<ActorHost>) {
        actors.bind_handover(self.clone());
        let (programs, actors) = (Arc::downgrade(self), Arc::downgrade(actors));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(HANDOVER_CHECK_INTERVAL).await;
                let (Some(programs), Some(actors)) = (programs.upgrade(), actors.upgrade()) else {
                    return;
                };
                programs.check_holds(&actors).await;
            }
        });
    }

    /// Stops the processes whose owner this node no longer holds, and
    /// takes over again the owners it stopped and holds again.
    async fn check_holds(self: &Arc<Self>, actors: &Arc<ActorHost>) {
        let Some(placement) = actors.placement() else {
            return;
        };
        for process in self.table.all() {
            if process.stop_asked() || process.ended().is_some() {
                continue;
            }
            let Some(actor) = address(&process.owner) else {
                continue;
            };
            if placement.owns(&actor) {
                continue;
            }
            tracing::warn!(owner = %process.owner, pid = process.pid, "this node no longer holds the owner of a resident process; stopping it, its launch kept for the owner's next node");
            self.stopped.lock().insert(process.owner.clone());
            tokio::spawn(async move { process.stop_for_handover().await });
        }
        let stopped: Vec<Owner> = self.stopped.lock().iter().cloned().collect();
        for owner in stopped {
            let Some(actor) = address(&owner) else {
                self.stopped.lock().remove(&owner);
                continue;
            };
            // Kept while the lease is not held: the answer may yet be here.
            match placement.locate(&actor, false, true).await {
                Ok(Location::Here) => {
                    self.stopped.lock().remove(&owner);
                    let (programs, actors) = (self.clone(), actors.clone());
                    tokio::spawn(async move { programs.take_over_again(&actors, &owner).await });
                }
                Ok(Location::Elsewhere(_)) => {
                    self.stopped.lock().remove(&owner);
                }
                Err(_) => {}
            }
        }
    }

    /// Takes over `owner`, which this node holds again after it stopped
    /// its processes: held and opened (which takes it over if its storage
    /// was closed), then its owed rows re-driven (none if the opening did).
    async fn take_over_again(&self, actors: &Arc<ActorHost>, owner: &Owner) {
        // A node that is stopping starts nothing: the next holder will.
        if self.stopping() {
            return;
        }
        let mut held = match actors.hold_open(&owner.class, &owner.name).await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(%owner, error = %e, "cannot take over the resident processes of an owner held again");
                return;
            }
        };
        let told = self
            .redrive(&mut held, owner, |row| self.owed(owner, row))
            .await;
        tell(actors, &mut held, told).await;
    }

    /// A row is owed here unless its process runs here, or ended here by
    /// itself (its row's deletion on its way).
    fn owed(&self, owner: &Owner, row: &JournalRow) -> bool {
        self.table.get(owner, row.pid).is_none()
            && self
                .table
                .recent(owner, row.pid)
                .is_none_or(|ended| ended.launch_kept())
    }

    /// Takes over what `owner`'s journal says is owed, its storage just
    /// opened here (`gate`) and the owner held.
    async fn opened_here(&self, owner: Owner, gate: &Arc<TurnGate>) {
        if self.stopping() {
            return;
        }
        let rows = match gate.with_db(|db| db.journal()) {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(%owner, error = %e, "cannot read the launch journal of an owner opened here");
                return;
            }
        };
        let owed: Vec<JournalRow> = rows
            .into_iter()
            .filter(|row| self.owed(&owner, row))
            .collect();
        if owed.is_empty() {
            return;
        }
        self.stopped.lock().remove(&owner);
        tracing::info!(%owner, processes = owed.len(), "taking over the resident processes of an owner opened here");
        let _roots = self.root_images(&owed);
        let mut journal = gate.clone();
        let told = self
            .redrive(&mut journal, &owner, |row| self.owed(&owner, row))
            .await;
        // The owner hears of it in turns of its own, once this opening's
        // turn is over.
        let (Some(actors), false) = (self.fence.actors(), told.is_empty()) else {
            return;
        };
        tokio::spawn(async move {
            if let Ok(mut held) = actors.exclusive(&owner.class, &owner.name).await {
                tell(&actors, &mut held, told).await;
            }
        });
    }
}

impl Handover for ProgramsHost {
    fn opened<'a>(&'a self, actor: &'a ActorAddress, gate: &'a Arc<TurnGate>) -> BoxFuture<'a, ()> {
        let owner = Owner {
            class: actor.class.clone(),
            name: actor.name.clone(),
        };
        Box::pin(self.opened_here(owner, gate))
    }
}
