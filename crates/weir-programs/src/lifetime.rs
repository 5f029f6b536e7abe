//! The `lifetime` contract: a command (`wasi:cli/run`) run once for its
//! process's whole life, on the same path as a one-shot run
//! (`one_shot::Ready`); its owner writes its stdin, reads its
//! output and waits for its exit through its [`Console`].
//!
//! Invariants owned here:
//! - the command runs exactly once per spawn, with no time limit of its
//!   own (it lives until it exits or is killed; a busy loop still yields
//!   at every epoch tick) and the memory limit of every instance;
//! - stdin is a pipe its owner writes: at most
//!   [`MAX_STDIN_BUFFERED_BYTES`] wait for the program, a write takes what
//!   fits and says how much (an owner's turn never blocks on a program
//!   that does not read), and closing it is the program's end of input;
//! - output is kept as a tail: the last [`OUTPUT_TAIL_BYTES`] of each
//!   stream, at offsets counted from the stream's start, so a reader knows
//!   what it missed. Whatever a program prints, the host keeps no more;
//! - the exit settles once, after the process is fully gone (its slot
//!   free): every wait, before or after, sees the same exit — its code,
//!   how Weir stopped it if it did, and the tails. A killed process exits
//!   [`EXIT_KILLED`].

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{Notify, watch};
use wasmtime_wasi::cli::{IsTerminal, StdinStream};
use weir_runtime::guest_output::{GuestOutput, Keep, PastBudget, Sink};

use crate::error_code::ProgramErrorCode;
use crate::one_shot::{CommandCode, Ready, RunEnd};
use crate::process::{Door, Ended, Process, Spawn, SpawnError};
use weir_runtime::WeirError;

/// Bytes of stdin that may wait for a program to read them: a terminal's
/// worth of typing or a pasted file's page; past it a write takes what
/// fits, so an owner cannot make the host hold more for a program that
/// does not read.
pub const MAX_STDIN_BUFFERED_BYTES: usize = 64 << 10;

/// Bytes of each output stream a process keeps: its last screenfuls, what
/// an owner reading it now and then or an exit report needs; a program
/// that prints without end costs the host no more.
pub const OUTPUT_TAIL_BYTES: usize = 64 << 10;

/// The exit status of a killed process: 128 + SIGKILL, as a shell says it.
pub const EXIT_KILLED: i32 = 137;

/// How long a lifetime command may run: as long as it lives. Its run
/// needs a deadline, and this one is never reached (a century).
const LIFETIME_HORIZON: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How a lifetime process exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    pub exit_code: i32,
    /// When Weir ended it: `killed`, or the code (`run_trapped`,
    /// `memory_limit_exceeded`, …).
    pub stopped: Option<String>,
    pub detail: Option<String>,
}

impl Exit {
    /// How the process's state says it ended.
    fn why(&self) -> String {
        match (&self.stopped, &self.detail) {
            (None, _) => format!("exited with {}", self.exit_code),
            (Some(code), None) => code.clone(),
            (Some(code), Some(detail)) => format!("{code}: {detail}"),
        }
    }
}

/// Which output stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Bytes read from a stream's tail.
#[derive(Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Where `data` starts in the stream: later than asked when those
    /// bytes are no longer kept.
    pub offset: u64,
    pub data: Vec<u8>,
    /// The stream has ended (the process exited) and `data` reaches its
    /// end.
    pub closed: bool,
}

/// Why a console call was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConsoleError {
    #[error("the process has ended ({0})")]
    Ended(String),
    #[error("its stdin is closed")]
    StdinClosed,
}

/// A lifetime process's stdin, output and exit.
pub struct Console {
    stdin: Arc<Pipe>,
    stdout: Arc<Tail>,
    stderr: Arc<Tail>,
    exit: watch::Sender<Option<Exit>>,
}

impl Console {
    fn new() -> Console {
        Console {
            stdin: Arc::new(Pipe::default()),
            stdout: Arc::new(Tail::default()),
            stderr: Arc::new(Tail::default()),
            exit: watch::channel(None).0,
        }
    }

