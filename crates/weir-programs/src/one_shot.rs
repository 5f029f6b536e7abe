//! One-shot runs: a command (`wasi:cli/run`) run to completion on an
//! instance of its own, under Weir's limits, on the runtime's invocation
//! machine (a program is another kind of call, not another event loop).
//!
//! Invariants owned here:
//! - a run gets nothing ambient: the arguments and environment it is given
//!   and nothing else, no preopened directory, no socket (TCP, UDP and name
//!   lookup are off), and outbound HTTP only through the allow-list it is
//!   given (none by default);
//! - a run ends by its own exit, or at one of its limits, never later:
//!   `run_time_limit_ms` from the moment it is entered (its start functions
//!   included), `memory_limit_bytes` of linear memory, and
//!   `max_run_output_bytes` of stdout and stderr together. Each limit ends
//!   the run with its own code, and a run whose output was cut never
//!   passes for a whole one, whatever it exits with;
//! - every run ends with one receipt (program, image, outcome, exit code,
//!   CPU time, peak memory), through the runtime's one receipt encoder.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use wasmtime::Store;
use wasmtime_wasi::WasiCtx;
use wasmtime_wasi::p2::bindings::{Command, CommandPre};
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use weir_runtime::extension::Extras;
use weir_runtime::generation::{new_store, start};
use weir_runtime::guest_output::{GuestOutput, PastBudget, Sink};
use weir_runtime::guest_state::GenerationState;
use weir_runtime::invocation::{self, Ending, NoResponse, Timing};
use weir_runtime::limit_table::{LimitError, LimitTable, split_assignment, unknown_among};
use weir_runtime::metrics::AppMetrics;
use weir_runtime::outcome::Outcome;
use weir_runtime::receipt::{ReceiptSink, Terminal, write_receipt};
use weir_runtime::scope::EventScope;
use weir_runtime::{AppCode, ErrorCode, Limits, WeirError};

use crate::error_code::ProgramErrorCode;
use crate::image_store::Digest;
use crate::limits::ProgramLimits;

/// The exit status of a run that trapped: 128 + SIGABRT, what `wasmtime
/// run` exits with, so scripts written against it read Weir the same.
pub const EXIT_TRAPPED: i32 = 134;

/// The exit status of a run Weir stopped at a limit (time, memory or
/// output): 124, what `timeout(1)` exits with when it stops a command.
pub const EXIT_LIMIT: i32 = 124;

/// The log target of run receipts.
pub const RUN_TARGET: &str = "weir::run";

/// A command's code: compiled and linked once, instantiated per run.
pub type CommandCode = AppCode<CommandPre<GenerationState>>;

/// A program ready to run: its code and what it is called.
pub struct Program {
    /// `argv[0]`, and the name in receipts.
    pub name: String,
    pub image: Digest,
    pub code: CommandCode,
}

/// What a run reads as its standard input.
pub enum Stdin {
    /// Nothing: the first read sees the end.
    Empty,
    /// These bytes, then the end.
    Bytes(Vec<u8>),
    /// Weir's own standard input (`weir run` in a shell or a pipe).
    Inherit,
}

/// Where a run's standard output and error go.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Streamed to Weir's own stdout and stderr as the program writes.
    Inherit,
    /// Kept and handed back in the report.
    Capture,
}

/// One run's inputs.
pub struct RunSpec {
    /// The arguments after `argv[0]`.
    pub args: Vec<String>,
    /// The whole environment the program sees.
    pub env: Vec<(String, String)>,
    pub stdin: Stdin,
    pub output: Output,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// The program ended by itself with this code (0 for a `run` that
    /// returned `ok`, 1 for one that returned `err`).
    Exited(i32),
    /// The program trapped, or Weir stopped it at a limit.
    Failed {
        outcome: Outcome,
        error: &'static str,
        detail: Option<String>,
    },
}

impl RunEnd {
    /// The exit status `weir run` ends with.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunEnd::Exited(code) => *code,
            RunEnd::Failed {
                outcome: Outcome::Trap,
                ..
            } => EXIT_TRAPPED,
            RunEnd::Failed { .. } => EXIT_LIMIT,
        }
    }

    /// The error code, when Weir reports one.
    pub fn error(&self) -> Option<&'static str> {
        match self {
            RunEnd::Exited(_) => None,
            RunEnd::Failed { error, .. } => Some(error),
        }
    }

    fn failed(outcome: Outcome, error: impl WeirError, detail: Option<String>) -> RunEnd {
        RunEnd::Failed {
            outcome,
            error: error.as_str(),
            detail,
        }
    }
}

/// What a run did.
#[derive(Debug)]
pub struct RunReport {
    pub end: RunEnd,
    /// The output, when it was captured.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Time spent running the program's code and its host calls.
    pub cpu: Duration,
    pub wall: Duration,
    pub peak_memory_bytes: usize,
}

