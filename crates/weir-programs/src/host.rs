//! The host side of `weir:process` for actors: `programs.run` runs a
//! stored command to completion from an actor's turn. Added to every app's
//! linker through the runtime's extension point ([`ProgramInterfaces`]).
//!
//! Invariants owned here:
//! - only an actor's turn can run a program (a worker gets `not-an-actor`
//!   and nothing is loaded), and each run is one operation of the turn's
//!   scope: counted in its receipt, refused once the scope is closed;
//! - a run is bounded by `run_time_limit_ms` and by the turn's own
//!   deadline, whichever comes first: a program never holds its owner's
//!   turn longer than the turn may last. If the turn ends first (its
//!   deadline, its caller gone), the run is dropped with it, instance and
//!   all;
//! - a program runs from a rooted, verified image on the programs' own
//!   engine, whose instances reserve from the server's one guest memory
//!   budget; the engine (and its epoch thread) is made at the first run,
//!   so a server that runs no program pays nothing for it.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use wasmtime::component::Linker;
use weir_actors::bindings::ActorSeat;
use weir_runtime::code::HostInterfaces;
use weir_runtime::compiled_code::Compiler;
use weir_runtime::guest_state::GenerationState;
use weir_runtime::memory_budget::MemoryBudget;
use weir_runtime::metrics::AppMetrics;
use weir_runtime::outbound::OutboundRules;
use weir_runtime::receipt::ReceiptSink;
use weir_runtime::{LoadError, WeirEngine, WeirError};

use crate::RunSpec;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use weir_runtime::scope::EventScope;

use crate::fenced_work::{self, Fence, LaunchSpec, OnCrash};
use crate::image_store::{Digest, ImageStore};
use crate::loader::{Loader, ProgramLoadError};
use crate::metrics::ProgramMetrics;
use crate::one_shot::{self, Output, RunLimits, Stdin};
use crate::process_table::Reserved;
use crate::process_table::{Owner, ProcessTable};
use crate::resident::{Resident, SlotUse, Spawn};
use crate::storage_slot::{MAX_SLOT_NAME_BYTES, Slots, valid_name as valid_slot_name};
use weir_actors::{ActorHost, Exclusive};

mod generated {
    wasmtime::component::bindgen!({
        path: "../../wit/weir-process",
        world: "weir:process/imports",
    });
}

use generated::weir::process::{processes, programs, types};

/// The interface names, as components import them.
const TYPES_INTERFACE: &str = "weir:process/types@0.1.0";
const PROGRAMS_INTERFACE: &str = "weir:process/programs@0.1.0";
const PROCESSES_INTERFACE: &str = "weir:process/processes@0.1.0";

/// What the programs of a server are made with.
pub struct ProgramsConfig {
    pub images_dir: PathBuf,
    /// Where storage slots live (`<data-dir>/slots`).
    pub slots_dir: PathBuf,
    pub compiler: Compiler,
    pub limits: RunLimits,
    pub outbound: OutboundRules,
    pub budget: Arc<MemoryBudget>,
    pub metrics: AppMetrics,
    pub program_metrics: ProgramMetrics,
    pub receipts: Option<Arc<dyn ReceiptSink>>,
}

/// The programs of one server: made ready at the first run.
pub struct ProgramsHost {
    config: ProgramsConfig,
    loader: OnceLock<Result<Arc<Loader>, String>>,
    /// Opened at the first spawn (which is when a crash's leftover
    /// ephemeral slots are deleted).
    slots: OnceLock<Result<Arc<Slots>, String>>,
    /// The launch journal's way to owners outside their turns.
    fence: Arc<Fence>,
    /// The resident processes, by owner.
    pub table: Arc<ProcessTable>,
}

impl ProgramsHost {
    pub fn new(config: ProgramsConfig) -> Arc<ProgramsHost> {
        let table = ProcessTable::new(
            config.limits.programs.max_processes_per_actor,
            config.limits.programs.max_processes,
        );
        Arc::new(ProgramsHost {
            config,
            loader: OnceLock::new(),
            slots: OnceLock::new(),
            fence: Arc::new(Fence::default()),
            table,
        })
    }

    fn loader(&self) -> Result<Arc<Loader>, String> {
        self.loader
            .get_or_init(|| {
                let c = &self.config;
                let images = ImageStore::open(&c.images_dir, c.limits.programs.max_image_bytes)
                    .map_err(|e| e.to_string())?;
                let engine =
                    WeirEngine::for_programs(c.limits.runtime.memory_limit_bytes, c.budget.clone())
                        .map_err(|e| e.to_string())?;
                Loader::new(
                    images,
                    engine,
                    c.compiler.clone(),
                    c.limits.clone(),
                    c.outbound.clone(),
                )
                .map(Arc::new)
                .map_err(|e| e.to_string())
            })
            .clone()
    }

    fn slots(&self) -> Result<Arc<Slots>, String> {
        self.slots
            .get_or_init(|| {
                Slots::open(&self.config.slots_dir)
                    .map(Arc::new)
                    .map_err(|e| format!("cannot open {}: {e}", self.config.slots_dir.display()))
            })
            .clone()
    }