    /// Hands `data` to the program's stdin: the bytes taken (fewer when
    /// the buffer is full, none when it is).
    pub fn write_stdin(&self, data: &[u8]) -> Result<usize, ConsoleError> {
        if let Some(exit) = self.exit() {
            return Err(ConsoleError::Ended(exit.why()));
        }
        self.stdin.write(data)
    }

    /// Ends the program's input; idempotent.
    pub fn close_stdin(&self) -> Result<(), ConsoleError> {
        if let Some(exit) = self.exit() {
            return Err(ConsoleError::Ended(exit.why()));
        }
        self.stdin.close();
        Ok(())
    }

    /// Bytes of `stream` from `offset`, at most `max`, waiting up to
    /// `timeout` for some when there are none yet.
    pub async fn read(&self, stream: Stream, offset: u64, max: usize, timeout: Duration) -> Chunk {
        let tail = match stream {
            Stream::Stdout => &self.stdout,
            Stream::Stderr => &self.stderr,
        };
        let until = Instant::now() + timeout;
        loop {
            let grown = tail.grown.notified();
            let chunk = tail.read(offset, max);
            if !chunk.data.is_empty() || chunk.closed || Instant::now() >= until {
                return chunk;
            }
            let _ = tokio::time::timeout_at(until.into(), grown).await;
        }
    }

    /// The exit, once the process is gone.
    pub fn exit(&self) -> Option<Exit> {
        self.exit.borrow().clone()
    }

    /// Waits up to `timeout` for the exit.
    pub async fn wait(&self, timeout: Duration) -> Option<Exit> {
        let mut exit = self.exit.subscribe();
        let settled = tokio::time::timeout(timeout, exit.wait_for(|e| e.is_some())).await;
        match settled {
            Ok(Ok(exit)) => exit.clone(),
            _ => self.exit(),
        }
    }

    /// The kept tail of each stream: what an exit report shows.
    pub fn tails(&self) -> (Vec<u8>, Vec<u8>) {
        let all = |t: &Tail| t.read(0, OUTPUT_TAIL_BYTES).data;
        (all(&self.stdout), all(&self.stderr))
    }
}

