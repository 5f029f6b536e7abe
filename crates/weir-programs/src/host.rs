//! The host side of `weir:process` for actors, added to every app's
//! linker through the runtime's extension point ([`ProgramInterfaces`]):
//! the programs of a server ([`ProgramsHost`]), and `programs.run`, which
//! runs a stored command to completion from an actor's turn. The
//! processes' functions are in [`crate::process_host`], recovery in
//! [`crate::recovery`].
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
//!   so a server that runs no program pays nothing for it;
//! - what a run holds in the host beside its caller's own copies — its
//!   stdin, arguments and environment, and up to `max_run_output_bytes`
//!   of captured output — is held out of that budget while it runs, or
//!   the run is refused (`memory_budget_exceeded`) before it loads: the
//!   caller's copies are its linear memory, counted already, and many
//!   runs at once held as much again beside the budget.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use wasmtime::component::Linker;
use weir_actors::StorageRoom;
use weir_actors::bindings::ActorSeat;
use weir_runtime::code::HostInterfaces;
use weir_runtime::compiled_code::Compiler;
use weir_runtime::guest_log::GuestLog;
use weir_runtime::guest_state::GenerationState;
use weir_runtime::memory_budget::MemoryBudget;
use weir_runtime::metrics::AppMetrics;
use weir_runtime::outbound::OutboundRules;
use weir_runtime::receipt::ReceiptSink;
use weir_runtime::{LoadError, WeirEngine, WeirError};

use crate::RunSpec;
use crate::program_threads::ProgramThreads;
use weir_runtime::scope::EventScope;

use crate::fenced_work::Fence;
use crate::image_store::{Digest, ImageStore, Root};
use crate::loader::{Loader, ProgramLoadError};
use crate::metrics::ProgramMetrics;
use crate::one_shot::{self, Output, RunLimits, Stdin};
use crate::process_host::OutputRead;
use crate::process_table::ProcessTable;
use crate::shared_images::ImageMirror;
use crate::storage_slot::Slots;

pub(crate) mod generated {
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
    /// The app's storage room, which its actors' slots share with their
    /// databases (`max_actor_storage_bytes`).
    pub room: Arc<StorageRoom>,
    pub compiler: Compiler,
    pub limits: RunLimits,
    pub outbound: OutboundRules,
    pub budget: Arc<MemoryBudget>,
    pub metrics: AppMetrics,
    pub program_metrics: ProgramMetrics,
    pub receipts: Option<Arc<dyn ReceiptSink>>,
    /// Where resident processes' stdout and stderr go: the app's records
    /// in Weir's log.
    pub guest_log: Option<Arc<GuestLog>>,
    /// Each actor class's secrets, by name, as the server's configuration
    /// gives them (what `secret-env` names resolve to).
    pub secrets: Secrets,
    /// Why a resident process may not have a durable storage slot here,
    /// if it may not (cluster mode: a slot is one node's files, and would
    /// not follow its owner to another node).
    pub durable_slots_refused: Option<&'static str>,
    /// Cluster mode: the images every node shares, fetched into this
    /// node's store when a turn names one it lacks.
    pub mirror: Option<Arc<ImageMirror>>,
}

/// Secrets by actor class, then by name.
pub type Secrets = std::collections::HashMap<String, std::collections::HashMap<String, String>>;

/// The programs of one server: made ready at the first run.
pub struct ProgramsHost {
    pub(crate) config: ProgramsConfig,
    loader: OnceLock<Result<Arc<Loader>, String>>,
    /// Opened at the app's start ([`ProgramsHost::open_slots`]), or else
    /// at the first spawn: when a crash's leftover ephemeral slots are
    /// deleted and the durable ones are counted in the room.
    slots: OnceLock<Result<Arc<Slots>, String>>,
    /// Where processes run, started at the first spawn.
    threads: OnceLock<Result<ProgramThreads, String>>,
    /// The launch journal's way to owners outside their turns.
    pub(crate) fence: Arc<Fence>,
    /// The resident processes, by owner.
    pub table: Arc<ProcessTable>,
    /// Set as the server shuts down: no process starts after it.
    stopping: std::sync::atomic::AtomicBool,
    /// Owners whose processes are owed a take-over on this node (cluster
    /// mode, [`crate::handover`]).
    pub(crate) owed: crate::handover::Owed,
}

