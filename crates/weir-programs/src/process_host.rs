//! The host side of `weir:process/processes`: spawn, kill, status, list
//! and storage slots of an actor's resident processes (the functions the
//! linker in [`crate::host`] calls). A spawn journals its launch before the
//! program runs ([`crate::fenced_work`]); [`ProgramsHost::launch`] is the
//! one way a process starts, for a spawn and for a re-drive.

use std::sync::Arc;
use std::time::Instant;

use wasmtime_wasi_http::p2::bindings::ProxyPre;
use weir_actors::bindings::ActorSeat;
use weir_runtime::guest_state::GenerationState;
use weir_runtime::scope::EventScope;

use crate::fenced_work::{self, LaunchSpec, OnCrash};
use crate::host::generated::weir::process::{processes, types};
use crate::host::{ProgramsHost, coded, to_guest_error};
use crate::image_store::Digest;
use crate::loader::ProgramLoadError;
use crate::process_table::{Owner, Reserved};
use crate::resident::{Resident, SlotUse, Spawn};
use crate::storage_slot::{MAX_SLOT_NAME_BYTES, valid_name as valid_slot_name};

impl ProgramsHost {
    /// One `processes.spawn` of an actor's turn, counted by result.
    pub(crate) async fn spawn(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
        scope: Option<Arc<EventScope>>,
        spec: processes::SpawnSpec,
    ) -> Result<processes::Spawned, types::Error> {
        let spawned = self.clone().try_spawn(seat, scope, spec).await;
        self.config.program_metrics.spawned(match &spawned {
            Ok(_) => "ok",
            Err(types::Error::Limit(_)) => "refused",
            Err(_) => "failed",
        });
        spawned
    }

    pub(crate) async fn try_spawn(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
        scope: Option<Arc<EventScope>>,
        spec: processes::SpawnSpec,
    ) -> Result<processes::Spawned, types::Error> {
        let seat = seat.ok_or(types::Error::NotAnActor)?;
        let scope = scope.ok_or_else(|| types::Error::Failed("event_scope_closed".into()))?;
        let _op = scope
            .register()
            .map_err(|e| types::Error::Failed(e.to_string()))?;
        let digest: Digest = spec
            .image
            .parse()
            .map_err(|e: crate::ImageError| types::Error::Image(coded(e.code(), &e)))?;
        let owner = owner_of(&seat);
        let reserved = self
            .table
            .reserve_guarded(&owner, seat.identity.incarnation)
            .map_err(|e| types::Error::Limit(e.to_string()))?;
        let pid = reserved.reservation.pid;
        let launch = LaunchSpec {
            image: digest.to_string(),
            args: spec.args,
            env: spec.env,
            start_args: LaunchSpec::hex(&spec.start_args),
            storage: spec.storage.map(|s| (s.name, s.durable)),
            on_crash: match spec.on_crash {
                Some(processes::OnCrash::Report) => OnCrash::Report,
                _ => OnCrash::RestartOnce,
            },
        };
        // Durable before the program's first instruction; a journal that
        // cannot be written refuses the spawn, and nothing starts.
        fenced_work::journal_in_turn(&seat.gate, pid, &launch).map_err(|why| {
            types::Error::Failed(format!(
                "the launch journal cannot be written ({why}); nothing was started"
            ))
        })?;
        let deadline = scope
            .deadline()
            .unwrap_or_else(|| Instant::now() + self.config.limits.runtime.event_limit);
        match self.launch(&owner, reserved, &launch, deadline).await {
            Ok((resident, payload)) => Ok(processes::Spawned {
                pid: resident.pid,
                payload,
            }),
            Err(e) => {
                // Nothing is running under that row.
                let _ = fenced_work::release_in_turn(&seat.gate, pid);
                Err(e)
            }
        }
    }

    /// Starts the process a launch spec describes, in the reserved slot:
    /// the one way a process starts, for a spawn and for a re-drive.
    pub(crate) async fn launch(
        &self,
        owner: &Owner,
        reserved: Reserved,
        launch: &LaunchSpec,
        deadline: Instant,
    ) -> Result<(Arc<Resident>, Vec<u8>), types::Error> {
        let digest: Digest = launch
            .image
            .parse()
            .map_err(|e: crate::ImageError| types::Error::Image(coded(e.code(), &e)))?;
        let pid = reserved.reservation.pid;
        let slot = launch
            .storage
            .as_ref()
            .map(|(name, durable)| processes::StorageSlot {
                name: name.clone(),
                durable: *durable,
            });
        let storage = self.storage_for(owner, pid, slot.as_ref())?;
        let loader = self.loader().map_err(types::Error::Failed)?;
        let ready = {
            let loader = loader.clone();
            let dir = storage.as_ref().map(|s| s.dir.clone());
            // Loading may compile, and making the slot is file work:
            // never on an async worker.
            tokio::task::spawn_blocking(move || {
                if let Some(dir) = &dir {
                    std::fs::create_dir_all(dir).map_err(|source| ProgramLoadError::Read {
                        path: format!("storage slot {}", dir.display()),
                        source,
                    })?;
                }
                let mut root = loader.images.root(&digest)?;
                let code =
                    loader.code::<ProxyPre<GenerationState>>(&mut root, &digest.to_string())?;
                Ok::<_, ProgramLoadError>((root, code))
            })
            .await
        };
        let (root, code) = match ready {
            Ok(Ok(ready)) => ready,
            Ok(Err(e)) => return Err(to_guest_error(e)),
            Err(e) => {
                return Err(types::Error::Failed(format!(
                    "loading the program failed: {e}"
                )));
            }
        };
        Resident::spawn(Spawn {
            reserved,
            code: Arc::new(code),
            root,
            args: launch.args.clone(),
            env: launch.env.clone(),
            start_args: launch.start_args(),
            storage,
            deadline,
            table: self.table.clone(),
            fence: self.fence.clone(),
            metrics: self.config.metrics.clone(),
            program_metrics: self.config.program_metrics.clone(),
            receipts: self.config.receipts.clone(),
        })
        .await
        .map_err(|e| types::Error::Failed(e.to_string()))
    }