/// Starts a `lifetime` program: returns once it is instantiated and its
/// `run` has begun. On failure the slot is given back before this
/// returns.
pub async fn spawn(spawn: Spawn, code: Arc<CommandCode>) -> Result<Arc<Process>, SpawnError> {
    let cpu = Arc::new(AtomicU64::new(0));
    let console = Arc::new(Console::new());
    let (stdout, stderr) = GuestOutput::shared(
        u64::MAX,
        PastBudget::Drop,
        Sink::Capture(console.stdout.clone()),
        Sink::Capture(console.stderr.clone()),
    );
    let mut wasi = match spawn.wasi() {
        Ok(wasi) => wasi,
        Err(e) => return Err(spawn.abandon(e).await),
    };
    wasi.stdin(PipeStdin(console.stdin.clone()))
        .stdout(stdout)
        .stderr(stderr.clone());
    let left = spawn.deadline.saturating_duration_since(Instant::now());
    let made = Ready::instantiate(
        &code,
        &spawn.metrics,
        crate::process::SlotUse::extras(spawn.storage.as_ref()),
        wasi.build(),
        &stderr,
        ("the spawning turn's deadline", left),
        &cpu,
    )
    .await;
    let mut ready = match made {
        Ok(ready) => ready,
        Err((end, _)) => {
            let why = match &end {
                RunEnd::Failed {
                    error,
                    detail: Some(detail),
                    ..
                } if *error == ProgramErrorCode::NotACommand.as_str() => {
                    SpawnError::NotRunnable(format!("{error}: {detail}"))
                }
                RunEnd::Failed { error, detail, .. } => SpawnError::Instantiate(match detail {
                    Some(detail) => format!("{error}: {detail}"),
                    None => error.to_string(),
                }),
                RunEnd::Exited(code) => SpawnError::Start(format!("exited with {code}")),
            };
            return Err(spawn.abandon(why).await);
        }
    };
    let threads = spawn.threads.clone();
    let (process, afterlife) = spawn.process(Door::Console(console.clone()));
    // The ledger sees its memory as it grows, not only at its end.
    ready.mirror_memory(process.memory.clone());
    let running = process.clone();
    threads.spawn(async move {
        let mut killed = afterlife.killed.clone();
        let horizon = Instant::now() + LIFETIME_HORIZON;
        let limit = ("the process's lifetime", LIFETIME_HORIZON);
        let end = tokio::select! {
            biased;
            _ = killed.wait_for(|k| *k) => None,
            end = ready.run(horizon, limit, &code.limits, u64::MAX, &cpu) => Some(end),
        };
        let exit = match end {
            None => Exit {
                exit_code: EXIT_KILLED,
                stopped: Some(crate::process::KILLED.into()),
                detail: None,
            },
            Some(RunEnd::Exited(code)) => Exit {
                exit_code: code,
                stopped: None,
                detail: None,
            },
            Some(end) => Exit {
                exit_code: end.exit_code(),
                stopped: end.error().map(str::to_string),
                detail: match &end {
                    RunEnd::Failed { detail, .. } => detail.clone(),
                    RunEnd::Exited(_) => None,
                },
            },
        };
        let why = exit.why();
        running.mark_ended(&why);
        let peak_memory_bytes = ready.peak_memory_bytes();
        // Fully gone first: the instance, then the rest of it.
        drop(ready);
        console.stdin.close();
        console.stdout.close();
        console.stderr.close();
        let ended = Ended {
            why,
            exit_code: Some(exit.exit_code),
            cpu: Duration::from_nanos(cpu.load(Ordering::Relaxed)),
            peak_memory_bytes,
        };
        afterlife
            .finish(&running, ended, || {
                console.exit.send_replace(Some(exit));
            })
            .await;
    });
    Ok(process)
}

/// The stdin pipe: bytes the owner wrote that the program has not read.
#[derive(Default)]
struct Pipe {
    state: Mutex<PipeState>,
}

#[derive(Default)]
struct PipeState {
    bytes: VecDeque<u8>,
    closed: bool,
    /// Readers waiting for bytes or the end.
    waiting: Vec<Waker>,
}

impl Pipe {
    fn lock(&self) -> std::sync::MutexGuard<'_, PipeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self, data: &[u8]) -> Result<usize, ConsoleError> {
        let mut state = self.lock();
        if state.closed {
            return Err(ConsoleError::StdinClosed);
        }
        let taken = data
            .len()
            .min(MAX_STDIN_BUFFERED_BYTES.saturating_sub(state.bytes.len()));
        state.bytes.extend(&data[..taken]);
        if taken > 0 {
            state.waiting.drain(..).for_each(Waker::wake);
        }
        Ok(taken)
    }

    fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.waiting.drain(..).for_each(Waker::wake);
    }
}

/// The program's view of the pipe (every handle shares it).
struct PipeStdin(Arc<Pipe>);

impl IsTerminal for PipeStdin {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdinStream for PipeStdin {
    fn async_stream(&self) -> Box<dyn AsyncRead + Send + Sync> {
        Box::new(PipeStdin(self.0.clone()))
    }
}

impl AsyncRead for PipeStdin {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut state = self.0.lock();
        if state.bytes.is_empty() {
            if state.closed {
                return Poll::Ready(Ok(()));
            }
            // One entry per reader, however often it is polled.
            if !state.waiting.iter().any(|w| w.will_wake(cx.waker())) {
                state.waiting.push(cx.waker().clone());
            }
            return Poll::Pending;
        }
        let n = buf.remaining().min(state.bytes.len());
        let (front, back) = state.bytes.as_slices();
        let from_front = n.min(front.len());
        buf.put_slice(&front[..from_front]);
        buf.put_slice(&back[..n - from_front]);
        state.bytes.drain(..n);
        Poll::Ready(Ok(()))
    }
}

