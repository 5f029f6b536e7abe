//! Programs: components that are not request handlers, run by Weir under
//! its limits, and the content-addressed store they are kept in.
//!
//! - [`image_store`]: components by SHA-256, written whole or not at all,
//!   verified before use, rooted while used, swept when nothing holds them.
//! - [`one_shot`]: a command (`wasi:cli/run`) run to completion with its
//!   arguments, environment, stdin, stdout and stderr, and an exit code.
//! - [`host`]: `weir:process/programs` for actors: a one-shot run from a
//!   turn, bounded by the turn.
//! - [`limits`], [`error_code`]: the programs' own limits and codes, set
//!   and reported like the runtime's.
//!
//! Programs run on the runtime's invocation machine
//! (`weir_runtime::invocation`): one call, one deadline, one scope, one
//! classifier of how it ended, one receipt encoder.

pub mod error_code;
pub mod fenced_work;
pub mod host;
pub mod image_store;
pub mod limits;
pub mod loader;
pub mod metrics;
pub mod one_shot;
pub mod process_router;
pub mod process_table;
pub mod resident;
pub mod storage_slot;

pub use error_code::ProgramErrorCode;
pub use image_store::{Digest, ImageError, ImageStore};
pub use limits::ProgramLimits;
pub use one_shot::{Program, RunEnd, RunLimits, RunReport, RunSpec};
