//! The operators' view: what `/actors` and `weir actors` show and do —
//! the classes and counters, one actor's timers and entries, and
//! deletion.
//!
//! Invariant owned here: an operator reads and deletes between turns. An
//! inspection or a deletion claims the actor like a caller and waits for
//! its turn, so it sees exactly what is committed and never interleaves
//! with a turn. In cluster mode it does so on the node that owns the
//! actor ([`crate::operator_calls`]): an inspection reads only what is
//! durable, and a deletion removes the actor's history from the cluster's
//! database before its local copy. Listings are [`crate::listing`]'s.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use weir_store::actor::ActorDb;

use crate::address::{ActorAddress, AddressError};
use crate::directory::Unreadable;
use crate::error_code::TurnError;
use crate::host::ActorHost;
use crate::operator_calls::{Failure, OperatorAnswer, OperatorCall};
use crate::turn::{TurnReport, open_storage};

pub use crate::listing::{ActorPage, ActorSummary, LIST_PAGE, MAX_LIST_PAGE};

/// Most entries an inspection dumps; a larger actor is paged with `start`.
pub const MAX_INSPECT_ENTRIES: u32 = 1_000;

/// Local copies looked up in one question to the placement when a node
/// looks for copies of deleted actors: one statement's worth of keys.
pub const STALE_COPIES_BATCH: usize = 1_000;

