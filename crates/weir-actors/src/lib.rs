//! Durable actors: an actor is (class, name), runs one turn at a time and
//! owns a SQLite database (see `weir_store::actor`).
//!
//! This crate so far holds how actors are addressed and where their
//! databases live; turns, the output gate, the timer dispatcher and
//! hibernation come with issue 4.

pub mod address;
pub mod directory;

pub use address::{ActorAddress, AddressError};
pub use directory::ActorDirectory;
