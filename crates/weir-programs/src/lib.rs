//! Programs: components that are not request handlers, run by Weir under
//! its limits, and the content-addressed store they are kept in.
//!
//! - [`image_store`]: components by SHA-256 ([`digest`]), written whole or not at all,
//!   verified before use, rooted while used, swept when nothing holds them;
//!   [`shared_images`]: in cluster mode, the images every node runs (a
//!   push shared through the cluster's database, fetched where missing);
//!   [`loader`]: from a name to a verified, compiled, linked program.
//! - [`one_shot`]: a command (`wasi:cli/run`) run to completion with its
//!   arguments, environment, stdin, stdout and stderr, and an exit code.
//! - [`host`]: `weir:process` for actors: the programs of a server and a
//!   one-shot run from a turn, bounded by the turn; [`process_host`]: the
//!   processes' functions (spawn, kill, status, list, storage).
//! - Resident processes: [`process`] (what each is, and how each ends),
//!   [`resident`] (the `boot` contract: one long-lived instance serving its
//!   owner), [`lifetime`] (the `lifetime` contract: one command held for
//!   its life, with its stdin, output and exit), [`process_table`]
//!   (owners, pids, slots, budgets),
//!   [`process_router`] (`<pid>.process.internal`, owner only),
//!   [`storage_slot`] (the one directory a process may have),
//!   [`slot_quota`] (what an owner's slots may hold on disk) and
//!   [`slot_filesystem`] (`wasi:filesystem` for processes, counted).
//! - [`fenced_work`]: the launch journal, and [`recovery`]: re-driving what
//!   a crash left; [`handover`]: in cluster mode, processes that follow
//!   their owner from node to node; [`holdings`]: what a deleted actor's processes and
//!   slots leave (nothing).
//! - [`limits`], [`error_code`], [`metrics`]: the programs' own limits,
//!   codes and metrics, set and reported like the runtime's.
//!
//! Programs run on the runtime's invocation machine
//! (`weir_runtime::invocation`): one call, one deadline, one scope, one
//! classifier of how it ended, one receipt encoder.

pub mod digest;
pub mod error_code;
pub mod fenced_work;
pub mod handover;
pub mod holdings;
pub mod host;
pub mod image_store;
pub mod lifetime;
pub mod limits;
pub mod loader;
pub mod metrics;
pub mod one_shot;
pub mod process;
pub mod process_host;
pub mod process_router;
pub mod process_table;
pub mod program_threads;
pub mod recovery;
pub mod resident;
pub mod shared_images;
pub mod slot_filesystem;
pub mod slot_quota;
pub mod storage_slot;

pub use error_code::ProgramErrorCode;
pub use image_store::{Digest, ImageError, ImageStore};
pub use limits::ProgramLimits;
pub use one_shot::{Program, RunEnd, RunLimits, RunReport, RunSpec};
