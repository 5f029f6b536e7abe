//! Recovery after a crash, as the programs see it: every owner whose
//! launch journal has rows (found by its launch mark) is held and
//! recovered on its own at start (what is decided, and how durably, is
//! [`crate::fenced_work`]). The images those rows name are rooted before
//! the server serves and until their re-drives have rooted them, so no
//! sweep removes what recovery is about to start. A handover in cluster
//! mode ([`crate::handover`]) re-drives through the same steps.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{ComponentType, Lower};
use weir_actors::{ActorHost, Exclusive};
use weir_store::actor::JournalRow;

use crate::fenced_work::{self, Journal, LaunchSpec};
use crate::host::ProgramsHost;
use crate::image_store::{Digest, Root};
use crate::process_table::Owner;

/// The export an owner may have to hear what recovery did.
pub const SUPERVISOR_EXPORT: (&str, &str) = ("weir:process/supervisor@0.1.0", "recovered");

/// `weir:process/supervisor.recovery-outcome`.
#[derive(ComponentType, Lower, Clone, Debug)]
#[component(variant)]
pub enum RecoveryOutcome {
    #[component(name = "restarted")]
    Restarted,
    #[component(name = "lost")]
    Lost(String),
}

/// What the owner is told of one row: its old pid, its new one if it was
/// started again, and how.
pub(crate) type Told = (u64, Option<u64>, RecoveryOutcome);