/// The limits of one run: the runtime's (memory, host operations,
/// cleanup) and the programs' (time, output).
#[derive(Clone, Debug, Default)]
pub struct RunLimits {
    pub runtime: Limits,
    pub programs: ProgramLimits,
}

impl RunLimits {
    /// Applies a `NAME=VALUE` assignment to whichever table owns the name.
    pub fn apply(&mut self, assignment: &str) -> Result<(), LimitError> {
        let (name, value) = split_assignment(assignment)?;
        if ProgramLimits::specs().iter().any(|s| s.name == name) {
            return self.programs.set_limit(name, value);
        }
        self.runtime
            .set_limit(name, value)
            .map_err(|e| unknown_among(e, &[ProgramLimits::specs(), Limits::specs()]))
    }
}

/// Runs `program` to its end.
pub async fn run(
    program: &Program,
    spec: RunSpec,
    limits: &RunLimits,
    metrics: &AppMetrics,
    receipts: Option<&dyn ReceiptSink>,
) -> RunReport {
    let started = Instant::now();
    let deadline = started + limits.programs.run_time_limit;
    let captured = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(Mutex::new(Vec::new())),
    );
    let (out_sink, err_sink) = match spec.output {
        Output::Inherit => (Sink::Stdout, Sink::Stderr),
        Output::Capture => (
            Sink::Capture(captured.0.clone()),
            Sink::Capture(captured.1.clone()),
        ),
    };
    let (stdout, stderr) = GuestOutput::shared(
        limits.programs.max_run_output_bytes,
        PastBudget::Refuse,
        out_sink,
        err_sink,
    );
    let mut wasi = WasiCtx::builder();
    wasi.arg(&program.name)
        .args(&spec.args)
        .envs(&spec.env)
        .stdout(stdout)
        .stderr(stderr.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    match spec.stdin {
        Stdin::Empty => wasi.stdin(tokio::io::empty()),
        Stdin::Bytes(bytes) => wasi.stdin(MemoryInputPipe::new(bytes)),
        Stdin::Inherit => wasi.stdin(std::io::stdin()),
    };
    let cpu = Arc::new(AtomicU64::new(0));
    let time_limit = ("run_time_limit_ms", limits.programs.run_time_limit);
    let (end, peak_memory_bytes) = match Ready::instantiate(
        &program.code,
        metrics,
        Extras::default(),
        wasi.build(),
        &stderr,
        time_limit,
        &cpu,
    )
    .await
    {
        Ok(mut ready) => {
            let end = ready
                .run(
                    deadline,
                    time_limit,
                    &limits.runtime,
                    limits.programs.max_run_output_bytes,
                    &cpu,
                )
                .await;
            (end, ready.peak_memory_bytes())
        }
        Err(failed) => failed,
    };
    let take =
        |c: &Arc<Mutex<Vec<u8>>>| std::mem::take(&mut *c.lock().unwrap_or_else(|p| p.into_inner()));
    let report = RunReport {
        end,
        stdout: take(&captured.0),
        stderr: take(&captured.1),
        cpu: Duration::from_nanos(cpu.load(Ordering::Relaxed)),
        wall: started.elapsed(),
        peak_memory_bytes,
    };
    if let Some(sink) = receipts {
        write_run_receipt(sink, program, &report);
    }
    report
}

/// A command instantiated and ready to run: the one way a command is
/// started and run, for a one-shot and for a `lifetime` process.
pub(crate) struct Ready {
    store: Store<GenerationState>,
    command: Command,
    /// The output budget, to tell a cut output from a whole one.
    output: GuestOutput,
}

impl Ready {
    /// Instantiates `code` with `wasi` (its stdio and preopens set by the
    /// caller), its start functions bounded by `start_limit`; or how the
    /// run ended before it could start, and the memory it had reached.
    pub(crate) async fn instantiate(
        code: &CommandCode,
        metrics: &AppMetrics,
        extras: Extras,
        wasi: WasiCtx,
        output: &GuestOutput,
        start_limit: (&str, Duration),
        cpu: &AtomicU64,
    ) -> Result<Ready, (RunEnd, usize)> {
        let mut store = new_store(code, metrics, extras, wasi, output.clone());
        let entry = Timed::new(start(code, &mut store, 0, start_limit), cpu).await;
        let failed = |store: &Store<GenerationState>, end| (end, store.data().memory_peak());
        let instance = match entry {
            Ok(instance) => instance,
            Err(e) if e.over_budget || store.data().memory_refusal().is_some() => {
                let code = store
                    .data()
                    .memory_refusal()
                    .unwrap_or(ErrorCode::MemoryBudgetExceeded);
                return Err(failed(
                    &store,
                    RunEnd::failed(Outcome::Limit, code, Some(e.reason)),
                ));
            }
            Err(e) if e.reason.contains(start_limit.0) => {
                return Err(failed(
                    &store,
                    RunEnd::failed(
                        Outcome::Deadline,
                        ProgramErrorCode::RunTimeLimitExceeded,
                        Some(e.reason),
                    ),
                ));
            }
            Err(e) => {
                return Err(failed(
                    &store,
                    RunEnd::failed(Outcome::Trap, ProgramErrorCode::RunTrapped, Some(e.reason)),
                ));
            }
        };
        match Command::new(&mut store, &instance) {
            Ok(command) => Ok(Ready {
                store,
                command,
                output: output.clone(),
            }),
            Err(e) => Err(failed(
                &store,
                RunEnd::failed(
                    Outcome::Trap,
                    ProgramErrorCode::NotACommand,
                    Some(format!("{e:#}")),
                ),
            )),
        }
    }

