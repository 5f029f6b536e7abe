//! Handover: in cluster mode an actor moves between nodes, and what a
//! layer above keeps running in its name (resident processes) must move
//! with it. The layer learns of each place the actor's storage opens, and
//! takes over there what the actor's own rows say is owed.
//!
//! Invariant the actor host keeps for a handover: every time an actor's
//! storage opens on this node in cluster mode (its first turn after a
//! claim, a wake from hibernation, a reopen after a broken commit, or a
//! layer's own [`ActorHost::hold_open`]), the bound handover runs with the
//! storage open and the actor held, before any turn of it; the turn that
//! opened it waits for it. An actor this node claimed for its rows alone
//! (no call brought it) is handed to the layer, which opens it, and keeps
//! trying while this node holds it: an opening that failed (the cluster's
//! database slow, a disk error) must not leave the work running nowhere.

use std::sync::Arc;

use crate::address::ActorAddress;
use crate::gate::TurnGate;
use crate::host::ActorHost;
use crate::operators::AdminError;
use crate::placement::BoxFuture;

/// A layer that keeps something running in actors' names (see the module
/// doc).
pub trait Handover: Send + Sync {
    /// `actor`'s storage just opened here (`gate`), and the actor is held:
    /// takes over what its rows say is owed and not running here.
    fn opened<'a>(&'a self, actor: &'a ActorAddress, gate: &'a Arc<TurnGate>) -> BoxFuture<'a, ()>;

    /// This node claimed `actor` without a call, because its rows say
    /// work is owed (its node died): the layer opens it here
    /// ([`ActorHost::hold_open`], which runs [`Handover::opened`]), trying
    /// again after a failure for as long as this node holds it.
    fn claimed(&self, actor: ActorAddress);
}

impl ActorHost {
    /// Binds the layer told of every opening of an actor's storage in
    /// cluster mode (once; a second binding is ignored).
    pub fn bind_handover(&self, handover: Arc<dyn Handover>) {
        let _ = self.handover.set(handover);
    }

    /// Hands an actor this node claimed for its rows alone to the bound
    /// handover ([`Handover::claimed`]), which takes its work over without
    /// waiting for a call: how a node that claimed an owner of work that
    /// runs nowhere (its node died) takes it over. Without a handover there
    /// is nothing to take over.
    pub fn take_over(&self, class: &str, name: &str) -> Result<(), AdminError> {
        let class = self.class(class)?;
        let actor = ActorAddress::new(&class.name, name)?;
        if let Some(handover) = self.handover.get() {
            handover.claimed(actor);
        }
        Ok(())
    }
}