    /// `processes.kill`: true if it was running; idempotent.
    pub(crate) async fn kill(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
        pid: u64,
    ) -> Result<bool, types::Error> {
        let seat = seat.ok_or(types::Error::NotAnActor)?;
        match self.table.get(&owner_of(&seat), pid) {
            Some(resident) => Ok(resident.kill().await),
            None => Ok(false),
        }
    }

    pub(crate) async fn status(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
        pid: u64,
    ) -> Result<processes::ProcessInfo, types::Error> {
        let seat = seat.ok_or(types::Error::NotAnActor)?;
        let owner = owner_of(&seat);
        self.table
            .recent(&owner, pid)
            .map(|r| info(&r))
            .ok_or(types::Error::NoSuchProcess)
    }

    pub(crate) async fn list(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
    ) -> Result<Vec<processes::ProcessInfo>, types::Error> {
        let seat = seat.ok_or(types::Error::NotAnActor)?;
        let owner = owner_of(&seat);
        Ok(self.table.of(&owner).iter().map(|r| info(r)).collect())
    }
    /// The directory a spawn's storage slot names, made ready (none: no
    /// slot), or why it cannot have it.
    pub(crate) fn storage_for(
        &self,
        owner: &Owner,
        pid: u64,
        slot: Option<&processes::StorageSlot>,
    ) -> Result<Option<SlotUse>, types::Error> {
        let Some(slot) = slot else { return Ok(None) };
        if !valid_slot_name(&slot.name) {
            return Err(types::Error::Failed(format!(
                "storage slot name `{}` must be 1-{MAX_SLOT_NAME_BYTES} of a-z, 0-9, `_` and `-`",
                slot.name.chars().take(80).collect::<String>()
            )));
        }
        if slot.durable
            && let Some(user) = self.table.of(owner).into_iter().find(|r| {
                r.storage
                    .as_ref()
                    .is_some_and(|s| s.durable && s.name == slot.name)
            })
        {
            return Err(types::Error::Failed(format!(
                "storage slot `{}` is in use by pid {}",
                slot.name, user.pid
            )));
        }
        let slots = self.slots().map_err(types::Error::Failed)?;
        let dir = if slot.durable {
            slots.durable(owner, &slot.name)
        } else {
            slots.ephemeral(owner, pid)
        };
        Ok(Some(SlotUse {
            name: slot.name.clone(),
            durable: slot.durable,
            dir,
        }))
    }

    /// `processes.remove-storage`: deletes a durable slot no running
    /// process uses; true if it existed.
    pub(crate) async fn remove_storage(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
        name: String,
    ) -> Result<bool, types::Error> {
        let seat = seat.ok_or(types::Error::NotAnActor)?;
        let owner = owner_of(&seat);
        let slot = processes::StorageSlot {
            name: name.clone(),
            durable: true,
        };
        let dir = match self.storage_for(&owner, 0, Some(&slot))? {
            Some(slot) => slot.dir,
            None => return Ok(false),
        };
        // Removing a durable app purges its launches from the journal.
        let durable = Some((name.clone(), true));
        seat.gate
            .write(|db| {
                for row in db.journal()? {
                    if LaunchSpec::decode(&row.spec).is_some_and(|s| s.storage == durable) {
                        db.journal_delete(row.pid)?;
                    }
                }
                Ok(())
            })
            .map_err(|_| types::Error::Failed("the owner's turn cannot write".into()))?;
        seat.gate.flush().map_err(types::Error::Failed)?;
        tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(types::Error::Failed(format!(
                "cannot remove storage slot `{name}`: {e}"
            ))),
        })
        .await
        .map_err(|e| types::Error::Failed(e.to_string()))?
    }
}

fn owner_of(seat: &ActorSeat) -> Owner {
    Owner {
        class: seat.identity.class.clone(),
        name: seat.identity.name.clone(),
    }
}

fn info(resident: &Resident) -> processes::ProcessInfo {
    processes::ProcessInfo {
        pid: resident.pid,
        image: resident.image.to_string(),
        slot: resident.slot,
        state: match resident.ended() {
            None => processes::State::Running,
            Some(why) => processes::State::Ended(why),
        },
        requests: resident.requests(),
    }
}
