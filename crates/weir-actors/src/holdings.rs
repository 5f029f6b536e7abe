//! Holdings: what a layer above keeps in an actor's name outside its
//! database — its resident processes and their storage slots, the
//! sockets it holds — and lets go of when an operator deletes the actor.
//!
//! Invariant owned here: nothing kept in an actor's name outlives the
//! actor's deletion. `DELETE /actors/CLASS/NAME` holds the actor (no turn
//! of it runs), has every layer let go of what it keeps for it, and only
//! then removes its database; if a layer cannot let go, the deletion
//! fails with the cause and the database stays, so an operator can try
//! again. A new actor of the same name therefore finds nothing of the old
//! one: no process, no slot file, no bytes counted in the app's room, no
//! socket (nor its tags or attachment).

use crate::address::ActorAddress;
use crate::placement::BoxFuture;

/// A layer that keeps something in actors' names (see the module doc).
pub trait Holdings: Send + Sync {
    /// Lets go of everything kept for `actor`, which is held: no turn of
    /// it runs until this returns. Ends what runs for it and removes what
    /// it stored, giving its bytes back to the app's storage room.
    fn let_go<'a>(&'a self, actor: &'a ActorAddress) -> BoxFuture<'a, Result<(), String>>;
}
