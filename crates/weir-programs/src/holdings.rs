//! What the programs keep in an actor's name — its resident processes
//! and its durable storage slots — let go of when the actor is deleted
//! (see `weir_actors::holdings`, whose invariant this upholds for this
//! layer): each process is killed and gone before the slots are removed,
//! and what the slots held goes back to the app's storage room.

use weir_actors::placement::BoxFuture;
use weir_actors::{ActorAddress, Holdings};

use crate::host::ProgramsHost;
use crate::process_table::Owner;
use crate::slot_quota::owner_bytes;

impl Holdings for ProgramsHost {
    fn let_go<'a>(&'a self, actor: &'a ActorAddress) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let owner = Owner::from(actor);
            for process in self.table.of(&owner) {
                // Its launch journal row goes with the owner's database:
                // its end must not reopen the owner to delete the row.
                process.release_by_owner();
                // Returns once the process is gone and its ephemeral slot
                // with it.
                process.kill().await;
            }
            let slots = self.slots()?;
            let dir = slots.owner_dir(&owner);
            tokio::task::spawn_blocking(move || slots.remove(&owner, &dir, owner_bytes))
                .await
                .map_err(|e| e.to_string())?
                .map(drop)
                .map_err(|e| format!("cannot remove its storage slots: {e}"))
        })
    }
}
