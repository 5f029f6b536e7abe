//! The `boot` contract: one long-lived instance of a `wasi:http` server,
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
//!   gets `process_ended` with how it ended, never a hang (how every
//!   process ends is [`crate::process`]'s).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};
use wasmtime::component::TypedFunc;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use weir_runtime::buffered;
use weir_runtime::error_code::error_response;
use weir_runtime::generation::Generation;
use weir_runtime::guest_state::GenerationState;
use weir_runtime::invocation::{self, Ending, NoResponse, Timing};
use weir_runtime::scope::EventScope;
use weir_runtime::{AppCode, Limits};

use crate::error_code::ProgramErrorCode;
use crate::one_shot::Timed;
use crate::process::{Door, Ended, Process, Spawn, SpawnError};

/// Requests that may wait for one process: it serves one at a time, so
/// its queue is its latency; past 64, refusing fast (503
/// `process_overloaded`) serves the owner better than waiting.
pub const MAX_PROCESS_QUEUED: usize = 64;

/// The export a booting program may have.
pub const BOOT_INTERFACE: &str = "weir:process/boot@0.1.0";

/// `start: func(args: list<u8>) -> result<list<u8>, string>`.
type StartFunc = TypedFunc<(Vec<u8>,), (Result<Vec<u8>, String>,)>;

/// A server's code: compiled and linked once per image.
pub type ServerCode = AppCode<ProxyPre<GenerationState>>;

/// One request for the process and where its answer goes.
pub(crate) struct Job {
    request: http::Request<Bytes>,
    reply: oneshot::Sender<http::Response<Bytes>>,
}

impl Process {
    /// Serves one request from the owner: the process's answer, or Weir's
    /// error when it cannot (ended, overloaded, not a server).
    pub async fn request(&self, request: http::Request<Bytes>) -> http::Response<Bytes> {
        let Door::Requests(jobs) = &self.door else {
            return error_response(ProgramErrorCode::ProcessNotServing);
        };
        let (reply, answer) = oneshot::channel();
        if let Err(e) = jobs.try_send(Job { request, reply }) {
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
}

/// Boots a `boot` program and leaves it serving: the process and what
/// its `start` returned. On failure the slot is given back before this
/// returns.
pub async fn spawn(
    mut spawn: Spawn,
    code: Arc<ServerCode>,
) -> Result<(Arc<Process>, Vec<u8>), SpawnError> {
    let cpu = Arc::new(AtomicU64::new(0));
    let wasi = match spawn.wasi() {
        Ok(wasi) => wasi,
        Err(e) => return Err(spawn.abandon(e).await),
    };
    let left = spawn.deadline.saturating_duration_since(Instant::now());
    let pid = spawn.reserved.reservation.pid;
    let mut extras = crate::process::SlotUse::extras(spawn.storage.as_ref());
    // Its output names the process and its owner.
    let owner = &spawn.reserved.owner;
    let fields = [
        ("class", owner.class.as_str()),
        ("name", owner.name.as_str()),
        ("pid", &pid.to_string()),
    ];
    extras.guest_log = code
        .guest_log
        .as_ref()
        .map(|log| Arc::new(log.with_fields(&fields)));
    let made = tokio::time::timeout(
        left,
        Timed::new(
            Generation::instantiate_with(&code, &spawn.metrics, pid, extras, wasi),
            &cpu,
        ),
    )
    .await;
    let mut generation = match made {
        Ok(Ok(generation)) => generation,
        Ok(Err(e)) => return Err(spawn.abandon(SpawnError::Instantiate(e.reason)).await),
        Err(_) => {
            let why = SpawnError::Instantiate("the spawning turn's deadline passed".into());
            return Err(spawn.abandon(why).await);
        }
    };
    let start_args = std::mem::take(&mut spawn.start_args);
    let mut cancel = spawn.cancel.take();
    let payload = match boot(
        &code,
        &mut generation,
        start_args,
        (spawn.deadline, cancel.as_mut()),
        &cpu,
    )
    .await
    {
        Ok(payload) => payload,
        Err(why) => {
            drop(generation);
            return Err(spawn.abandon(SpawnError::Start(why)).await);
        }
    };
    let (jobs, queue) = mpsc::channel(MAX_PROCESS_QUEUED);
    let threads = spawn.threads.clone();
    let (process, afterlife) = spawn.process(Door::Requests(jobs));
    process
        .memory
        .store(generation.memory_bytes() as u64, Ordering::Relaxed);
    let serving = process.clone();
    threads.spawn(async move {
        let why = serve(
            &serving,
            &mut generation,
            &code.limits,
            queue,
            afterlife.killed.clone(),
            &cpu,
        )
        .await;
        serving.mark_ended(&why);
        let peak_memory_bytes = generation.memory_bytes();
        // Fully gone first: the instance, then the rest of it.
        drop(generation);
        let ended = Ended {
            why,
            exit_code: None,
            cpu: Duration::from_nanos(cpu.load(Ordering::Relaxed)),
            peak_memory_bytes,
        };
        afterlife.finish(&serving, ended, || {}).await;
    });
    Ok((process, payload))
}

/// Runs the program's `start`, if it exports one, once.
async fn boot(
    code: &AppCode,
    generation: &mut Generation,
    args: Vec<u8>,
    (deadline, cancel): (Instant, Option<&mut tokio::sync::oneshot::Receiver<()>>),
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
        cancel,
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
    resident: &Process,
    generation: &mut Generation,
    limits: &Limits,
    mut queue: mpsc::Receiver<Job>,
    mut killed: watch::Receiver<bool>,
    cpu: &AtomicU64,
) -> String {
    loop {
        let job = tokio::select! {
            biased;
            _ = killed.wait_for(|k| *k) => return crate::process::KILLED.into(),
            job = queue.recv() => match job {
                Some(job) => job,
                None => return crate::process::KILLED.into(),
            },
        };
        let deadline = Instant::now() + limits.event_limit;
        let scope = EventScope::new(limits.max_operations);
        scope.set_deadline(deadline);
        generation.store.data_mut().set_scope(Some(scope.clone()));
        let call = tokio::select! {
            biased;
            _ = killed.wait_for(|k| *k) => return crate::process::KILLED.into(),
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
            resident.mark_ended(&why);
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
