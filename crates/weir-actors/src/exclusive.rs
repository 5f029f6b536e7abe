//! An actor held between its turns: what a layer above uses to keep its
//! own rows in the actor's database (the launch journal) and to do work in
//! the actor's name that no turn of it may race (recovery after a crash).
//!
//! Invariants owned here:
//! - while an [`Exclusive`] lives, no turn of its actor runs: callers wait
//!   for their turn as they would behind a long turn;
//! - a hibernated actor's database the holder opened is closed, and what
//!   the holder wrote is counted in the app's storage room, before any
//!   turn opens it again (when the hold ends, or before a turn runs for
//!   the holder through [`ActorHost::call_export`]);
//! - a turn run for the holder is a turn like any other: it commits, it
//!   fails, it leaves a receipt;
//! - a holder's storage is the actor's existing database, never a new
//!   one: a holder that waited while its actor was deleted finds nothing.

use std::time::Instant;

use weir_runtime::ErrorCode;
use weir_store::actor::{ActorDb, ActorStoreError};

use crate::address::ActorAddress;
use crate::directory::ActorDirectory;
use crate::gate::TurnGate;
use crate::host::{ActorHost, Claim};
use crate::operators::AdminError;
use crate::turn::Live;

/// An actor held between its turns ([`ActorHost::exclusive`]).
pub struct Exclusive {
    live: tokio::sync::OwnedMutexGuard<Live>,
    /// The database, opened for the holder when the actor was hibernated.
    db: Option<ActorDb>,
    /// What its files took before `db` opened them (the storage room
    /// counts them again when it closes).
    files: u64,
    actor: ActorAddress,
    directory: ActorDirectory,
    /// The actor's storage is a replica (cluster mode).
    replicated: bool,
    pub(crate) _claim: Claim,
}

impl Exclusive {
    /// Runs `f` on the actor's database. Each statement commits on its own
    /// unless `f` groups them with `ActorDb::transaction`. An actor with no
    /// database (deleted) is `NotFound`: a holder never makes one.
    pub fn storage<T>(
        &mut self,
        f: impl FnOnce(&mut ActorDb) -> Result<T, ActorStoreError>,
    ) -> Result<T, AdminError> {
        let storage = |e: ActorStoreError| AdminError::Storage(e.to_string());
        if let Some(gate) = &self.live.gate {
            return gate.write_outside(f).map_err(AdminError::Storage);
        }
        if self.replicated {
            // Only a woken actor's replica is known to be current.
            return Err(AdminError::Clustered(
                "holding a hibernated actor's storage",
            ));
        }
        if self.db.is_none() {
            if !self.directory.exists(&self.actor) {
                // Deleted (perhaps while the holder waited): what the
                // holder kept in its name went with it, and opening it
                // would make a new actor of its name.
                return Err(AdminError::NotFound(self.actor.clone()));
            }
            self.files = self.directory.files_bytes(&self.actor);
            let opened = self.directory.open(&self.actor);
            self.db = Some(opened.map_err(|e| AdminError::Storage(e.to_string()))?);
        }
        f(self.db.as_mut().expect("opened above")).map_err(storage)
    }

    /// The held actor.
    pub fn actor(&self) -> &ActorAddress {
        &self.actor
    }

    /// Waits until what the holder wrote is durable: in cluster mode,
    /// accepted by the cluster's database (on one machine a commit is
    /// already).
    pub fn durable(&self) -> impl Future<Output = Result<(), String>> + Send + 'static {
        let gate = self.live.gate.clone();
        async move {
            match gate {
                None => Ok(()),
                Some(gate) => gate.durable().await,
            }
        }
    }

    /// Removes the actor's launch mark if its launch journal has no rows
    /// (see `weir_store::journal`); true if it had none. Under the hold no
    /// turn can write a row meanwhile.
    pub fn unmark_if_unjournaled(&mut self) -> Result<bool, AdminError> {
        let empty = self.storage(|db| Ok(db.journal()?.is_empty()))?;
        if empty {
            self.directory.unmark(&self.actor);
        }
        Ok(empty)
    }

    /// Closes the holder's own connection, if it opened one: what the
    /// holder wrote is counted in the storage room before any turn opens
    /// the database again (a wake counts from what the room counted).
    fn close(&mut self) {
        if let Some(db) = self.db.take() {
            drop(db);
            let now = self.directory.files_bytes(&self.actor);
            self.directory.room().moved(self.files, now);
        }
    }
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        self.close();
    }
}

