//! A process: what every resident process is and how every one ends,
//! whatever its contract — a `boot` server ([`crate::resident`]) or a
//! `lifetime` command ([`crate::lifetime`]).
//!
//! Invariants owned here:
//! - a process gets nothing ambient: its arguments and environment, a
//!   preopened `/data` only when its spec names a storage slot, no socket
//!   (TCP, UDP and name lookup are off);
//! - a process ends once, in one order: its instance is dropped, then its
//!   image's root, then its ephemeral slot's directory, and only then is
//!   its slot given back; its journal row goes (unless its owner deleted
//!   it in its own turn, or the server stopped it: then the row stays, and
//!   the next start recovers it by its `on_crash`), and it leaves one receipt (pid,
//!   owner, image, contract, outcome, exit code, requests, CPU time, peak
//!   memory);
//! - kill is idempotent and returns once the process is fully gone.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use weir_runtime::WeirError;
use weir_runtime::extension::Extras;
use weir_runtime::metrics::AppMetrics;
use weir_runtime::receipt::{ReceiptSink, Terminal, write_receipt};

use crate::error_code::ProgramErrorCode;
use crate::fenced_work::Fence;
use crate::image_store::{Digest, Root};
use crate::lifetime::Console;
use crate::metrics::ProgramMetrics;
use crate::process_table::{Owner, ProcessTable, Reserved};
use crate::resident::Job;
use crate::slot_filesystem::SlotCharge;
use crate::slot_quota::SlotQuota;
use crate::storage_slot::SLOT_GUEST_PATH;

/// The log target of process receipts.
pub const PROCESS_TARGET: &str = "weir::process";

/// How a process lives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Contract {
    /// A `wasi:http` server, booted once, serving its owner's requests.
    #[default]
    Boot,
    /// A command (`wasi:cli/run`) run once for the process's whole life;
    /// its owner writes its stdin, reads its output and waits for its exit.
    Lifetime,
}

impl Contract {
    pub fn as_str(self) -> &'static str {
        match self {
            Contract::Boot => "boot",
            Contract::Lifetime => "lifetime",
        }
    }
}

/// A storage slot a process uses.
#[derive(Clone, Debug)]
pub struct SlotUse {
    pub name: String,
    pub durable: bool,
    /// On the host; the process sees it at `/data`.
    pub dir: PathBuf,
    /// The owner's quota, which every write into the slot counts against
    /// (set when the spawn measured it).
    pub quota: Option<Arc<SlotQuota>>,
}

impl SlotUse {
    /// What the process's store carries for its slot's filesystem.
    pub(crate) fn extras(slot: Option<&SlotUse>) -> Extras {
        let charge = slot
            .and_then(|s| s.quota.clone())
            .map(|q| Box::new(SlotCharge::new(q)) as Box<dyn std::any::Any + Send>);
        Extras {
            data: charge,
            ..Default::default()
        }
    }

    /// Deletes an ephemeral slot (blocking), giving back what it held.
    pub(crate) fn delete(&self) {
        if let Some(quota) = &self.quota {
            quota.release(crate::slot_quota::measure(&self.dir));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Why a spawn failed after its slot was reserved.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("the program could not be instantiated: {0}")]
    Instantiate(String),
    #[error("the program's start failed: {0}")]
    Start(String),
    #[error("{0}")]
    NotRunnable(String),
}

/// Everything a spawn needs, whatever the contract.
pub struct Spawn {
    /// The pid and slot, given back if the spawn does not finish.
    pub reserved: Reserved,
    pub root: Root,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub start_args: Vec<u8>,
    /// The directory preopened at `/data`, made ready by the caller.
    pub storage: Option<SlotUse>,
    /// The boot must be done by then (the spawning turn's deadline).
    pub deadline: Instant,
    /// Ends the boot early when it fires (in cluster mode, the end of this
    /// node's hold on the owner): it is cut as at its deadline, and given
    /// back the same way.
    pub cancel: Option<tokio::sync::oneshot::Receiver<()>>,
    pub table: Arc<ProcessTable>,
    /// Deletes the journal row of a process that ended by itself.
    pub fence: Arc<Fence>,
    pub metrics: AppMetrics,
    pub program_metrics: ProgramMetrics,
    pub receipts: Option<Arc<dyn ReceiptSink>>,
    /// Where the process runs once booted: the program threads, never the
    /// request workers (see [`crate::program_threads`]).
    pub threads: tokio::runtime::Handle,
}

impl Spawn {
    /// The process's WASI context: its arguments (after `argv[0]`, the
    /// digest) and environment, its slot at `/data`, no sockets. Its stdio
    /// is the contract's to set.
    pub(crate) fn wasi(&self) -> Result<wasmtime_wasi::WasiCtxBuilder, SpawnError> {
        let mut wasi = wasmtime_wasi::WasiCtx::builder();
        wasi.arg(self.root.digest().to_string())
            .args(&self.args)
            .envs(&self.env)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        if let Some(slot) = &self.storage {
            wasi.preopened_dir(
                &slot.dir,
                SLOT_GUEST_PATH,
                wasmtime_wasi::FsPerms::ReadWrite,
            )
            .map_err(|e| {
                SpawnError::Instantiate(format!(
                    "cannot open its storage slot `{}`: {e:#}",
                    slot.name
                ))
            })?;
        }
        Ok(wasi)
    }

