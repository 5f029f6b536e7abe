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
//!
//! A layer is also told of each opening of an actor's storage in this
//! process ([`Holdings::opened`]), where it can square what the actor's
//! rows say it holds with what it holds here (the sockets an earlier
//! process or node held, say, whose ends the actor was never told of).

use std::sync::Arc;

use crate::address::ActorAddress;
use crate::gate::TurnGate;
use crate::placement::BoxFuture;

/// A layer that keeps something in actors' names (see the module doc).
pub trait Holdings: Send + Sync {
    /// Lets go of everything kept for `actor`, which is held: no turn of
    /// it runs until this returns. Ends what runs for it and removes what
    /// it stored, giving its bytes back to the app's storage room.
    fn let_go<'a>(&'a self, actor: &'a ActorAddress) -> BoxFuture<'a, Result<(), String>>;

    /// `actor`'s storage just opened in this process (`gate`, before the
    /// turn that opened it runs): what the layer owes the actor for rows
    /// it finds is not done here (the actor is held by that turn), but
    /// started, to run after it. Nothing, unless the layer says otherwise.
    fn opened(&self, actor: &ActorAddress, gate: &Arc<TurnGate>) {
        let _ = (actor, gate);
    }
}