    /// The directory a spawn's storage slot names, made ready (none: no
    /// slot), or why it cannot have it.
    fn storage_for(
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
    async fn remove_storage(
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

    /// One `programs.run` call of an actor's turn.
    async fn run(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
        scope: Option<Arc<EventScope>>,
        call: RunCall,
    ) -> Result<programs::RunResult, types::Error> {
        if seat.is_none() {
            return Err(types::Error::NotAnActor);
        }
        let scope = scope.ok_or_else(|| types::Error::Failed("event_scope_closed".into()))?;
        let _op = scope
            .register()
            .map_err(|e| types::Error::Failed(e.to_string()))?;
        let digest: Digest = call
            .image
            .parse()
            .map_err(|e: crate::ImageError| types::Error::Image(coded(e.code(), &e)))?;
        let loader = self.loader().map_err(types::Error::Failed)?;
        let ready = {
            let loader = loader.clone();
            // Loading may compile: never on an async worker.
            tokio::task::spawn_blocking(move || {
                let mut root = loader.images.root(&digest)?;
                let program = loader.load(&mut root, &digest.to_string())?;
                Ok::<_, ProgramLoadError>((root, program))
            })
            .await
            .map_err(|e| types::Error::Failed(format!("loading the program failed: {e}")))?
        };
        let (root, program) = ready.map_err(to_guest_error)?;
        let mut limits = loader.limits().clone();
        if let Some(deadline) = scope.deadline() {
            let left = deadline.saturating_duration_since(Instant::now());
            limits.programs.run_time_limit = limits.programs.run_time_limit.min(left);
        }
        let report = one_shot::run(
            &program,
            RunSpec {
                args: call.args,
                env: call.env,
                stdin: Stdin::Bytes(call.stdin),
                output: Output::Capture,
            },
            &limits,
            &self.config.metrics,
            self.config.receipts.as_deref(),
        )
        .await;
        drop(root);
        self.config.program_metrics.ran(match &report.end {
            crate::RunEnd::Exited(_) => "ok",
            crate::RunEnd::Failed { outcome, .. } => outcome.as_str(),
        });
        Ok(programs::RunResult {
            exit_code: report.end.exit_code(),
            stopped: report.end.error().map(str::to_string),
            stdout: report.stdout,
            stderr: report.stderr,
        })
    }
}

impl ProgramsHost {
    /// One `processes.spawn` of an actor's turn, counted by result.
    async fn spawn(
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

    async fn try_spawn(
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
    async fn launch(
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

    /// Recovers the launch journals the last run left: each owner on its
    /// own, at once, without waiting for a request (see
    /// [`crate::fenced_work`]). Binds the actor host first, and holds every
    /// such owner before it returns, so no turn of theirs runs before their
    /// recovery: call it before serving.
    pub async fn recover(self: &Arc<Self>, actors: &Arc<ActorHost>) {
        self.fence.connect(actors);
        for address in actors.journaled() {
            let owner = Owner {
                class: address.class.clone(),
                name: address.name.clone(),
            };
            let held = match actors.exclusive(&owner.class, &owner.name).await {
                Ok(held) => held,
                Err(e) => {
                    tracing::warn!(%owner, error = %e, "cannot recover the launch journal");
                    continue;
                }
            };
            let host = self.clone();
            tokio::spawn(async move { host.recover_owner(held, &owner).await });
        }
    }

    async fn recover_owner(&self, mut held: Exclusive, owner: &Owner) {
        let receipt = |old: u64, new: Option<u64>, image: &str, lost: Option<&str>| {
            if let Some(sink) = &self.config.receipts {
                fenced_work::write_recovery_receipt(sink.as_ref(), owner, old, new, image, lost);
            }
            self.config.program_metrics.recovered(if lost.is_some() {
                "lost"
            } else {
                "recovered"
            });
        };
        let plan = match fenced_work::plan(&mut held) {
            Ok(plan) => plan,
            Err(e) => {
                tracing::warn!(%owner, error = %e, "cannot recover the launch journal");
                return;
            }
        };
        for (row, why) in &plan.lost {
            let image = LaunchSpec::decode(&row.spec)
                .map(|s| s.image)
                .unwrap_or_default();
            tracing::warn!(%owner, pid = row.pid, why, "a resident process was lost in a crash");
            receipt(row.pid, None, &image, Some(why));
        }
        for (row, launch) in plan.redrive {
            let reserved = match self.table.reserve_guarded(owner, plan.incarnation) {
                Ok(reserved) => reserved,
                Err(e) => {
                    let _ = fenced_work::drop_row(&mut held, row.pid);
                    receipt(row.pid, None, &launch.image, Some(&e.to_string()));
                    continue;
                }
            };
            let new_pid = reserved.reservation.pid;
            if let Err(e) = fenced_work::rename(&mut held, &row, new_pid) {
                receipt(row.pid, None, &launch.image, Some(&e));
                continue;
            }
            let deadline = Instant::now() + self.config.limits.runtime.event_limit;
            match self.launch(owner, reserved, &launch, deadline).await {
                Ok((resident, _payload)) => {
                    if let Err(e) = fenced_work::settled(&mut held, resident.pid, &row.spec) {
                        tracing::warn!(%owner, pid = resident.pid, error = %e, "cannot settle a re-driven launch");
                    }
                    tracing::info!(%owner, old_pid = row.pid, new_pid = resident.pid, "a resident process was started again after a crash");
                    receipt(row.pid, Some(resident.pid), &launch.image, None);
                }
                Err(e) => {
                    let _ = fenced_work::drop_row(&mut held, new_pid);
                    let why = format!("its re-drive failed: {e:?}");
                    receipt(row.pid, None, &launch.image, Some(&why));
                }
            }
        }
    }

    /// `processes.kill`: true if it was running; idempotent.
    async fn kill(
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

    async fn status(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
        pid: u64,
    ) -> Result<processes::ProcessInfo, types::Error> {
        let seat = seat.ok_or(types::Error::NotAnActor)?;
        let owner = owner_of(&seat);
        self.table
            .get(&owner, pid)
            .map(|r| info(&r))
            .ok_or(types::Error::NoSuchProcess)
    }

    async fn list(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
    ) -> Result<Vec<processes::ProcessInfo>, types::Error> {
        let seat = seat.ok_or(types::Error::NotAnActor)?;
        let owner = owner_of(&seat);
        Ok(self.table.of(&owner).iter().map(|r| info(r)).collect())
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

/// `programs.run`'s parameters as the component model lifts them.
type RunParams = (String, Vec<String>, Vec<(String, String)>, Vec<u8>);

/// The arguments of one `programs.run`.
struct RunCall {
    image: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    stdin: Vec<u8>,
}

/// `code: message`, the way guests and operators read Weir's failures.
fn coded(code: impl WeirError, e: &dyn std::fmt::Display) -> String {
    format!("{}: {e}", code.as_str())
}

fn to_guest_error(e: ProgramLoadError) -> types::Error {
    match &e {
        ProgramLoadError::Image(image) => types::Error::Image(coded(image.code(), &e)),
        ProgramLoadError::Load(LoadError::NotACommand { .. }) => {
            types::Error::NotRunnable(coded(crate::ProgramErrorCode::NotACommand, &e))
        }
        ProgramLoadError::Load(_) => types::Error::NotRunnable(e.to_string()),
        ProgramLoadError::Read { .. } | ProgramLoadError::Pool(_) => {
            types::Error::Failed(e.to_string())
        }
    }
}

/// Who is calling: the actor's seat (none for a worker) and the scope of
/// the turn running now.
fn caller(data: &GenerationState) -> (Option<ActorSeat>, Option<Arc<EventScope>>) {
    (
        data.extension::<ActorSeat>().cloned(),
        data.scope().cloned(),
    )
}

/// `weir:process` (programs and processes), for every app's linker.
pub struct ProgramInterfaces(pub Arc<ProgramsHost>);

impl HostInterfaces for ProgramInterfaces {
    fn add_to_linker(&self, linker: &mut Linker<GenerationState>) -> wasmtime::Result<()> {
        linker.instance(TYPES_INTERFACE)?;
        let mut processes = linker.instance(PROCESSES_INTERFACE)?;
        let host = self.0.clone();
        processes.func_wrap_async("spawn", move |store, (spec,): (processes::SpawnSpec,)| {
            let (seat, scope) = caller(store.data());
            let host = host.clone();
            Box::new(async move { Ok((host.spawn(seat, scope, spec).await,)) })
        })?;
        let host = self.0.clone();
        processes.func_wrap_async("kill", move |store, (pid,): (u64,)| {
            let (seat, _) = caller(store.data());
            let host = host.clone();
            Box::new(async move { Ok((host.kill(seat, pid).await,)) })
        })?;
        let host = self.0.clone();
        processes.func_wrap_async("remove-storage", move |store, (name,): (String,)| {
            let (seat, _) = caller(store.data());
            let host = host.clone();
            Box::new(async move { Ok((host.remove_storage(seat, name).await,)) })
        })?;
        let host = self.0.clone();
        processes.func_wrap_async("status", move |store, (pid,): (u64,)| {
            let (seat, _) = caller(store.data());
            let host = host.clone();
            Box::new(async move { Ok((host.status(seat, pid).await,)) })
        })?;
        let host = self.0.clone();
        processes.func_wrap_async("list", move |store, (): ()| {
            let (seat, _) = caller(store.data());
            let host = host.clone();
            Box::new(async move { Ok((host.list(seat).await,)) })
        })?;
        let host = self.0.clone();
        linker.instance(PROGRAMS_INTERFACE)?.func_wrap_async(
            "run",
            move |store, (image, args, env, stdin): RunParams| {
                let (seat, scope) = caller(store.data());
                let host = host.clone();
                let call = RunCall {
                    image,
                    args,
                    env,
                    stdin,
                };
                Box::new(async move { Ok((host.run(seat, scope, call).await,)) })
            },
        )?;
        Ok(())
    }
}
