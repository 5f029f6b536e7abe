//! A resident process: one long-lived instance of a `wasi:http` server,
//! started once per spawn and kept until it is killed or fails, serving
//! the requests its owner sends it one at a time, each as a buffered call
//! on the runtime's invocation machine.
//!
//! Invariants owned here:
//! - `start` (the `weir:process/boot` export, if there is one) runs exactly
//!   once per spawn, before any request reaches the instance; the instance
//!   is never retired, so every request after boot sees the same start;
//! - each request is bounded like a worker event (`event_limit_ms`, the
//!   response body by `max_response_body_bytes`), at most
//!   [`MAX_PROCESS_QUEUED`] wait for it, and one that fails by cutting the
//!   guest short (a trap, its deadline, memory) ends the process: its
//!   instance holds a half-run call and is not trusted again;
//! - kill and loss are loud: a request to an ended process, queued or new,
//!   gets `process_ended` with how it ended, never a hang. Kill is
//!   idempotent and returns once the process is fully gone; only then is
//!   its slot given back;
//! - every process ends with one receipt (pid, owner, image, contract,
//!   outcome, requests, CPU time, peak memory).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};
use wasmtime::component::TypedFunc;
use weir_runtime::buffered;
use weir_runtime::error_code::error_response;
use weir_runtime::generation::Generation;
use weir_runtime::invocation::{self, Ending, NoResponse, Timing};
use weir_runtime::metrics::AppMetrics;
use weir_runtime::receipt::{ReceiptSink, Terminal, write_receipt};
use weir_runtime::scope::EventScope;
use weir_runtime::{AppCode, Limits, WeirError};

use crate::error_code::ProgramErrorCode;
use crate::fenced_work::Fence;
use crate::image_store::{Digest, Root};
use crate::metrics::ProgramMetrics;
use crate::one_shot::Timed;
use crate::process_table::{Owner, ProcessTable, Reserved};
use crate::storage_slot::SLOT_GUEST_PATH;

/// Requests that may wait for one process: it serves one at a time, so
/// its queue is its latency; past 64, refusing fast (503
/// `process_overloaded`) serves the owner better than waiting.
pub const MAX_PROCESS_QUEUED: usize = 64;

/// The export a booting program may have.
pub const BOOT_INTERFACE: &str = "weir:process/boot@0.1.0";

/// The log target of process receipts.
pub const PROCESS_TARGET: &str = "weir::process";

/// `start: func(args: list<u8>) -> result<list<u8>, string>`.
type StartFunc = TypedFunc<(Vec<u8>,), (Result<Vec<u8>, String>,)>;

/// One request for the process and where its answer goes.
struct Job {
    request: http::Request<Bytes>,
    reply: oneshot::Sender<http::Response<Bytes>>,
}

/// A storage slot a process uses.
#[derive(Clone, Debug)]
pub struct SlotUse {
    pub name: String,
    pub durable: bool,
    /// On the host; the process sees it at `/data`.
    pub dir: std::path::PathBuf,
}

/// A running (or just ended) resident process.
pub struct Resident {
    pub pid: u64,
    pub owner: Owner,
    pub image: Digest,
    pub slot: u32,
    /// Its storage slot, if it has one.
    pub storage: Option<SlotUse>,
    requests: AtomicU64,
    memory: AtomicU64,
    /// Its owner deletes its journal row itself (a kill in the owner's
    /// turn); otherwise its end does.
    released_by_owner: std::sync::atomic::AtomicBool,
    /// How it ended; none while it runs.
    ended: Mutex<Option<String>>,
    jobs: mpsc::Sender<Job>,
    kill: watch::Sender<bool>,
    done: watch::Receiver<bool>,
}

/// Why a spawn failed after its slot was reserved.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("the program could not be instantiated: {0}")]
    Instantiate(String),
    #[error("the program's start failed: {0}")]
    Start(String),
}