/// How long a server's shutdown waits for its processes to end: a kill
/// ends a process at its next epoch tick, or as soon as the request it
/// serves is cut, so this is reached only by a process whose host call
/// does not return.
pub const PROCESS_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// What a spawn that comes after the server began to shut down is told.
pub const SHUTTING_DOWN: &str = "the server is shutting down; spawn again once it is back";

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
            threads: OnceLock::new(),
            fence: Arc::new(Fence::default()),
            table,
            stopping: std::sync::atomic::AtomicBool::new(false),
            owed: Default::default(),
        })
    }

    /// True once the server began to shut down.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The server is shutting down (its requests are answered): no process
    /// starts from now on, and every live one ends, each with a receipt
    /// (`stopped`), its launch journal row kept, so that the next start
    /// recovers it as after a crash (by its `on_crash`). A spawn that was booting when this
    /// began is stopped once it is up. Bounded by [`PROCESS_STOP_GRACE`].
    pub async fn stop_with_server(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let stop_all = async {
            // Until no slot is held: a spawn that was booting is stopped
            // once it runs (the flag keeps any later one from starting).
            loop {
                let mut stops = tokio::task::JoinSet::new();
                for process in self.table.all() {
                    stops.spawn(async move { process.stop_with_server().await });
                }
                stops.join_all().await;
                if self.table.counts().1 == 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        if tokio::time::timeout(PROCESS_STOP_GRACE, stop_all)
            .await
            .is_err()
        {
            tracing::warn!(
                left = self.table.all().len(),
                "resident processes did not end within the shutdown's grace; they end with the server"
            );
        }
    }

    /// Where processes run (see [`crate::program_threads`]).
    pub(crate) fn program_threads(&self) -> Result<tokio::runtime::Handle, String> {
        match self.threads.get_or_init(|| {
            ProgramThreads::start().map_err(|e| format!("cannot start the program threads: {e}"))
        }) {
            Ok(threads) => Ok(threads.handle()),
            Err(why) => Err(why.clone()),
        }
    }

    pub(crate) fn loader(&self) -> Result<Arc<Loader>, String> {
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
                    c.guest_log.clone(),
                )
                .map(Arc::new)
                .map_err(|e| e.to_string())
            })
            .clone()
    }

    /// Compiles a pushed image for this host's programs engine (see
    /// [`Loader::prepare`]). Blocking: call it off the runtime's threads.
    pub fn prepare_image(&self, digest: &Digest) -> Result<(), String> {
        let loader = self.loader()?;
        let mut root = loader.images.root(digest).map_err(|e| e.to_string())?;
        loader.prepare(&mut root).map_err(|e| e.to_string())
    }

    /// Opens the storage slots now (blocking): their leftovers are
    /// deleted and what the durable ones hold is counted in the app's
    /// storage room before its actors run.
    pub fn open_slots(&self) -> Result<(), String> {
        self.slots().map(drop)
    }

    pub(crate) fn slots(&self) -> Result<Arc<Slots>, String> {
        self.slots
            .get_or_init(|| {
                Slots::open(&self.config.slots_dir, self.config.room.clone())
                    .map(Arc::new)
                    .map_err(|e| format!("cannot open {}: {e}", self.config.slots_dir.display()))
            })
            .clone()
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
        let (scope, _op) = operation(scope)?;
        let digest = parse_digest(&call.image)?;
        let held = call.host_bytes() + self.config.limits.programs.max_run_output_bytes;
        let Some(_held) = self.config.budget.hold(held).await else {
            return Err(types::Error::Limit(format!(
                "memory_budget_exceeded: the run would hold {held} bytes in the host (its stdin, arguments and environment, and up to max_run_output_bytes of output) beyond max_total_guest_memory_bytes ({})",
                self.config.budget.limit()
            )));
        };
        let _here = self.image_here(digest).await?;
        let (root, program) = self
            .load_blocking(move |loader| {
                let mut root = loader.images.root(&digest)?;
                let program = loader.load(&mut root, &digest.to_string())?;
                Ok((root, program))
            })
            .await?;
        let loader = self.loader().map_err(types::Error::Failed)?;
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

/// `programs.run`'s parameters as the component model lifts them.
type RunParams = (String, Vec<String>, Vec<(String, String)>, Vec<u8>);

/// `processes.read-output`'s parameters.
type ReadParams = (u64, processes::OutputStream, u64, u32, u32);

/// The arguments of one `programs.run`.
struct RunCall {
    image: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    stdin: Vec<u8>,
}

impl RunCall {
    /// What the host holds of the call while the run lasts.
    fn host_bytes(&self) -> u64 {
        (self.stdin.len() + text_bytes(&self.args, &self.env)) as u64
    }
}

/// The bytes of arguments and of (name, value) pairs a guest hands the
/// host for a program.
pub(crate) fn text_bytes(args: &[String], pairs: &[(String, String)]) -> usize {
    args.iter().map(String::len).sum::<usize>()
        + pairs.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
}

impl ProgramsHost {
    /// Makes sure this node's store holds `digest` before it is loaded:
    /// in cluster mode, an image pushed to another node is fetched first
    /// (see [`crate::shared_images`]). The root it returns holds the image
    /// until the caller's load has rooted it too.
    pub(crate) async fn image_here(&self, digest: Digest) -> Result<Option<Root>, types::Error> {
        let Some(mirror) = &self.config.mirror else {
            return Ok(None);
        };
        let loader = self.loader().map_err(types::Error::Failed)?;
        match mirror.here(&loader.images, digest).await {
            Ok((root, _)) => Ok(Some(root)),
            Err(e) => Err(to_guest_error(e.into())),
        }
    }

    /// Runs `f` with the loader off the async workers (loading may
    /// compile, and it reads files).
    pub(crate) async fn load_blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Loader) -> Result<T, ProgramLoadError> + Send + 'static,
    ) -> Result<T, types::Error> {
        let loader = self.loader().map_err(types::Error::Failed)?;
        match tokio::task::spawn_blocking(move || f(&loader)).await {
            Ok(Ok(loaded)) => Ok(loaded),
            Ok(Err(e)) => Err(to_guest_error(e)),
            Err(e) => Err(types::Error::Failed(format!(
                "loading the program failed: {e}"
            ))),
        }
    }
}

