//! Durable actors: an actor is (class, name), runs one turn at a time and
//! owns a SQLite database (see `weir_store::actor`).
//!
//! - [`address`]: how actors are named and reached;
//! - [`directory`]: where their databases live;
//! - [`turn`]: one turn, its transaction and the output gate;
//! - [`timers`]: every actor's next deadline and the retry policy;
//! - [`host`]: the classes, the actors in memory, calls, the dispatcher and
//!   hibernation.

pub mod address;
pub mod directory;
pub mod host;
pub mod os_limits;
pub mod timers;
pub mod turn;

pub use address::{ActorAddress, AddressError};
pub use directory::{ActorDirectory, Unreadable};
pub use host::{ActorClass, ActorHost, AdminError};