/// An output stream's last [`OUTPUT_TAIL_BYTES`].
#[derive(Default)]
struct Tail {
    state: Mutex<TailState>,
    grown: Notify,
}

#[derive(Default)]
struct TailState {
    kept: VecDeque<u8>,
    /// Bytes written since the stream began.
    total: u64,
    closed: bool,
}

impl Tail {
    fn lock(&self) -> std::sync::MutexGuard<'_, TailState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self, offset: u64, max: usize) -> Chunk {
        let state = self.lock();
        let first = state.total - state.kept.len() as u64;
        let from = offset.clamp(first, state.total);
        let take = (state.total - from).min(max as u64) as usize;
        let skip = (from - first) as usize;
        let data: Vec<u8> = state.kept.range(skip..skip + take).copied().collect();
        Chunk {
            offset: from,
            closed: state.closed && from + take as u64 == state.total,
            data,
        }
    }

    fn close(&self) {
        self.lock().closed = true;
        self.grown.notify_waiters();
    }
}

impl Keep for Tail {
    fn keep(&self, bytes: &[u8]) {
        let mut state = self.lock();
        state.total += bytes.len() as u64;
        let bytes = &bytes[bytes.len().saturating_sub(OUTPUT_TAIL_BYTES)..];
        let over = (state.kept.len() + bytes.len()).saturating_sub(OUTPUT_TAIL_BYTES);
        state.kept.drain(..over);
        state.kept.extend(bytes);
        drop(state);
        self.grown.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_keeps_the_last_bytes_at_their_offsets() {
        let tail = Tail::default();
        tail.keep(b"hello ");
        tail.keep(b"world");
        assert_eq!(tail.read(0, 100).data, b"hello world");
        assert_eq!(tail.read(6, 3).data, b"wor");
        assert_eq!(tail.read(6, 3).offset, 6);
        let big = vec![b'x'; OUTPUT_TAIL_BYTES];
        tail.keep(&big);
        let chunk = tail.read(0, 10);
        // The first 11 bytes are gone: the read starts where the tail does.
        assert_eq!(chunk.offset, 11);
        assert_eq!(chunk.data, b"xxxxxxxxxx");
        assert!(!chunk.closed);
        tail.close();
        let end = tail.read(11, OUTPUT_TAIL_BYTES);
        assert_eq!(end.data.len(), OUTPUT_TAIL_BYTES);
        assert!(end.closed);
        // Past the end: nothing, and closed.
        let past = tail.read(u64::MAX, 10);
        assert_eq!(past.offset, 11 + OUTPUT_TAIL_BYTES as u64);
        assert!(past.data.is_empty() && past.closed);
    }

    #[test]
    fn a_pipe_takes_what_fits_and_refuses_after_close() {
        let pipe = Pipe::default();
        let big = vec![1u8; MAX_STDIN_BUFFERED_BYTES + 10];
        assert_eq!(pipe.write(&big), Ok(MAX_STDIN_BUFFERED_BYTES));
        assert_eq!(pipe.write(b"more"), Ok(0));
        pipe.close();
        assert_eq!(pipe.write(b"x"), Err(ConsoleError::StdinClosed));
    }

    #[tokio::test]
    async fn a_reader_sees_written_bytes_then_the_end() {
        use tokio::io::AsyncReadExt;
        let pipe = Arc::new(Pipe::default());
        let mut reader = PipeStdin(pipe.clone());
        let read = tokio::spawn(async move {
            let mut all = Vec::new();
            reader.read_to_end(&mut all).await.map(|_| all)
        });
        tokio::task::yield_now().await;
        pipe.write(b"abc").unwrap();
        pipe.write(b"def").unwrap();
        pipe.close();
        assert_eq!(read.await.unwrap().unwrap(), b"abcdef");
    }
}
