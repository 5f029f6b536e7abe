//! The host side of `weir:process/processes`: spawn, kill, status, list
//! and storage slots of an actor's resident processes (the functions the
//! linker in [`crate::host`] calls). A spawn journals its launch before the
//! program runs ([`crate::fenced_work`]); `ProgramsHost::launch` is the
//! one way a process starts, for a spawn and for a re-drive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_actors::bindings::ActorSeat;
use weir_runtime::scope::EventScope;

use crate::fenced_work::{self, LaunchSpec, OnCrash};
use crate::host::generated::weir::process::{processes, types};
use crate::host::{ProgramsHost, operation, parse_digest, text_bytes};
use crate::lifetime::{self, Console, ConsoleError, Stream};
use crate::limits::MAX_SPAWN_SPEC_BYTES;
use crate::loader::ProgramLoadError;
use crate::one_shot::CommandCode;
use crate::process::{Contract, Process, SlotUse, Spawn, SpawnError};
use crate::process_table::{Owner, Reserved};
use crate::resident::{self, ServerCode};
use crate::storage_slot::{MAX_SLOT_NAME_BYTES, valid_name as valid_slot_name};

/// A spawn between its launch row's write and its end (its process up,
/// or the row deleted): dropped before that, its owner is owed a
/// take-over ([`crate::handover`]).
struct Launching<'a> {
    programs: &'a ProgramsHost,
    owner: Option<Owner>,
    pid: u64,
    /// Rooted for the take-over while it is owed: a sweep meanwhile must
    /// not take what it is about to start.
    image: crate::Digest,
}

impl Launching<'_> {
    /// The spawn ended with its row's fate known: nothing is owed.
    fn settled(mut self) {
        self.owner = None;
    }
}