    /// Deletes the ephemeral slot of a spawn that failed, before its slot
    /// number is given back (off the async workers: a failed start may
    /// have filled it).
    pub(crate) async fn abandon(self, why: SpawnError) -> SpawnError {
        if let Some(slot) = self.storage.filter(|s| !s.durable) {
            let _ = tokio::task::spawn_blocking(move || slot.delete()).await;
        }
        // Dropping `reserved` gives the slot back.
        why
    }

    /// The process record, before it is started; and what ends it.
    pub(crate) fn process(self, door: Door) -> (Arc<Process>, Afterlife) {
        let (kill, killed) = watch::channel(false);
        let (finished, done) = watch::channel(false);
        let reservation = self.reserved.reservation;
        let process = Arc::new(Process {
            pid: reservation.pid,
            owner: self.reserved.owner.clone(),
            image: self.root.digest(),
            slot: reservation.slot,
            storage: self.storage,
            requests: AtomicU64::new(0),
            memory: Arc::new(AtomicU64::new(0)),
            released_by_owner: AtomicBool::new(false),
            kept: Mutex::new(None),
            ended: Mutex::new(None),
            kill,
            done,
            door,
        });
        self.reserved.started(process.clone());
        let afterlife = Afterlife {
            killed,
            finished,
            root: self.root,
            table: self.table,
            fence: self.fence,
            program_metrics: self.program_metrics,
            receipts: self.receipts,
            started: Instant::now(),
        };
        (process, afterlife)
    }
}

/// How the owner reaches a process: its contract's own door.
pub(crate) enum Door {
    /// A `boot` server's queue of requests.
    Requests(tokio::sync::mpsc::Sender<Job>),
    /// A `lifetime` command's stdin, output and exit.
    Console(Arc<Console>),
}

/// A running (or just ended) process.
pub struct Process {
    pub pid: u64,
    pub owner: Owner,
    pub image: Digest,
    pub slot: u32,
    /// Its storage slot, if it has one.
    pub storage: Option<SlotUse>,
    pub(crate) requests: AtomicU64,
    /// Linear memory reached (a lifetime command's store keeps it current).
    pub(crate) memory: Arc<AtomicU64>,
    /// Its owner deletes its journal row itself (a kill in the owner's
    /// turn); otherwise its end does.
    released_by_owner: AtomicBool,
    /// Stopped with its journal row kept (the server shuts down, or this
    /// node no longer holds its owner): why, as its end says.
    kept: Mutex<Option<&'static str>>,
    /// How it ended; none while it runs.
    ended: Mutex<Option<String>>,
    kill: watch::Sender<bool>,
    done: watch::Receiver<bool>,
    pub(crate) door: Door,
}

impl Process {
    pub fn contract(&self) -> Contract {
        match self.door {
            Door::Requests(_) => Contract::Boot,
            Door::Console(_) => Contract::Lifetime,
        }
    }

    /// Linear memory the instance has reached, as last seen.
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

    /// Marks the process ended (the first mark stands).
    pub(crate) fn mark_ended(&self, why: &str) {
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        if ended.is_none() {
            *ended = Some(why.to_string());
        }
    }

    /// The console of a `lifetime` process.
    pub fn console(&self) -> Option<&Arc<Console>> {
        match &self.door {
            Door::Console(console) => Some(console),
            Door::Requests(_) => None,
        }
    }

    /// The owner deletes this process's journal row in its own turn.
    pub fn release_by_owner(&self) {
        self.released_by_owner.store(true, Ordering::Relaxed);
    }

    /// True once its owner's turn deleted its journal row (or took that on).
    pub fn released_by_owner(&self) -> bool {
        self.released_by_owner.load(Ordering::Relaxed)
    }

    /// Ends the process because the server is shutting down: as a kill,
    /// but its journal row stays, so the next start recovers it (by its
    /// `on_crash`), and its receipt says `stopped`.
    pub async fn stop_with_server(&self) -> bool {
        self.stop_keeping_launch(STOPPED).await
    }

    /// Ends the process because this node no longer holds its owner (cluster
    /// mode: the owner moved, or this node's lease lapsed): as a kill, but
    /// its journal row stays, so that the node that holds the owner next
    /// starts it again by its `on_crash`; its receipt says `stopped`.
    pub async fn stop_for_handover(&self) -> bool {
        self.stop_keeping_launch(HANDED_OVER).await
    }