impl ActorHost {
    /// Holds an actor between its turns: from when this returns until the
    /// [`Exclusive`] drops, no turn of it runs (its callers wait, as for a
    /// long turn), and the holder reaches its database. How a layer above
    /// keeps its own rows (the launch journal) and does work in the actor's
    /// name that no turn of it may race (recovery after a crash).
    pub async fn exclusive(&self, class: &str, name: &str) -> Result<Exclusive, AdminError> {
        let class = self.class(class)?;
        let actor = ActorAddress::new(&class.name, name)?;
        let claim = self.claim_always(&actor, &class);
        let live = claim.cell.live.clone().lock_owned().await;
        Ok(Exclusive {
            live,
            db: None,
            files: 0,
            actor,
            directory: self.directory.clone(),
            replicated: self.placement.is_some(),
            _claim: claim,
        })
    }

    /// [`ActorHost::exclusive`] with the actor's storage open for the
    /// holder: in cluster mode a hibernated actor's replica is opened here
    /// (made current, its handover run) as a turn would open it, so the
    /// holder reaches it; on one machine the holder opens the database
    /// itself. An actor with no storage is `NotFound`: none is made.
    pub async fn hold_open(&self, class: &str, name: &str) -> Result<Exclusive, AdminError> {
        let mut held = self.exclusive(class, name).await?;
        if self.placement.is_some() {
            if held.live.gate.is_none() && !self.has_storage(&held.actor) {
                return Err(AdminError::NotFound(held.actor.clone()));
            }
            let cell = held._claim.cell.clone();
            let class = cell.class.load_full();
            let ctx = self.context(&cell, &class);
            let mut report = crate::turn::TurnReport::default();
            crate::turn::open_if_closed(&ctx, &mut held.live, &mut report)
                .await
                .map_err(AdminError::Storage)?;
        }
        Ok(held)
    }

    /// Calls `function` of `interface`, an export of the held actor's
    /// class, as one turn of the actor (woken if it was hibernated): its
    /// writes commit with it, it leaves a receipt (`turn: "call"`, the
    /// export as its reason), and it fails like any turn. `Ok(None)` when
    /// the class does not export it. How a layer above tells an actor what
    /// it did in its name (recovery's `weir:process/supervisor`).
    pub async fn call_export<P>(
        &self,
        held: &mut Exclusive,
        export: (&str, &str),
        params: P,
    ) -> Result<Option<()>, String>
    where
        P: wasmtime::component::ComponentNamedList
            + wasmtime::component::Lower
            + Send
            + Sync
            + 'static,
    {
        self.call_export_with(held, export, params, |_| Ok(()))
            .await
    }

    /// [`ActorHost::call_export`], with `before` run in the turn before
    /// the export is called: what it writes with the gate commits with
    /// the turn, or not at all (how the socket layer takes a socket off
    /// its actor's list in the turn that tells the actor of its end).
    pub async fn call_export_with<P>(
        &self,
        held: &mut Exclusive,
        (interface, function): (&str, &str),
        params: P,
        before: impl FnOnce(&TurnGate) -> Result<(), String>,
    ) -> Result<Option<()>, String>
    where
        P: wasmtime::component::ComponentNamedList
            + wasmtime::component::Lower
            + Send
            + Sync
            + 'static,
    {
        let cell = held._claim.cell.clone();
        let class = cell.class.load_full();
        let code = &class.code;
        let Some(index) = code
            .component
            .get_export_index(None, interface)
            .and_then(|i| code.component.get_export_index(Some(&i), function))
        else {
            return Ok(None);
        };
        // The holder's own connection goes first: a woken actor opens its
        // database for itself.
        held.close();
        let ctx = self.context(&cell, &class);
        let started = Instant::now();
        let mut report = crate::turn::TurnReport::default();
        let live = &mut *held.live;
        let ended = async {
            crate::turn::wake(&ctx, live, &mut report).await?;
            report.incarnation = live.incarnation;
            let generation = live.generation.as_mut().expect("woken");
            let func = generation
                .instance
                .get_typed_func::<P, (Result<(), String>,)>(&mut generation.store, index)
                .map_err(|e| format!("{interface}#{function}: {e:#}"))?;
            let ended = crate::turn::call_turn(
                &ctx,
                live,
                func,
                params,
                &mut report,
                before,
                |_, _| Ok(()),
            )
            .await;
            match ended {
                crate::turn::CallEnd::Done(()) => match live.gate.clone() {
                    None => Ok(Some(())),
                    Some(gate) => gate.durable().await.map(|()| Some(())),
                },
                crate::turn::CallEnd::Failed(why) | crate::turn::CallEnd::CommitFailed(why) => {
                    Err(why)
                }
            }
        }
        .await;
        if let Err(why) = &ended
            && report.error.is_none()
        {
            report.fail(ErrorCode::HostUnavailable, Some(why.clone()));
        }
        self.after_turn(&cell, live, false);
        let reason = format!("{interface}#{function}");
        let notes = crate::receipts::TurnNotes {
            reason: Some(&reason),
            ..Default::default()
        };
        self.receipt(
            &cell,
            &class,
            crate::receipts::TurnKind::Call,
            &report,
            notes,
            started,
            Instant::now(),
        );
        ended
    }
}