impl Drop for Launching<'_> {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            tracing::warn!(%owner, pid = self.pid, "a spawn ended before its process was up, its launch row written; the launch is re-driven once its owner's turn is over");
            let root = self
                .programs
                .loader()
                .ok()
                .and_then(|loader| loader.images.root(&self.image).ok());
            self.programs.owed.owe_later(owner, root);
        }
    }
}

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
        if self.stopping() {
            return Err(types::Error::Failed(crate::host::SHUTTING_DOWN.to_string()));
        }
        let (scope, _op) = operation(scope)?;
        let digest = parse_digest(&spec.image)?;
        let spec_bytes = spec_bytes(&spec);
        if spec_bytes > MAX_SPAWN_SPEC_BYTES {
            return Err(types::Error::Limit(format!(
                "the spawn's arguments, environment and start arguments take {spec_bytes} bytes; at most {MAX_SPAWN_SPEC_BYTES} may be journaled and held for a process"
            )));
        }
        let owner = owner_of(&seat);
        let reserved = self
            .table
            .reserve_guarded(&owner, seat.identity.incarnation)
            .map_err(|e| types::Error::Limit(e.to_string()))?;
        let pid = reserved.reservation.pid;
        let contract = match spec.contract {
            Some(processes::Contract::Lifetime) => Contract::Lifetime,
            _ => Contract::Boot,
        };
        let launch = LaunchSpec {
            image: digest.to_string(),
            contract,
            args: spec.args,
            env: spec.env,
            secret_env: spec.secret_env,
            start_args: LaunchSpec::hex(&spec.start_args),
            storage: spec.storage.map(|s| (s.name, s.durable)),
            on_crash: match (spec.on_crash, contract) {
                (Some(processes::OnCrash::Report), _) => OnCrash::Report,
                (Some(processes::OnCrash::RestartOnce), _) => OnCrash::RestartOnce,
                (None, Contract::Boot) => OnCrash::RestartOnce,
                (None, Contract::Lifetime) => OnCrash::Report,
            },
        };
        // A secret the class does not have refuses the spawn before
        // anything is journaled; so does a slot that could not follow
        // its owner.
        self.secrets_for(&owner, &launch)?;
        if let (Some(why), Some((_, true))) = (self.config.durable_slots_refused, &launch.storage) {
            return Err(types::Error::Failed(why.to_string()));
        }
        // Durable before the program's first instruction; a journal that
        // cannot be written refuses the spawn, and nothing starts.
        // From the row's write until its process is up or the row is
        // deleted: a spawn that ends between (cut at the turn's deadline,
        // or its row not confirmed by the cluster, which may keep it all
        // the same) leaves a launch that runs nowhere, and owes its owner
        // a take-over, which re-drives it as a crash's restart would.
        let launching = Launching {
            programs: &self,
            owner: Some(owner.clone()),
            pid,
            image: digest,
        };
        if let Err(e) = fenced_work::journal_in_turn(&seat.gate, pid, &launch).await {
            if let fenced_work::Unjournaled::NotWritten(_) = &e {
                launching.settled();
            }
            return Err(types::Error::Failed(e.to_string()));
        }
        let deadline = scope
            .deadline()
            .unwrap_or_else(|| Instant::now() + self.config.limits.runtime.event_limit);
        let launched = self.launch(&owner, reserved, &launch, deadline).await;
        launching.settled();
        match launched {
            Ok((process, payload)) => Ok(processes::Spawned {
                pid: process.pid,
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
    ) -> Result<(Arc<Process>, Vec<u8>), types::Error> {
        let digest = parse_digest(&launch.image)?;
        let threads = self.program_threads().map_err(types::Error::Failed)?;
        let pid = reserved.reservation.pid;
        let slot = launch
            .storage
            .as_ref()
            .map(|(name, durable)| processes::StorageSlot {
                name: name.clone(),
                durable: *durable,
            });
        let mut storage = self.storage_for(owner, pid, slot.as_ref())?;
        let mut env = launch.env.clone();
        env.extend(self.secrets_for(owner, launch)?);
        let dir = match &storage {
            Some(s) => {
                let slots = self.slots().map_err(types::Error::Failed)?;
                Some((s.dir.clone(), slots.owner_dir(owner), slots))
            }
            None => None,
        };
        let contract = launch.contract;
        let _here = self.image_here(digest).await?;
        let (root, code, quota) = self
            .load_blocking(move |loader| {
                let mut quota = None;
                if let Some((dir, owner_dir, slots)) = &dir {
                    std::fs::create_dir_all(dir).map_err(|source| ProgramLoadError::Read {
                        path: format!("storage slot {}", dir.display()),
                        cause: source,
                    })?;
                    let max = loader.limits().programs.max_slot_bytes;
                    quota = Some(slots.quotas.for_owner(owner_dir, max));
                }
                let mut root = loader.images.root(&digest)?;
                let name = digest.to_string();
                let code = match contract {
                    Contract::Boot => Code::Server(Arc::new(loader.code(&mut root, &name)?)),
                    Contract::Lifetime => Code::Command(Arc::new(loader.code(&mut root, &name)?)),
                };
                Ok((root, code, quota))
            })
            .await?;
        if let Some(storage) = &mut storage {
            storage.quota = quota;
        }
        // In cluster mode a boot ends with this node's hold on its owner:
        // a process not yet in the table is one nothing else would stop,
        // while the owner's next node may start the launch again. It is
        // cut as at its deadline (and its slot given back).
        let tenure_ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cancel = self.tenure_of(owner).map(|tenure| {
            let (stop, cancel) = tokio::sync::oneshot::channel();
            let ended = tenure_ended.clone();
            tokio::spawn(async move {
                let mut stop = stop;
                tokio::select! {
                    () = tenure => {
                        ended.store(true, std::sync::atomic::Ordering::Release);
                        let _ = stop.send(());
                    }
                    // The boot is over (its receiver dropped).
                    () = stop.closed() => {}
                }
            });
            cancel
        });
        let spawn = Spawn {
            reserved,
            root,
            args: launch.args.clone(),
            env,
            start_args: launch.start_args(),
            storage,
            deadline,
            cancel,
            table: self.table.clone(),
            fence: self.fence.clone(),
            metrics: self.config.metrics.clone(),
            program_metrics: self.config.program_metrics.clone(),
            receipts: self.config.receipts.clone(),
            threads,
        };
        let spawned = match code {
            Code::Server(code) => resident::spawn(spawn, code).await,
            Code::Command(code) => lifetime::spawn(spawn, code).await.map(|p| (p, Vec::new())),
        };
        let spawned = match spawned {
            Err(SpawnError::Start(_))
                if tenure_ended.load(std::sync::atomic::Ordering::Acquire) =>
            {
                Err(SpawnError::Start(
                    "this node no longer holds its owner; the boot was cut".into(),
                ))
            }
            spawned => spawned,
        };
        spawned.map_err(|e| match e {
            SpawnError::NotRunnable(why) => types::Error::NotRunnable(why),
            e => types::Error::Failed(e.to_string()),
        })
    }

    /// Resolves when this node's hold on `owner` ends (cluster mode; none on
    /// one machine, where it never does).
    fn tenure_of(&self, owner: &Owner) -> Option<weir_actors::placement::BoxFuture<'static, ()>> {
        let actors = self.fence.actors()?;
        let placement = actors.placement()?;
        let address = weir_actors::ActorAddress::new(&owner.class, &owner.name).ok()?;
        Some(placement.tenure(&address))
    }

    /// The values of a launch's secrets, from its owner's class's
    /// configuration, as environment variables; or which one is missing.
    pub(crate) fn secrets_for(
        &self,
        owner: &Owner,
        launch: &LaunchSpec,
    ) -> Result<Vec<(String, String)>, types::Error> {
        let class = self.config.secrets.get(&owner.class);
        launch
            .secret_env
            .iter()
            .map(|(variable, name)| match class.and_then(|c| c.get(name)) {
                Some(value) => Ok((variable.clone(), value.clone())),
                None => Err(types::Error::Failed(format!(
                    "secret `{name}` is not configured for actor class `{}`",
                    owner.class
                ))),
            })
            .collect()
    }

    /// `processes.kill`: true if it was running; idempotent.
    pub(crate) async fn kill(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
        pid: u64,
    ) -> Result<bool, types::Error> {
        let seat = seat.ok_or(types::Error::NotAnActor)?;
        let Some(process) = self.table.get(&owner_of(&seat), pid) else {
            return Ok(false);
        };
        // Its row goes in this turn, durably, before the kill: once the
        // owner asked for its end, no crash can bring it back, even if
        // the turn is cut while the process ends (the kill, once sent,
        // goes on without the turn).
        fenced_work::release_in_turn(&seat.gate, pid).map_err(types::Error::Failed)?;
        process.release_by_owner();
        Ok(process.kill().await)
    }

    /// The console of one of the caller's `lifetime` processes, running or
    /// among its last ended.
    fn console(
        &self,
        seat: Option<ActorSeat>,
        pid: u64,
    ) -> Result<(Arc<Process>, Arc<Console>), types::Error> {
        let seat = seat.ok_or(types::Error::NotAnActor)?;
        let process = self
            .table
            .recent(&owner_of(&seat), pid)
            .ok_or(types::Error::NoSuchProcess)?;
        let console = process.console().cloned().ok_or_else(|| {
            types::Error::WrongContract(format!(
                "process {pid} is a boot server: reach it at http://{pid}.process.internal/"
            ))
        })?;
        Ok((process, console))
    }

    /// `processes.wait`: bounded by `timeout-ms` and by the turn.
    pub(crate) async fn wait(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
        scope: Option<Arc<EventScope>>,
        pid: u64,
        timeout_ms: u32,
    ) -> Result<Option<processes::Exited>, types::Error> {
        let gate = seat.as_ref().map(|s| s.gate.clone());
        let (process, console) = self.console(seat, pid)?;
        let timeout = within_turn(scope.as_deref(), timeout_ms);
        let Some(exit) = console.wait(timeout).await else {
            return Ok(None);
        };
        if let Some(gate) = gate {
            forget_ended(&gate, &process)?;
        }
        let (stdout_tail, stderr_tail) = console.tails();
        Ok(Some(processes::Exited {
            exit_code: exit.exit_code,
            stopped: exit.stopped,
            stdout_tail,
            stderr_tail,
        }))
    }

    pub(crate) async fn write_stdin(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
        pid: u64,
        data: Vec<u8>,
    ) -> Result<u32, types::Error> {
        let (_, console) = self.console(seat, pid)?;
        console
            .write_stdin(&data)
            .map(|n| n as u32)
            .map_err(console_error)
    }

    pub(crate) async fn close_stdin(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
        pid: u64,
    ) -> Result<(), types::Error> {
        let (_, console) = self.console(seat, pid)?;
        console.close_stdin().map_err(console_error)
    }

    pub(crate) async fn read_output(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
        scope: Option<Arc<EventScope>>,
        read: OutputRead,
    ) -> Result<processes::OutputChunk, types::Error> {
        let (_, console) = self.console(seat, read.pid)?;
        let stream = match read.which {
            processes::OutputStream::Stdout => Stream::Stdout,
            processes::OutputStream::Stderr => Stream::Stderr,
        };
        let timeout = within_turn(scope.as_deref(), read.timeout_ms);
        let chunk = console
            .read(stream, read.offset, read.max_bytes as usize, timeout)
            .await;
        Ok(processes::OutputChunk {
            offset: chunk.offset,
            data: chunk.data,
            closed: chunk.closed,
        })
    }

    pub(crate) async fn status(
        self: Arc<Self>,
        seat: Option<ActorSeat>,
        pid: u64,
    ) -> Result<processes::ProcessInfo, types::Error> {
        let seat = seat.ok_or(types::Error::NotAnActor)?;
        let owner = owner_of(&seat);
        let process = self
            .table
            .recent(&owner, pid)
            .ok_or(types::Error::NoSuchProcess)?;
        forget_ended(&seat.gate, &process)?;
        Ok(info(&process))
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
            quota: None,
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
        // What it held goes back to the app's room, and to its owner's
        // quota if a process of the owner runs (else the next one measures
        // the disk anew).
        let slots = self.slots().map_err(types::Error::Failed)?;
        tokio::task::spawn_blocking(move || slots.remove(&owner, &dir, crate::slot_quota::measure))
            .await
            .map_err(|e| types::Error::Failed(e.to_string()))?
            .map_err(|e| types::Error::Failed(format!("cannot remove storage slot `{name}`: {e}")))
    }
}