impl ProgramsHost {
    /// Recovers the launch journals the last run left: each owner on its
    /// own, at once, without waiting for a request (see
    /// [`crate::fenced_work`]). Binds the actor host first, and holds every
    /// such owner before it returns, so no turn of theirs runs before their
    /// recovery: call it before serving. In cluster mode nothing here is
    /// recovered from this node's files: owners are taken over where the
    /// cluster places them ([`crate::handover`]).
    pub async fn recover(self: &Arc<Self>, actors: &Arc<ActorHost>) {
        self.fence.connect(actors);
        self.start_handover(actors);
        if actors.placement().is_some() {
            return;
        }
        for address in actors.journaled() {
            let owner = Owner::from(address);
            let mut held = match actors.exclusive(&owner.class, &owner.name).await {
                Ok(held) => held,
                Err(e) => {
                    tracing::warn!(%owner, error = %e, "cannot recover the launch journal");
                    continue;
                }
            };
            let rows = match held.storage(|db| db.journal()) {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::warn!(%owner, error = %e, "cannot read the launch journal");
                    continue;
                }
            };
            // A mark may outlive its rows (a process its owner killed in a
            // turn): such an owner has nothing to recover.
            if rows.is_empty() {
                if let Err(e) = held.unmark_if_unjournaled() {
                    tracing::warn!(%owner, error = %e, "cannot read the launch journal");
                }
                continue;
            }
            // Rooted before the server serves, and until the re-drives
            // root them themselves: a sweep through the admin address
            // meanwhile spares what recovery is about to start.
            let roots = self.root_images(&rows);
            let host = self.clone();
            tokio::spawn(async move { host.recover_owner(held, &owner, roots).await });
        }
    }

    /// Roots the images `rows` name (an image that is gone, or a store
    /// that cannot be opened, is left to the recovery, which reports it).
    pub(crate) fn root_images(&self, rows: &[JournalRow]) -> Vec<Root> {
        let Ok(loader) = self.loader() else {
            return Vec::new();
        };
        rows.iter()
            .filter_map(|row| LaunchSpec::decode(&row.spec)?.image.parse::<Digest>().ok())
            .filter_map(|digest| loader.images.root(&digest).ok())
            .collect()
    }

    async fn recover_owner(&self, mut held: Exclusive, owner: &Owner, _roots: Vec<Root>) {
        let told = match self.redrive(&mut held, owner, |_| true).await {
            Ok(told) => told,
            Err(e) => {
                tracing::warn!(%owner, error = %e, "cannot recover the launch journal");
                Vec::new()
            }
        };
        // No row left (every one lost, or its re-drive failed): the next
        // start need not look at this owner.
        if let Err(e) = held.unmark_if_unjournaled() {
            tracing::warn!(%owner, error = %e, "cannot read the launch journal after recovery");
        }
        if let Some(actors) = self.fence.actors() {
            tell(&actors, &mut held, told).await;
        }
    }

    /// Re-drives the `owed` rows of `owner`'s journal by the rules of
    /// [`crate::fenced_work`] (once, then lost), each with a receipt:
    /// what the owner is to be told. An error when the plan could not be
    /// made durable: then nothing was started, and the next try reads
    /// the rows as the owner's storage has them (a row whose re-drive the
    /// plan spent is lost by the rules, never started twice).
    pub(crate) async fn redrive(
        &self,
        journal: &mut impl Journal,
        owner: &Owner,
        owed: impl Fn(&JournalRow) -> bool,
    ) -> Result<Vec<Told>, String> {
        let mut told = Vec::new();
        let mut receipt = |old: u64, new: Option<u64>, image: &str, lost: Option<&str>| {
            told.push((
                old,
                new,
                match lost {
                    Some(why) => RecoveryOutcome::Lost(why.to_string()),
                    None => RecoveryOutcome::Restarted,
                },
            ));
            if let Some(sink) = &self.config.receipts {
                fenced_work::write_recovery_receipt(sink.as_ref(), owner, old, new, image, lost);
            }
            self.config.program_metrics.recovered(if lost.is_some() {
                "lost"
            } else {
                "recovered"
            });
        };
        let plan = fenced_work::plan(journal, owed).await?;
        for (row, why) in &plan.lost {
            let image = LaunchSpec::decode(&row.spec)
                .map(|s| s.image)
                .unwrap_or_default();
            tracing::warn!(%owner, pid = row.pid, why, "a resident process that was running when its server stopped is not started again");
            receipt(row.pid, None, &image, Some(why));
        }
        for (row, launch) in plan.redrive {
            let reserved = match self.table.reserve_guarded(owner, plan.incarnation) {
                Ok(reserved) => reserved,
                Err(e) => {
                    let _ = fenced_work::drop_row(journal, row.pid);
                    receipt(row.pid, None, &launch.image, Some(&e.to_string()));
                    continue;
                }
            };
            let new_pid = reserved.reservation.pid;
            if let Err(e) = fenced_work::rename(journal, &row, new_pid).await {
                receipt(row.pid, None, &launch.image, Some(&e));
                continue;
            }
            let deadline = Instant::now() + self.config.limits.runtime.event_limit;
            match self.launch(owner, reserved, &launch, deadline).await {
                Ok((resident, _payload)) => {
                    if let Err(e) = fenced_work::settled(journal, resident.pid, &row.spec) {
                        tracing::warn!(%owner, pid = resident.pid, error = %e, "cannot settle a re-driven launch");
                    }
                    tracing::info!(%owner, old_pid = row.pid, new_pid = resident.pid, "a resident process that was running when its server stopped was started again");
                    receipt(row.pid, Some(resident.pid), &launch.image, None);
                }
                Err(e) => {
                    let _ = fenced_work::drop_row(journal, new_pid);
                    let why = format!("its re-drive failed: {e:?}");
                    receipt(row.pid, None, &launch.image, Some(&why));
                }
            }
        }
        Ok(told)
    }
}

/// The owner, held, hears of each re-drive in its own turns, before any
/// request reaches it.
pub(crate) async fn tell(actors: &ActorHost, held: &mut Exclusive, told: Vec<Told>) {
    let owner = &held.actor().clone();
    for (old, new, outcome) in told {
        let told = actors
            .call_export(held, SUPERVISOR_EXPORT, (old, new, outcome))
            .await;
        match told {
            Ok(Some(())) => {}
            // The class does not export it: nobody to tell.
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(%owner, old_pid = old, error = %e, "the owner's supervisor.recovered failed");
            }
        }
    }
}