    /// Runs the command's `run` to its end: its exit, a trap, `deadline`
    /// (reported as `time_limit`), or a limit of `limits`; a run whose
    /// output went past `max_output` bytes fails whatever it exits with.
    pub(crate) async fn run(
        &mut self,
        deadline: Instant,
        time_limit: (&str, Duration),
        limits: &Limits,
        max_output: u64,
        cpu: &AtomicU64,
    ) -> RunEnd {
        let scope = EventScope::new(limits.max_operations);
        let store = &mut self.store;
        store.data_mut().set_scope(Some(scope.clone()));
        let call = Timed::new(self.command.wasi_cli_run().call_run(&mut *store), cpu);
        let timing = Timing {
            deadline,
            cancellation_limit: limits.cancellation_limit,
        };
        let ending = invocation::run(call, None, &scope, timing, None, &mut NoResponse).await;
        let failure = ending.failure(store.data());
        store.data_mut().set_scope(None);
        invocation::settle(&scope, failure.is_some(), limits.cleanup_timeout).await;
        if self.output.exceeded() {
            // Whatever the program did after its write failed, its output
            // is not whole.
            return RunEnd::failed(
                Outcome::Limit,
                ProgramErrorCode::RunOutputTooLarge,
                Some(format!("max_run_output_bytes is {max_output}")),
            );
        }
        match (ending, failure) {
            (Ending::Returned(Ok(())), _) => RunEnd::Exited(0),
            (Ending::Returned(Err(())), _) => RunEnd::Exited(1),
            (Ending::Exited(code), _) => RunEnd::Exited(code),
            (Ending::DeadlinePassed { .. }, _) => RunEnd::failed(
                Outcome::Deadline,
                ProgramErrorCode::RunTimeLimitExceeded,
                Some(format!("{} is {}", time_limit.0, time_limit.1.as_millis())),
            ),
            (_, Some((Outcome::Limit, code, detail))) => RunEnd::Failed {
                outcome: Outcome::Limit,
                error: code.as_str(),
                detail,
            },
            (_, failure) => RunEnd::failed(
                Outcome::Trap,
                ProgramErrorCode::RunTrapped,
                failure.and_then(|(_, _, detail)| detail),
            ),
        }
    }

    /// Linear memory the program reached.
    pub(crate) fn peak_memory_bytes(&self) -> usize {
        self.store.data().memory_peak()
    }

    /// Keeps the program's peak memory current in `to` while it runs.
    pub(crate) fn mirror_memory(&mut self, to: Arc<AtomicU64>) {
        self.store.data_mut().mirror_memory(to);
    }
}

/// What only a run's receipt has.
#[derive(Serialize)]
struct RunFields<'a> {
    program: &'a str,
    image: Digest,
    exit_code: i32,
    cpu_us: u64,
    peak_memory_bytes: usize,
}

fn write_run_receipt(sink: &dyn ReceiptSink, program: &Program, report: &RunReport) {
    let (outcome, detail) = match &report.end {
        RunEnd::Exited(_) => ("ok", None),
        RunEnd::Failed {
            outcome, detail, ..
        } => (outcome.as_str(), detail.as_deref()),
    };
    write_receipt(
        sink,
        RUN_TARGET,
        "run",
        SystemTime::now(),
        &RunFields {
            program: &program.name,
            image: program.image,
            exit_code: report.end.exit_code(),
            cpu_us: report.cpu.as_micros() as u64,
            peak_memory_bytes: report.peak_memory_bytes,
        },
        &Terminal {
            outcome,
            error: report.end.error(),
            status: None,
            queued_us: None,
            wasm_us: Some(report.cpu.as_micros() as u64),
            total_us: report.wall.as_micros() as u64,
            operations: 0,
            operations_refused: 0,
            detail,
        },
    );
}

/// A future that adds the time spent in its polls to a counter: the CPU a
/// run's guest code and host calls took, without a thread clock.
pub(crate) struct Timed<'a, F> {
    inner: Pin<Box<F>>,
    spent: &'a AtomicU64,
}

impl<'a, F: Future> Timed<'a, F> {
    pub(crate) fn new(inner: F, spent: &'a AtomicU64) -> Self {
        Timed {
            inner: Box::pin(inner),
            spent,
        }
    }
}

impl<F: Future> Future for Timed<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let began = Instant::now();
        let polled = self.inner.as_mut().poll(cx);
        self.spent
            .fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
        polled
    }
}