/// Before its owner hears that `process` ended by itself: its journal
/// row goes in the owner's turn, durably (the deletion its end asked for
/// waits for the owner to be between turns, and a crash before it would
/// start again what the owner saw end). A process stopped with its launch
/// kept keeps its row: that launch is owed, not over.
fn forget_ended(gate: &weir_actors::gate::TurnGate, process: &Process) -> Result<(), types::Error> {
    if process.ended().is_none() || process.launch_kept() || process.released_by_owner() {
        return Ok(());
    }
    fenced_work::release_in_turn(gate, process.pid).map_err(types::Error::Failed)?;
    process.release_by_owner();
    Ok(())
}

fn owner_of(seat: &ActorSeat) -> Owner {
    Owner {
        class: seat.identity.class.clone(),
        name: seat.identity.name.clone(),
    }
}

fn info(process: &Process) -> processes::ProcessInfo {
    processes::ProcessInfo {
        pid: process.pid,
        image: process.image.to_string(),
        contract: match process.contract() {
            Contract::Boot => processes::Contract::Boot,
            Contract::Lifetime => processes::Contract::Lifetime,
        },
        slot: process.slot,
        state: match process.ended() {
            None => processes::State::Running,
            Some(why) => processes::State::Ended(why),
        },
        requests: process.requests(),
    }
}