/// Why an operator's request about an actor failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("no actor class `{0}` is declared")]
    UnknownClass(String),
    #[error(transparent)]
    Address(#[from] AddressError),
    /// Named as operators name it, `CLASS/NAME`.
    #[error("actor {}/{} does not exist", .0.class, .0.name)]
    NotFound(ActorAddress),
    #[error("{0}")]
    Storage(String),
    /// What does not run in cluster mode yet, named.
    #[error("{0} is not supported in cluster mode")]
    Clustered(&'static str),
    /// Refused with a code of its own: by the actor's placement (its
    /// owner could not be reached, the cluster's database did not
    /// answer), or by the node that owns the actor.
    #[error("{}", .0.message)]
    Refused(Failure),
}

impl AdminError {
    /// The HTTP status operators are answered with.
    pub fn status(&self) -> u16 {
        match self {
            AdminError::UnknownClass(_) | AdminError::NotFound(_) => 404,
            AdminError::Address(_) => 400,
            AdminError::Storage(_) => 500,
            AdminError::Clustered(_) => 501,
            AdminError::Refused(failure) => failure.status,
        }
    }

    /// The stable code operators are answered with.
    pub fn code(&self) -> &str {
        match self {
            AdminError::UnknownClass(_) => "actor_class_unknown",
            AdminError::NotFound(_) => "actor_not_found",
            AdminError::Address(_) => "actor_address_invalid",
            AdminError::Storage(_) => "storage_failed",
            AdminError::Clustered(_) => "not_in_cluster_mode",
            AdminError::Refused(failure) => &failure.code,
        }
    }
}

impl From<TurnError> for AdminError {
    fn from(code: TurnError) -> Self {
        use weir_runtime::WeirError;
        AdminError::Refused(Failure {
            status: code.status(),
            code: code.as_str().to_string(),
            message: format!(
                "the actor's owner or its storage could not take the call: {} (the nodes' logs say why)",
                code.as_str()
            ),
        })
    }
}

/// One actor in detail.
#[derive(Debug, Serialize, Deserialize)]
pub struct ActorDetail {
    #[serde(flatten)]
    pub summary: ActorSummary,
    pub incarnation: u64,
    pub entries: u64,
    pub timers: Vec<TimerView>,
    /// Its launch journal: the resident processes it started that have
    /// not ended, each brought back by the server's next start. (Absent
    /// from a node of an older build: none shown.)
    #[serde(default)]
    pub launches: Vec<LaunchView>,
    /// Entries (up to [`MAX_INSPECT_ENTRIES`]) when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<EntryView>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TimerView {
    pub reason: String,
    pub at_ms: i64,
    pub attempt: u32,
}

/// A launch journal row, as an operator sees it.
#[derive(Debug, Serialize, Deserialize)]
pub struct LaunchView {
    pub pid: u64,
    /// Re-drives spent on it.
    pub attempt: u32,
    /// The launch spec as the programs layer wrote it (its image, its
    /// arguments and environment, its storage slot, what a crash does):
    /// JSON, or the text itself should it not be.
    pub spec: serde_json::Value,
}

/// An entry: its value as UTF-8 text when it is, else as hex.
#[derive(Debug, Serialize, Deserialize)]
pub struct EntryView {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hex: Option<String>,
    pub bytes: usize,
}

/// The classes and counters, for `/actors`.
#[derive(Debug, Serialize)]
pub struct HostStatus {
    pub classes: Vec<String>,
    pub live: usize,
    /// Actors allowed in memory at once.
    pub max_live: usize,
    /// Actors with a database on this server, and how many may have one.
    pub actors: usize,
    pub max_actors: usize,
    /// What the app's actors take on disk together (the storage room's
    /// count: databases and storage slots), and how much they may
    /// (`max_actor_storage_bytes`).
    pub storage_bytes: u64,
    pub max_storage_bytes: u64,
    /// The part of `storage_bytes` their storage slots hold.
    pub slot_storage_bytes: u64,
    /// Calls refused because they would have made one actor too many, or
    /// one more in a full storage room.
    pub refused_new: u64,
    pub pending_timers: usize,
    pub turns: u64,
    pub failed_turns: u64,
    pub wakes: u64,
    pub hibernations: u64,
    pub overloaded: u64,
    pub alarms: u64,
    pub alarms_dropped: u64,
    /// Actors whose timers are being delivered now, the most at once
    /// since start, and the bound (`max_concurrent_alarms`).
    pub alarms_running: usize,
    pub alarms_running_peak: usize,
    pub max_concurrent_alarms: usize,
    /// Actors whose timers are due and wait for a place to be delivered.
    pub alarms_waiting: usize,
    /// Hibernated actors whose instances are still being freed.
    pub closing: usize,
    /// Database files found at start that could not be used (skipped).
    pub unreadable: Vec<Unreadable>,
    /// How far the timer pass of the actors on disk has come since the
    /// start ([`crate::timer_pass`]).
    pub timer_pass: crate::timer_pass::PassProgress,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl ActorHost {
    pub fn status(&self) -> HostStatus {
        let mut classes: Vec<String> = self.classes.keys().cloned().collect();
        classes.sort();
        let c = &self.counters;
        let (actors, max_actors) = self.directory.census();
        let (storage_bytes, max_storage_bytes) = self.directory.room().usage();
        HostStatus {
            classes,
            live: self.live_count(),
            max_live: self.max_live,
            actors,
            max_actors,
            storage_bytes,
            max_storage_bytes,
            slot_storage_bytes: self.directory.room().slot_bytes(),
            refused_new: c.refused_new.load(Ordering::Relaxed),
            pending_timers: self.timers.len(),
            turns: c.turns.load(Ordering::Relaxed),
            failed_turns: c.failed_turns.load(Ordering::Relaxed),
            wakes: c.wakes.load(Ordering::Relaxed),
            hibernations: c.hibernations.load(Ordering::Relaxed),
            overloaded: c.overloaded.load(Ordering::Relaxed),
            alarms: c.alarms.load(Ordering::Relaxed),
            alarms_dropped: c.alarms_dropped.load(Ordering::Relaxed),
            alarms_running: self.deliveries.running(),
            alarms_running_peak: self.deliveries.peak(),
            max_concurrent_alarms: self.deliveries.max(),
            alarms_waiting: self.timers.due(crate::timers::now_ms()),
            closing: self.closing.load(Ordering::Acquire),
            unreadable: self
                .unreadable
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            timer_pass: self.pass.progress(),
        }
    }

    /// One actor in detail; with `keys`, its entries from `start` on.
    /// It waits for the actor's turn like any caller and reads between
    /// turns — through the actor's own connection when it is live, else by
    /// opening its database — so it sees exactly what is committed (in
    /// cluster mode, on its owner, what is durable).
    pub async fn inspect(
        &self,
        class: &str,
        name: &str,
        keys: bool,
        start: Option<String>,
    ) -> Result<ActorDetail, AdminError> {
        let class = self.class(class)?;
        let actor = ActorAddress::new(&class.name, name)?;
        match self
            .operate(actor, OperatorCall::Inspect { keys, start })
            .await?
        {
            OperatorAnswer::Detail(detail) => Ok(*detail),
            other => Err(other.unexpected()),
        }
    }

    /// [`ActorHost::inspect`] on the node the actor's turns run on.
    pub(crate) async fn inspect_here(
        &self,
        actor: &ActorAddress,
        keys: bool,
        start: Option<String>,
    ) -> Result<ActorDetail, AdminError> {
        let class = self.class(&actor.class)?;
        let claim = self.claim_always(actor, &class);
        let mut live = claim.cell.live.lock().await;
        if self.placement.is_some() && live.gate.as_ref().is_some_and(|g| g.broken().is_some()) {
            // Nothing of it here is trusted: opened anew below.
            live.reset();
        }
        if live.gate.is_none() && !self.has_storage(actor) {
            return Err(AdminError::NotFound(actor.clone()));
        }
        if self.placement.is_some() {
            if live.gate.is_none() {
                let mut report = TurnReport::default();
                let ctx = self.context(&claim.cell, &class);
                match open_storage(&ctx, &mut report).await {
                    Ok(gate) => live.gate = Some(gate),
                    Err(why) => {
                        return Err(report
                            .error
                            .map_or(AdminError::Storage(why), AdminError::from));
                    }
                }
            }
            // What the turns before committed, once it is durable.
            if let Some(settled) = live.gate.as_ref().and_then(|g| g.settled()) {
                settled.await.map_err(AdminError::from)?;
            }
        }
        let is_live = live.generation.is_some();
        let detail = match &live.gate {
            Some(gate) => gate.with_db(|db| self.read_detail(actor, db, keys, start)),
            None => {
                let db = self
                    .directory
                    .open(actor)
                    .map_err(|e| AdminError::Storage(e.to_string()))?;
                self.read_detail(actor, &db, keys, start)
            }
        };
        drop(live);
        drop(claim);
        let mut detail = detail?;
        detail.summary.live = is_live;
        Ok(detail)
    }

    fn read_detail(
        &self,
        actor: &ActorAddress,
        db: &ActorDb,
        keys: bool,
        start: Option<String>,
    ) -> Result<ActorDetail, AdminError> {
        let storage = |e: weir_store::actor::ActorStoreError| AdminError::Storage(e.to_string());
        let timers = db
            .timers()
            .map_err(storage)?
            .into_iter()
            .map(|t| TimerView {
                reason: t.reason,
                at_ms: t.at_ms,
                attempt: t.attempt,
            })
            .collect();
        let keys = if keys {
            let entries = db
                .list(&weir_store::actor::ListOptions {
                    start,
                    limit: Some(MAX_INSPECT_ENTRIES),
                    ..Default::default()
                })
                .map_err(storage)?;
            Some(
                entries
                    .into_iter()
                    .map(|(key, value)| {
                        let bytes = value.len();
                        match String::from_utf8(value) {
                            Ok(text) => EntryView {
                                key,
                                text: Some(text),
                                hex: None,
                                bytes,
                            },
                            Err(e) => EntryView {
                                key,
                                text: None,
                                hex: Some(hex(e.as_bytes())),
                                bytes,
                            },
                        }
                    })
                    .collect(),
            )
        } else {
            None
        };
        let launches = db
            .journal()
            .map_err(storage)?
            .into_iter()
            .map(|row| LaunchView {
                pid: row.pid,
                attempt: row.attempt,
                spec: serde_json::from_str(&row.spec)
                    .unwrap_or(serde_json::Value::String(row.spec)),
            })
            .collect();
        Ok(ActorDetail {
            incarnation: db.incarnation().map_err(storage)?,
            entries: db.entry_count().map_err(storage)?,
            timers,
            launches,
            keys,
            summary: self.summary(actor),
        })
    }

    /// Deletes an actor: waits for its turn, has the layers above let go
    /// of what they keep in its name (its processes and storage slots,
    /// see [`crate::holdings`]), drops it from memory, removes its
    /// database and its timers — in cluster mode on its owner, its
    /// history in the cluster's database first. True if it existed.
    pub async fn delete(&self, class: &str, name: &str) -> Result<bool, AdminError> {
        let class = self.class(class)?;
        let actor = ActorAddress::new(&class.name, name)?;
        match self.operate(actor, OperatorCall::Delete).await? {
            OperatorAnswer::Deleted(existed) => Ok(existed),
            other => Err(other.unexpected()),
        }
    }

    /// [`ActorHost::delete`] on the node the actor's turns run on.
    pub(crate) async fn delete_here(&self, actor: &ActorAddress) -> Result<bool, AdminError> {
        let class = self.class(&actor.class)?;
        let claim = self.claim_always(actor, &class);
        let mut live = claim.cell.live.lock().await;
        for holdings in self.holdings() {
            holdings.let_go(actor).await.map_err(|why| {
                AdminError::Storage(format!("actor {}/{}: {why}", actor.class, actor.name))
            })?;
        }
        let gate = live.gate.take();
        live.reset();
        // In cluster mode its history goes first (its commits in flight
        // settled, so none lands after): a local copy left behind by a
        // failure is only a cache, checked again before it is used.
        let forgotten = match &self.placement {
            Some(placement) => {
                if let Some(settled) = gate.as_ref().and_then(|g| g.settled()) {
                    let _ = settled.await;
                }
                Some(placement.forget(actor).await.map_err(AdminError::from)?)
            }
            None => None,
        };
        let existed = self.remove_local(actor, gate)?;
        drop(live);
        drop(claim);
        Ok(forgotten.unwrap_or(existed))
    }

    /// Removes an actor's database here and its timers, once it is out of
    /// memory (`gate`: the connection it had open, if any). True if it had
    /// a database.
    fn remove_local(
        &self,
        actor: &ActorAddress,
        gate: Option<Arc<crate::gate::TurnGate>>,
    ) -> Result<bool, AdminError> {
        // Its database closes here unless something still holds its gate;
        // then the room counts it down when that closes.
        let still_open = gate.is_some_and(|g| Arc::into_inner(g).is_none());
        self.timers.set(actor, None);
        let deleted = if still_open {
            self.directory.delete_open(actor)
        } else {
            self.directory.delete(actor)
        };
        // After its file: a crash between leaves a row whose delivery
        // finds no actor (and removes it), never an actor without its row.
        if deleted.is_ok() {
            self.ledger_remove(actor);
        }
        deleted.map_err(|e| AdminError::Storage(e.to_string()))
    }

    /// Cluster mode: removes this node's local copy of an actor it does
    /// not own, kept from an earlier ownership (asked by the owner that
    /// deleted the actor, or found at start with no history behind it).
    /// True if there was one. A node that owns the actor keeps its copy:
    /// it is a new actor's.
    pub(crate) async fn drop_copy(&self, actor: &ActorAddress) -> Result<bool, AdminError> {
        let Some(placement) = &self.placement else {
            return Ok(false);
        };
        let class = self.class(&actor.class)?;
        let claim = self.claim_always(actor, &class);
        let mut live = claim.cell.live.lock().await;
        if placement.owns(actor) {
            return Ok(false);
        }
        let gate = live.gate.take();
        live.reset();
        let dropped = self.remove_local(actor, gate)?;
        placement.copy_dropped(actor);
        Ok(dropped)
    }

    /// Cluster mode: removes the local copies this node holds of actors
    /// with no history in the cluster's database (deleted while this node
    /// was away) and that it does not own. How many it removed.
    pub async fn drop_stale_copies(&self) -> Result<usize, AdminError> {
        let Some(placement) = &self.placement else {
            return Ok(0);
        };
        let mut classes: Vec<&String> = self.classes.keys().collect();
        classes.sort();
        let mut dropped = 0;
        for class in classes {
            let local = self
                .directory
                .list(class)
                .map_err(|e| AdminError::Storage(e.to_string()))?;
            // Asked about this node's copies only, a batch at a time, not
            // about every actor of the cluster.
            for batch in local.chunks(STALE_COPIES_BATCH) {
                let known: std::collections::HashSet<String> =
                    placement.with_history(batch).await?.into_iter().collect();
                for actor in batch {
                    if !known.contains(&actor.name) && self.drop_copy(actor).await? {
                        dropped += 1;
                    }
                }
            }
        }
        Ok(dropped)
    }
}
