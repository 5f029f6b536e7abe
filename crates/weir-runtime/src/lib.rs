//! Weir's runtime: the engine, apps, lanes, generations, admission,
//! deadlines and receipts of the design's runtime contract, and the
//! extension points the layers above (keyed actors today) plug into. It
//! never touches a socket (the HTTP transport is `weir-http`) and knows no
//! layer above it by name.
//!
//! # The look-alike types
//!
//! Several types here name "a running guest" at different scales. From
//! the longest-lived to the shortest:
//!
//! - [`AppCode`] ([`code`]): one component, compiled ([`compiled_code`])
//!   and linked once. Every instance of an app, or of an actor class, is
//!   made from it. It holds no guest state.
//! - [`App`] ([`app`]): a served app — its code, its lanes, its admission
//!   queue, its counters. Lives as long as the server serves it.
//! - [`lane::Lane`] ([`lane`], [`admission`]): a slot that runs one event
//!   at a time. An app has `max_concurrent` of them; a lane is held by
//!   exactly one owner (the idle set, a waiter, or an event) and carries
//!   its generation from event to event.
//! - [`generation::Generation`] ([`generation`]): one wasmtime `Store` and
//!   one instance, numbered per app. Its [`guest_state::GenerationState`]
//!   ([`guest_state`]) is everything the guest can reach. It serves up to
//!   `retirement_admission_limit` events and is then retired, or is
//!   abandoned at once when an event fails. Keyed instances of the layers
//!   above are generations too, held by their own cells instead of lanes.
//! - An invocation ([`invocation::run`]): one guest call on one generation
//!   under one deadline, ending in one [`invocation::Ending`]. A worker
//!   event ([`event`]) is an invocation plus lane policy (admission,
//!   streaming, renewal); an actor turn (in `weir-actors`) is an
//!   invocation plus transaction policy.
//! - [`scope::EventScope`] ([`scope`]): the host operations one invocation
//!   started, bounded by `max_operations`, fenced and drained when the
//!   invocation ends.
//! - [`receipt::Receipt`] ([`receipt`]): the one record every event ends
//!   with, in one encoding for every kind of call ([`receipt_line`]).
//!
//! Two names belong to the layer above and appear here only as what they
//! are built from: an actor's *turn* is an invocation, and its *cell* is
//! where the actor's one generation lives between turns.
//!
//! # How the modules depend on each other
//!
//! One way, with no circles: [`outcome`], [`error_code`], [`limit_table`](mod@limit_table),
//! [`scope`], [`extension`] and [`epoch_ticker`] depend on nothing else here;
//! [`limits`] on [`limit_table`](mod@limit_table);
//! [`compute_share`] on [`epoch_ticker`]; [`engine`] on both and
//! [`memory_budget`]; [`metrics`] on
//! [`outcome`] and [`memory_budget`]; [`receipt`] on [`metrics`]; [`guest_state`] on the host
//! interfaces ([`outbound`], under [`outbound_rules`]; [`keyvalue`], [`sql`]); [`code`] on
//! [`guest_state`] and [`compiled_code`]; [`generation`] on [`code`];
//! [`lane`] on [`generation`]; [`admission`] on [`lane`]; [`retirement`]
//! on nothing; [`app`] on all of those; [`invocation`] runs a call on a [`guest_state`]'s store, and
//! [`event`] puts it together for an [`app`].

pub mod admission;
pub mod app;
pub mod buffered;
pub mod code;
pub mod compiled_code;
pub mod component_world;
pub mod compute_share;
pub mod engine;
pub mod epoch_ticker;
pub mod error_code;
pub mod event;
pub mod extension;
pub mod generation;
pub mod guest_log;
pub mod guest_output;
pub mod guest_state;
pub mod held;
pub mod invocation;
pub mod keyvalue;
pub mod lane;
pub mod latency_histogram;
pub mod limit_table;
pub mod limits;
pub mod memory_budget;
pub mod metrics;
pub mod outbound;
pub mod outbound_rules;
pub mod outcome;
pub mod pacemaker;
pub mod receipt;
pub mod receipt_line;
pub mod retirement;
pub mod scope;
pub mod sql;
pub mod sql_pool;

pub use app::App;
pub use code::{AppCode, LoadError, Stores};
pub use engine::{EngineSizing, WeirEngine};
pub use error_code::{ErrorCode, WeirError};
pub use limit_table::LimitError;
pub use limits::Limits;