/// The turn's scope and one operation registered in it: what every
/// program call of a turn holds while it runs.
pub(crate) fn operation(
    scope: Option<Arc<EventScope>>,
) -> Result<(Arc<EventScope>, weir_runtime::scope::Operation), types::Error> {
    let scope = scope.ok_or_else(|| types::Error::Failed("event_scope_closed".into()))?;
    let op = scope
        .register()
        .map_err(|e| types::Error::Failed(e.to_string()))?;
    Ok((scope, op))
}

/// An image digest from a guest, or the `image` error naming why not.
pub(crate) fn parse_digest(image: &str) -> Result<Digest, types::Error> {
    image
        .parse()
        .map_err(|e: crate::ImageError| types::Error::Image(coded(e.code(), &e)))
}

/// `code: message`, the way guests and operators read Weir's failures.
pub(crate) fn coded(code: impl WeirError, e: &dyn std::fmt::Display) -> String {
    format!("{}: {e}", code.as_str())
}

pub(crate) fn to_guest_error(e: ProgramLoadError) -> types::Error {
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
        processes.func_wrap_async("wait", move |store, (pid, timeout_ms): (u64, u32)| {
            let (seat, scope) = caller(store.data());
            let host = host.clone();
            Box::new(async move { Ok((host.wait(seat, scope, pid, timeout_ms).await,)) })
        })?;
        let host = self.0.clone();
        processes.func_wrap_async("write-stdin", move |store, (pid, data): (u64, Vec<u8>)| {
            let (seat, _) = caller(store.data());
            let host = host.clone();
            Box::new(async move { Ok((host.write_stdin(seat, pid, data).await,)) })
        })?;
        let host = self.0.clone();
        processes.func_wrap_async("close-stdin", move |store, (pid,): (u64,)| {
            let (seat, _) = caller(store.data());
            let host = host.clone();
            Box::new(async move { Ok((host.close_stdin(seat, pid).await,)) })
        })?;
        let host = self.0.clone();
        processes.func_wrap_async(
            "read-output",
            move |store, (pid, which, offset, max_bytes, timeout_ms): ReadParams| {
                let (seat, scope) = caller(store.data());
                let host = host.clone();
                let read = OutputRead {
                    pid,
                    which,
                    offset,
                    max_bytes,
                    timeout_ms,
                };
                Box::new(async move { Ok((host.read_output(seat, scope, read).await,)) })
            },
        )?;
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