    async fn stop_keeping_launch(&self, why: &'static str) -> bool {
        self.kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(why);
        self.kill().await
    }

    /// True once a stop that keeps its journal row was asked for.
    pub fn stop_asked(&self) -> bool {
        self.kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// True when it ended stopped with its journal row kept: its launch is
    /// owed, not over.
    pub fn launch_kept(&self) -> bool {
        matches!(self.ended().as_deref(), Some(STOPPED | HANDED_OVER))
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
}

/// What a process's end does, held by the task that runs it.
pub(crate) struct Afterlife {
    /// Set by [`Process::kill`].
    pub(crate) killed: watch::Receiver<bool>,
    finished: watch::Sender<bool>,
    root: Root,
    table: Arc<ProcessTable>,
    fence: Arc<Fence>,
    program_metrics: ProgramMetrics,
    receipts: Option<Arc<dyn ReceiptSink>>,
    started: Instant,
}

/// How a process ended, for its receipt.
pub(crate) struct Ended {
    /// `killed`, `exited`, or the failure.
    pub(crate) why: String,
    pub(crate) exit_code: Option<i32>,
    pub(crate) cpu: Duration,
    pub(crate) peak_memory_bytes: usize,
}

impl Afterlife {
    /// Ends `process`, whose instance the caller has dropped (see the
    /// module's invariants for the order): its slot and its place given
    /// back, its receipt written, then `settle` (what the contract tells
    /// its waiters), and only then may [`Process::kill`] return, so whoever
    /// killed it finds the exit settled.
    pub(crate) async fn finish(self, process: &Process, mut ended: Ended, settle: impl FnOnce()) {
        // Killed because the server stops (not failed on its own meanwhile).
        let kept_why = *process.kept.lock().unwrap_or_else(|p| p.into_inner());
        let kept = ended.why == KILLED && kept_why.is_some();
        if let Some(why) = kept_why.filter(|_| kept) {
            ended.why = why.to_string();
            // Its contract marked it killed; the server's stop says why.
            *process.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(ended.why.clone());
        }
        process.mark_ended(&ended.why);
        drop(self.root);
        if let Some(slot) = process.storage.clone().filter(|s| !s.durable) {
            let _ = tokio::task::spawn_blocking(move || slot.delete()).await;
        }
        let reservation = crate::process_table::Reservation {
            pid: process.pid,
            slot: process.slot,
        };
        self.table.ended(&process.owner, reservation, &ended.why);
        if !kept && !process.released_by_owner.load(Ordering::Relaxed) {
            self.fence.release_later(&process.owner, process.pid);
        }
        let outcome = outcome(&ended.why);
        self.program_metrics.exited(outcome);
        if let Some(sink) = &self.receipts {
            write_process_receipt(sink.as_ref(), process, &ended, outcome, self.started);
        }
        settle();
        let _ = self.finished.send(true);
    }
}

/// How a killed process ended.
pub(crate) const KILLED: &str = "killed";

/// How a process the server stopped as it shut down ended.
pub(crate) const STOPPED: &str =
    "stopped: the server shut down; its launch is kept for the server's next start";

/// How a process this node stopped, because it no longer holds its owner,
/// ended.
pub(crate) const HANDED_OVER: &str = "stopped: this node no longer holds its owner; its launch is kept for the node that holds the owner next";

/// A receipt's outcome: `killed`, `stopped` (with the server, or handed
/// over, its launch kept), `exited` (a command that ended by itself), or
/// `failed`.
fn outcome(why: &str) -> &'static str {
    match why {
        KILLED => "killed",
        STOPPED | HANDED_OVER => "stopped",
        _ if why.starts_with("exited") => "exited",
        _ => "failed",
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
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i32>,
    requests: u64,
    cpu_us: u64,
    peak_memory_bytes: usize,
}

fn write_process_receipt(
    sink: &dyn ReceiptSink,
    process: &Process,
    ended: &Ended,
    outcome: &'static str,
    started: Instant,
) {
    let failed = outcome == "failed";
    let detail = (failed || outcome == "stopped").then_some(ended.why.as_str());
    let cpu_us = ended.cpu.as_micros() as u64;
    write_receipt(
        sink,
        PROCESS_TARGET,
        "process",
        SystemTime::now(),
        &ProcessFields {
            pid: process.pid,
            class: &process.owner.class,
            name: &process.owner.name,
            image: process.image,
            contract: process.contract().as_str(),
            slot: process.slot,
            exit_code: ended.exit_code,
            requests: process.requests(),
            cpu_us,
            peak_memory_bytes: ended.peak_memory_bytes,
        },
        &Terminal {
            outcome,
            error: failed.then_some(ProgramErrorCode::ProcessEnded.as_str()),
            status: None,
            queued_us: None,
            wasm_us: Some(cpu_us),
            total_us: started.elapsed().as_micros() as u64,
            operations: 0,
            operations_refused: 0,
            detail,
        },
    );
}
