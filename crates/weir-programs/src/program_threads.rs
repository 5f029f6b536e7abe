//! Program threads: where long-lived programs run (resident servers and
//! `lifetime` commands, from their boot on), apart from the workers that
//! serve requests.
//!
//! Invariant owned here: no program's computing delays a request by more
//! than the operating system's sharing of the cores, however many programs
//! compute at once. A program that computes without end yields at every
//! epoch tick, but to whatever runs next on its thread: on the request
//! workers, that meant every request waited behind every busy program's
//! 5 ms slice. Measured on a release build (2 cores, `bench/RESULTS.md`):
//! 8 `lifetime` commands spinning (one actor's allowance) made a worker's
//! answer take 148 ms at p50, 64 of them 399 ms. On threads of their own,
//! busy programs share those threads with each other, and the kernel
//! shares the cores between those threads and the workers.

use tokio::runtime::{Builder, Handle, Runtime};

/// Threads for programs: as many as the cores the process may use, as the
/// request workers have. When programs and requests are all busy, the
/// kernel gives each pool about half the machine; programs that compute
/// without end still leave their neighbours (a resident server answering
/// its owner) a thread to run on until there are as many of them as cores.
/// Measured with one thread on 2 cores, a sibling of one spinning process
/// answered 135 requests a second, each after the spinner's 5 ms slice.
pub fn program_thread_count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The program threads of one server, started at its first spawn.
pub struct ProgramThreads {
    /// Taken only by `drop`.
    runtime: Option<Runtime>,
    handle: Handle,
}

impl ProgramThreads {
    pub fn start() -> std::io::Result<ProgramThreads> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(program_thread_count())
            .thread_name("weir-program")
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        Ok(ProgramThreads {
            runtime: Some(runtime),
            handle,
        })
    }

    /// Where a program's run is spawned. A handle, not the threads: the
    /// server owns them, and a program's task never keeps them alive.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }
}

impl Drop for ProgramThreads {
    fn drop(&mut self) {
        // Dropped by a server that is stopping, often on one of its own
        // async workers, where a runtime may not block to wait for its
        // threads: the programs still running end with their threads.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
