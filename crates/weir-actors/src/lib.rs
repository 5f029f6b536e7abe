//! Durable actors: an actor is (class, name), runs one turn at a time and
//! owns a SQLite database (see `weir_store::actor`). This crate sits above
//! the runtime and plugs into its extension points: `weir:actor` host
//! interfaces, an output gate per turn, and the `*.actor.internal` domain
//! as an internal router.
//!
//! - [`address`]: how actors are named and reached;
//! - [`directory`]: where their databases live;
//! - [`storage_room`]: what their databases and storage slots take on
//!   disk together;
//! - [`gate`]: the turn gate (one transaction per turn, the output gate);
//! - [`bindings`]: the `weir:actor` host functions;
//! - [`turn`]: one turn on the runtime's invocation machine;
//! - [`timers`]: every actor's next deadline and the retry policy;
//! - [`host`]: the classes and the one map of actors in memory;
//! - [`exclusive`]: an actor held between its turns by a layer above;
//! - [`holdings`]: what layers above keep in an actor's name, let go of
//!   when it is deleted, and [`handover`]: what they keep running in its
//!   name, taken over where its storage opens (cluster mode);
//! - [`mailbox`]: calls queued for an actor and run turn after turn;
//! - [`call_chain`]: the actors a call passes through (cycles and depth);
//! - [`dispatcher`]: due timers delivered as alarm turns;
//! - [`residency`]: hibernation and eviction;
//! - [`placement`]: where calls run and where commits become durable, for
//!   a layer that keeps actors beyond this process (cluster mode), and
//!   [`socket_relay`]: an actor's WebSocket reached through another node;
//! - [`os_limits`]: how many actors the process's limits leave room for;
//! - [`operators`]: what `/actors` shows and does, [`listing`]: its
//!   listing a page at a time, and [`operator_calls`]: an operator's call
//!   run where the actor runs;
//! - [`receipts`]: one receipt per turn;
//! - [`limits`], [`error_code`], [`metrics`]: what actors add to the
//!   runtime's limits, errors and metrics.

pub mod address;
pub mod bindings;
pub mod call_chain;
pub mod directory;
pub mod dispatcher;
pub mod error_code;
pub mod exclusive;
pub mod gate;
pub mod handover;
pub mod holdings;
pub mod host;
pub mod limits;
pub mod listing;
pub mod mailbox;
pub mod metrics;
pub mod operator_calls;
pub mod operators;
pub mod os_limits;
pub mod placement;
pub mod receipts;
pub mod residency;
pub mod socket_relay;
pub mod storage_room;
pub mod timer_ledger;
pub mod timer_pass;
pub mod timers;
pub mod turn;

pub use address::{ActorAddress, AddressError};
pub use bindings::ActorInterfaces;
pub use directory::{ActorDirectory, Unreadable};
pub use error_code::{ActorErrorCode, TurnError};
pub use exclusive::Exclusive;
pub use handover::Handover;
pub use holdings::Holdings;
pub use host::{ActorClass, ActorHost};
pub use limits::ActorLimits;
pub use metrics::ActorMetrics;
pub use operator_calls::{Failure, OperatorAnswer, OperatorCall};
pub use operators::AdminError;
pub use placement::{Durable, Forwarded, Known, Location, Placement, Refusal};
pub use socket_relay::{Relayed, SocketDoor};
pub use storage_room::StorageRoom;
