//! Weir's runtime: the engine, apps, lanes, generations, admission,
//! deadlines and receipts of the design's runtime contract.
//!
//! Data flows one way: a request is admitted to a lane ([`admission`]), runs
//! on the lane's generation ([`event`], [`generation`]), and ends with one
//! receipt ([`receipt`]). The HTTP transport lives in `weir-http`; this
//! crate never touches a socket.

pub mod admission;
pub mod app;
pub mod compiled_code;
pub mod engine;
pub mod error_code;
pub mod event;
pub mod extension;
pub mod generation;
pub mod guest_output;
pub mod invocation;
pub mod keyvalue;
pub mod lane;
pub mod limits;
pub mod memory_budget;
pub mod metrics;
pub mod outbound;
pub mod receipt;
pub mod scope;
pub mod sql;
pub mod sql_pool;

pub use app::{App, AppCode, LoadError, Stores};
pub use engine::{EngineSizing, WeirEngine};
pub use error_code::{ErrorCode, WeirError};
pub use limits::{LimitError, Limits};