/// Everything a spawn needs.
pub struct Spawn {
    /// The pid and slot, given back if the spawn does not finish.
    pub reserved: Reserved,
    pub code: Arc<AppCode>,
    pub root: Root,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub start_args: Vec<u8>,
    /// The directory preopened at `/data`, made ready by the caller.
    pub storage: Option<SlotUse>,
    /// The boot must be done by then (the spawning turn's deadline).
    pub deadline: Instant,
    pub table: Arc<ProcessTable>,
    /// Deletes the journal row of a process that ended by itself.
    pub fence: Arc<Fence>,
    pub metrics: AppMetrics,
    pub program_metrics: ProgramMetrics,
    pub receipts: Option<Arc<dyn ReceiptSink>>,
}

impl Resident {
    /// Linear memory the instance has reached, as of its last request.
    pub fn memory_bytes(&self) -> u64 {
        self.memory.load(Ordering::Relaxed)
    }

    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// How the process ended, or none while it runs.
    pub fn ended(&self) -> Option<String> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Serves one request from the owner: the process's answer, or Weir's
    /// error when it cannot (ended, overloaded).
    pub async fn request(&self, request: http::Request<Bytes>) -> http::Response<Bytes> {
        let (reply, answer) = oneshot::channel();
        if let Err(e) = self.jobs.try_send(Job { request, reply }) {
            return match e {
                mpsc::error::TrySendError::Full(_) => {
                    error_response(ProgramErrorCode::ProcessOverloaded)
                }
                mpsc::error::TrySendError::Closed(_) => self.ended_response(),
            };
        }
        match answer.await {
            Ok(response) => response,
            // The process ended with the request queued or running.
            Err(_) => self.ended_response(),
        }
    }

    fn ended_response(&self) -> http::Response<Bytes> {
        let why = self.ended().unwrap_or_else(|| "ended".into());
        crate::process_router::ended_response(self.pid, &why)
    }

    /// The owner deletes this process's journal row in its own turn.
    pub fn release_by_owner(&self) {
        self.released_by_owner.store(true, Ordering::Relaxed);
    }

    /// Ends the process; true if it was running. Returns once its instance
    /// is dropped and its slot is free.
    pub async fn kill(&self) -> bool {
        let was_running = self.ended().is_none();
        let _ = self.kill.send(true);
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
        was_running
    }