/// A program's code, by contract.
enum Code {
    Server(Arc<ServerCode>),
    Command(Arc<CommandCode>),
}

/// The arguments of one `processes.read-output`.
pub(crate) struct OutputRead {
    pub pid: u64,
    pub which: processes::OutputStream,
    pub offset: u64,
    pub max_bytes: u32,
    pub timeout_ms: u32,
}

/// A wait of `timeout_ms`, cut to what is left of the calling turn (less
/// a margin, so the call returns before the turn's deadline stops it).
fn within_turn(scope: Option<&EventScope>, timeout_ms: u32) -> Duration {
    let asked = Duration::from_millis(u64::from(timeout_ms));
    match scope.and_then(EventScope::deadline) {
        Some(deadline) => asked.min(
            deadline
                .saturating_duration_since(Instant::now())
                .saturating_sub(TURN_MARGIN),
        ),
        None => asked,
    }
}

/// What a wait leaves of its turn: time to answer after it.
const TURN_MARGIN: Duration = Duration::from_millis(100);

fn console_error(e: ConsoleError) -> types::Error {
    match e {
        ConsoleError::Ended(why) => types::Error::Ended(why),
        e @ ConsoleError::StdinClosed => types::Error::Failed(e.to_string()),
    }
}

/// What a spawn asks the host to journal and hold for the process's life.
fn spec_bytes(spec: &processes::SpawnSpec) -> usize {
    text_bytes(&spec.args, &spec.env) + text_bytes(&[], &spec.secret_env) + spec.start_args.len()
}