    /// Boots the program and leaves it serving: the process and what its
    /// `start` returned. On failure the slot is given back before this
    /// returns.
    pub async fn spawn(spawn: Spawn) -> Result<(Arc<Resident>, Vec<u8>), SpawnError> {
        let Spawn {
            reserved,
            code,
            root,
            args,
            env,
            start_args,
            storage,
            deadline,
            table,
            fence,
            metrics,
            program_metrics,
            receipts,
        } = spawn;
        let (owner, reservation) = (reserved.owner.clone(), reserved.reservation);
        // Dropping `reserved` on any early return gives the slot back.
        // An ephemeral slot of a spawn that failed goes before its slot
        // number is given back (off the async workers: a failed start may
        // have filled it).
        let ephemeral = storage
            .as_ref()
            .filter(|s| !s.durable)
            .map(|s| s.dir.clone());
        let cleanup = || async {
            if let Some(dir) = ephemeral.clone() {
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
            }
        };
        let cpu = Arc::new(AtomicU64::new(0));
        let mut wasi = wasmtime_wasi::WasiCtx::builder();
        wasi.arg(root.digest().to_string())
            .args(&args)
            .envs(&env)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        if let Some(slot) = &storage
            && let Err(e) = wasi.preopened_dir(
                &slot.dir,
                SLOT_GUEST_PATH,
                wasmtime_wasi::FsPerms::ReadWrite,
            )
        {
            cleanup().await;
            return Err(SpawnError::Instantiate(format!(
                "cannot open its storage slot `{}`: {e:#}",
                slot.name
            )));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let made = tokio::time::timeout(
            left,
            Timed::new(
                Generation::instantiate_with(
                    &code,
                    &metrics,
                    reservation.pid,
                    Default::default(),
                    wasi,
                ),
                &cpu,
            ),
        )
        .await;
        let mut generation = match made {
            Ok(Ok(generation)) => generation,
            Ok(Err(e)) => {
                cleanup().await;
                return Err(SpawnError::Instantiate(e.reason));
            }
            Err(_) => {
                cleanup().await;
                return Err(SpawnError::Instantiate(
                    "the spawning turn's deadline passed".into(),
                ));
            }
        };
        let payload = match boot(&code, &mut generation, start_args, deadline, &cpu).await {
            Ok(payload) => payload,
            Err(why) => {
                drop(generation);
                cleanup().await;
                return Err(SpawnError::Start(why));
            }
        };
        let (jobs, queue) = mpsc::channel(MAX_PROCESS_QUEUED);
        let (kill, killed) = watch::channel(false);
        let (finished, done) = watch::channel(false);
        let resident = Arc::new(Resident {
            pid: reservation.pid,
            owner: owner.clone(),
            image: root.digest(),
            slot: reservation.slot,
            storage: storage.clone(),
            requests: AtomicU64::new(0),
            memory: AtomicU64::new(generation.memory_bytes() as u64),
            released_by_owner: std::sync::atomic::AtomicBool::new(false),
            ended: Mutex::new(None),
            jobs,
            kill,
            done,
        });
        reserved.started(resident.clone());
        let started = Instant::now();
        let serving = resident.clone();
        tokio::spawn(async move {
            let ended = serve(&serving, &mut generation, &code.limits, queue, killed, &cpu).await;
            *serving.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(ended.clone());
            let peak = generation.memory_bytes();
            // Fully gone first: the instance, then the image's root, and
            // only then the slot.
            drop(generation);
            drop(root);
            if let Some(slot) = serving.storage.clone().filter(|s| !s.durable) {
                let _ =
                    tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&slot.dir)).await;
            }
            table.ended(&serving.owner, reservation, &ended);
            if !serving.released_by_owner.load(Ordering::Relaxed) {
                fence.release_later(&serving.owner, serving.pid);
            }
            program_metrics.exited(if ended == "killed" {
                "killed"
            } else {
                "failed"
            });
            if let Some(sink) = &receipts {
                write_process_receipt(sink.as_ref(), &serving, &ended, &cpu, peak, started);
            }
            let _ = finished.send(true);
        });
        Ok((resident, payload))
    }
}

/// Runs the program's `start`, if it exports one, once.
async fn boot(
    code: &AppCode,
    generation: &mut Generation,
    args: Vec<u8>,
    deadline: Instant,
    cpu: &AtomicU64,
) -> Result<Vec<u8>, String> {
    let index = code
        .component
        .get_export_index(None, BOOT_INTERFACE)
        .and_then(|interface| code.component.get_export_index(Some(&interface), "start"));
    let Some(index) = index else {
        return Ok(Vec::new());
    };
    let start: StartFunc = generation
        .instance
        .get_typed_func(&mut generation.store, index)
        .map_err(|e| format!("its start export: {e:#}"))?;
    let scope = EventScope::new(code.limits.max_operations);
    generation.store.data_mut().set_scope(Some(scope.clone()));
    let ending = invocation::run(
        Timed::new(start.call_async(&mut generation.store, (args,)), cpu),
        None,
        &scope,
        Timing {
            deadline,
            cancellation_limit: code.limits.cancellation_limit,
        },
        None,
        &mut NoResponse,
    )
    .await;
    let failure = ending.failure(generation.store.data());
    generation.store.data_mut().set_scope(None);
    invocation::settle(&scope, failure.is_some(), code.limits.cleanup_timeout).await;
    match (ending, failure) {
        (Ending::Returned((Ok(payload),)), _) => Ok(payload),
        (Ending::Returned((Err(message),)), _) => Err(message),
        (_, Some((_, code, detail))) => Err(match detail {
            Some(detail) => format!("{}: {detail}", code.as_str()),
            None => code.as_str().to_string(),
        }),
        (_, None) => Err("start did not finish".into()),
    }
}

/// Serves requests until the process is killed or fails; returns how it
/// ended.
async fn serve(
    resident: &Resident,
    generation: &mut Generation,
    limits: &Limits,
    mut queue: mpsc::Receiver<Job>,
    mut killed: watch::Receiver<bool>,
    cpu: &AtomicU64,
) -> String {
    loop {
        let job = tokio::select! {
            biased;
            _ = killed.wait_for(|k| *k) => return "killed".into(),
            job = queue.recv() => match job {
                Some(job) => job,
                None => return "killed".into(),
            },
        };
        let deadline = Instant::now() + limits.event_limit;
        let scope = EventScope::new(limits.max_operations);
        scope.set_deadline(deadline);
        generation.store.data_mut().set_scope(Some(scope.clone()));
        let call = tokio::select! {
            biased;
            _ = killed.wait_for(|k| *k) => return "killed".into(),
            call = Timed::new(buffered::call(generation, &scope, job.request, limits, deadline), cpu) => call,
        };
        generation.store.data_mut().set_scope(None);
        invocation::settle(&scope, call.failure.is_some(), limits.cleanup_timeout).await;
        resident.requests.fetch_add(1, Ordering::Relaxed);
        resident
            .memory
            .store(generation.memory_bytes() as u64, Ordering::Relaxed);
        // A process whose request cut it short has ended before its owner
        // hears of it: whatever the owner asks next sees it ended.
        let ended = call.cut_short.then(|| {
            let (code, detail) = call
                .failure
                .clone()
                .unwrap_or((weir_runtime::ErrorCode::InstanceAbandoned, None));
            let why = match detail {
                Some(detail) => format!("{}: {detail}", code.as_str()),
                None => code.as_str().to_string(),
            };
            *resident.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
            why
        });
        let _ = job.reply.send(match (call.answer, &call.failure) {
            (Ok(response), None) => response,
            (_, Some((code, _))) => error_response(*code),
            (Err((code, _)), None) => error_response(code),
        });
        if let Some(why) = ended {
            return why;
        }
    }
}

/// What only a process receipt has.
#[derive(Serialize)]
struct ProcessFields<'a> {
    pid: u64,
    class: &'a str,
    name: &'a str,
    image: Digest,
    contract: &'static str,
    slot: u32,
    requests: u64,
    cpu_us: u64,
    peak_memory_bytes: usize,
}

fn write_process_receipt(
    sink: &dyn ReceiptSink,
    resident: &Resident,
    ended: &str,
    cpu: &AtomicU64,
    peak: usize,
    started: Instant,
) {
    let killed = ended == "killed";
    let cpu_us = Duration::from_nanos(cpu.load(Ordering::Relaxed)).as_micros() as u64;
    write_receipt(
        sink,
        PROCESS_TARGET,
        "process",
        SystemTime::now(),
        &ProcessFields {
            pid: resident.pid,
            class: &resident.owner.class,
            name: &resident.owner.name,
            image: resident.image,
            contract: "boot",
            slot: resident.slot,
            requests: resident.requests(),
            cpu_us,
            peak_memory_bytes: peak,
        },
        &Terminal {
            outcome: if killed { "killed" } else { "failed" },
            error: (!killed).then_some(ProgramErrorCode::ProcessEnded.as_str()),
            status: None,
            queued_us: None,
            wasm_us: Some(cpu_us),
            total_us: started.elapsed().as_micros() as u64,
            operations: 0,
            operations_refused: 0,
            detail: (!killed).then_some(ended),
        },
    );
}
