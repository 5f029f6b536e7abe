//! Fenced work: the launch journal that lets resident processes survive a
//! crash of the server, and the recovery that re-drives them.
//!
//! Invariants owned here:
//! - before a process runs its first instruction, a journal row (its
//!   launch spec, its pid, the re-drives spent on it) is committed durably
//!   in its owner's database (in cluster mode, accepted by the cluster's
//!   database with the owner's storage); a spawn whose row cannot be written is
//!   refused with the cause, and nothing starts. In cluster mode a row
//!   written and not confirmed may have been kept all the same: its spawn
//!   starts nothing, and the owner is owed a take-over that starts what
//!   the cluster kept ([`crate::handover`]). The row lives as long as
//!   the process: it is deleted, durably, when the process ends — in the
//!   owner's turn when the owner kills it (so a crash a moment later cannot
//!   bring back a process its owner saw end), after its own end otherwise.
//!   A process the server stops as it shuts down keeps its row: a graceful
//!   restart brings it back as a crash's would;
//! - after a restart, every owner with rows is recovered at once, on its
//!   own, without waiting for a request; such owners are found by their
//!   launch marks (`weir_store::journal`), without opening every actor's
//!   database. Recovery adopts a fresh
//!   incarnation, so every row's pid is at or below the new pid base: owed
//!   work, not live work. A row with no re-drive spent is re-driven once,
//!   and the re-drive is spent durably before the program's first
//!   instruction; a row already re-driven (its re-drive was cut short by
//!   another crash) is abandoned loudly — a receipt with outcome `lost` —
//!   never re-driven again and never dropped silently;
//! - an owner is held between its turns for its whole recovery, taken
//!   before the server serves anything: a request that arrives meanwhile
//!   waits for its turn and then sees the re-driven process (single
//!   flight), never boots a second copy. In cluster mode the same rules
//!   apply wherever the owner's storage opens, to the rows of processes
//!   not running there ([`crate::handover`]).

use std::sync::{Arc, Weak};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use weir_actors::gate::TurnGate;
use weir_actors::{ActorHost, Exclusive};
use weir_runtime::receipt::{ReceiptSink, Terminal, write_receipt};
use weir_store::actor::{ActorDb, ActorStoreError, JournalRow, PID_STRIDE};

use crate::process::{Contract, PROCESS_TARGET};
use crate::process_table::Owner;

/// What a process does when the server crashed under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnCrash {
    /// Started again once, under a new pid (the default for servers).
    RestartOnce,
    /// Reported lost, not started again.
    Report,
}

/// Everything a re-drive needs, as kept in the journal. Nothing secret is
/// in it: the environment is what the owner gave the spawn, and secrets
/// are kept by name, resolved at every launch.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub image: String,
    #[serde(default)]
    pub contract: Contract,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// (variable, secret name) pairs.
    #[serde(default)]
    pub secret_env: Vec<(String, String)>,
    /// The start arguments, hex.
    pub start_args: String,
    /// The storage slot: name and whether it is durable.
    pub storage: Option<(String, bool)>,
    pub on_crash: OnCrash,
}

impl LaunchSpec {
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn decode(text: &str) -> Option<LaunchSpec> {
        serde_json::from_str(text).ok()
    }

    pub fn start_args(&self) -> Vec<u8> {
        (0..self.start_args.len() / 2)
            .filter_map(|i| u8::from_str_radix(self.start_args.get(2 * i..2 * i + 2)?, 16).ok())
            .collect()
    }

    pub fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Why a launch's row is not known to be durable.
#[derive(Debug)]
pub enum Unjournaled {
    /// It was not written: no node will ever find it.
    NotWritten(String),
    /// It was written, and the cluster's database did not confirm it (it
    /// did not answer in time, or this node's hold on the owner ended
    /// first): it may yet be there, for the owner's next opening.
    Unconfirmed(String),
}

impl std::fmt::Display for Unjournaled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unjournaled::NotWritten(why) => write!(
                f,
                "the launch journal cannot be written ({why}); nothing was started"
            ),
            Unjournaled::Unconfirmed(why) => write!(
                f,
                "the launch journal's row was not confirmed durable ({why}); nothing was started, and if the cluster kept the row, its launch is started once as soon as the owner can be opened again, and the owner told (supervisor.recovered)"
            ),
        }
    }
}

/// Writes the launch's row in the owner's turn and makes it durable (the
/// turn's writes so far commit with it: spawning is a durability barrier):
/// in cluster mode, accepted by the cluster's database, so that whichever
/// node holds the owner next finds it.
pub async fn journal_in_turn(
    gate: &TurnGate,
    pid: u64,
    spec: &LaunchSpec,
) -> Result<(), Unjournaled> {
    let spec = spec.encode();
    gate.write(|db| db.journal_put(pid, &spec, 0))
        .map_err(|_| Unjournaled::NotWritten("the owner's turn cannot write".to_string()))?;
    gate.flush().map_err(Unjournaled::NotWritten)?;
    gate.durable().await.map_err(Unjournaled::Unconfirmed)
}

/// Deletes a process's row in the owner's turn, durably.
pub fn release_in_turn(gate: &TurnGate, pid: u64) -> Result<(), String> {
    gate.write(|db| db.journal_delete(pid))
        .map_err(|_| "the owner's turn cannot write".to_string())?;
    gate.flush()
}

/// The actor host, bound after it is built (its classes' linkers hold the
/// programs' host functions, so the programs exist first).
#[derive(Default)]
pub struct Fence {
    actors: std::sync::OnceLock<Weak<ActorHost>>,
}

impl Fence {
    pub fn connect(&self, actors: &Arc<ActorHost>) {
        let _ = self.actors.set(Arc::downgrade(actors));
    }

    pub fn actors(&self) -> Option<Arc<ActorHost>> {
        self.actors.get()?.upgrade()
    }

    /// Deletes a process's row after it ended by itself, between the
    /// owner's turns (detached: the owner may be in a turn right now; in
    /// cluster mode a hibernated owner's storage is opened for it).
    pub fn release_later(&self, owner: &Owner, pid: u64) {
        let Some(actors) = self.actors() else { return };
        let owner = owner.clone();
        tokio::spawn(async move {
            let deleted = match actors.hold_open(&owner.class, &owner.name).await {
                Ok(mut held) => held
                    .storage(|db| db.journal_delete(pid))
                    .and_then(|_| held.unmark_if_unjournaled())
                    .map(drop),
                Err(e) => Err(e),
            };
            // An owner deleted meanwhile took the row with it.
            if let Err(e) = deleted.or_else(|e| match e {
                weir_actors::AdminError::NotFound(_) => Ok(()),
                e => Err(e),
            }) {
                tracing::warn!(%owner, pid, error = %e, "cannot delete an ended process's journal row");
            }
        });
    }
}

/// Where recovery reads and writes an owner's launch journal: the owner
/// held between its turns ([`Exclusive`]), or its storage just opened
/// under its hold (a handover's [`TurnGate`]).
pub trait Journal: Send {
    /// Runs `f` on the owner's database; each statement commits on its
    /// own unless `f` groups them in a transaction.
    fn storage<T>(
        &mut self,
        f: impl FnOnce(&mut ActorDb) -> Result<T, ActorStoreError>,
    ) -> Result<T, String>;

    /// Waits until everything written is durable (in cluster mode,
    /// accepted by the cluster's database).
    fn durable(&self) -> impl Future<Output = Result<(), String>> + Send;
}

impl Journal for Exclusive {
    fn storage<T>(
        &mut self,
        f: impl FnOnce(&mut ActorDb) -> Result<T, ActorStoreError>,
    ) -> Result<T, String> {
        Exclusive::storage(self, f).map_err(|e| e.to_string())
    }

    fn durable(&self) -> impl Future<Output = Result<(), String>> + Send {
        Exclusive::durable(self)
    }
}

impl Journal for Arc<TurnGate> {
    fn storage<T>(
        &mut self,
        f: impl FnOnce(&mut ActorDb) -> Result<T, ActorStoreError>,
    ) -> Result<T, String> {
        self.write_outside(f)
    }

    fn durable(&self) -> impl Future<Output = Result<(), String>> + Send {
        TurnGate::durable(self)
    }
}

/// What recovery decided for one owner, in one durable transaction.
pub struct Plan {
    pub incarnation: u64,
    /// Rows to re-drive, their re-drive now spent.
    pub redrive: Vec<(JournalRow, LaunchSpec)>,
    /// Rows given up, and why.
    pub lost: Vec<(JournalRow, &'static str)>,
}

/// Adopts a fresh incarnation for the held owner and spends the re-drive
/// of each `owed` row it will re-drive; deletes the owed rows it gives up
/// (a row that is not owed, of a process running here, is left alone).
/// Durable before it returns.
pub async fn plan(
    journal: &mut impl Journal,
    owed: impl Fn(&JournalRow) -> bool,
) -> Result<Plan, String> {
    let plan = journal.storage(|db| {
        // Durable before the plan: every row's pid is now at or below the
        // base.
        let incarnation = db.adopt_incarnation()?;
        db.transaction(|db| plan_rows(db, incarnation, owed))
    })?;
    journal.durable().await?;
    Ok(plan)
}

fn plan_rows(
    db: &mut ActorDb,
    incarnation: u64,
    owed: impl Fn(&JournalRow) -> bool,
) -> Result<Plan, ActorStoreError> {
    let base = incarnation.saturating_mul(PID_STRIDE);
    let mut plan = Plan {
        incarnation,
        redrive: Vec::new(),
        lost: Vec::new(),
    };
    for row in db.journal()?.into_iter().filter(|row| owed(row)) {
        let spec = LaunchSpec::decode(&row.spec);
        let why = match &spec {
            _ if row.pid == 0 || row.pid > base => None,
            None => Some("its launch spec cannot be read"),
            Some(_) if row.attempt > 0 => {
                Some("it was re-driven once already and did not come back")
            }
            Some(s) if s.on_crash == OnCrash::Report => Some("its on_crash is report"),
            Some(_) => None,
        };
        match (why, spec) {
            (Some(why), _) => {
                db.journal_delete(row.pid)?;
                plan.lost.push((row, why));
            }
            (None, Some(spec)) if row.pid <= base => {
                db.journal_put(row.pid, &row.spec, row.attempt + 1)?;
                plan.redrive.push((row, spec));
            }
            // Live work of this very incarnation (cannot happen
            // at start): left alone.
            (None, _) => {}
        }
    }
    Ok(plan)
}

/// Moves a re-driven row to the pid of its new process (re-drive still
/// spent), durably before that process's first instruction.
pub async fn rename(
    journal: &mut impl Journal,
    old: &JournalRow,
    new_pid: u64,
) -> Result<(), String> {
    let (spec, attempt) = (old.spec.clone(), old.attempt + 1);
    let old_pid = old.pid;
    journal.storage(move |db| {
        db.transaction(|db| {
            db.journal_delete(old_pid)?;
            db.journal_put(new_pid, &spec, attempt)
        })
    })?;
    journal.durable().await
}

/// The re-driven process is up: its row is a plain launch again (the next
/// crash re-drives it once more).
pub fn settled(journal: &mut impl Journal, pid: u64, spec: &str) -> Result<(), String> {
    journal.storage(|db| db.journal_put(pid, spec, 0))
}

/// Deletes a row whose re-drive failed.
pub fn drop_row(journal: &mut impl Journal, pid: u64) -> Result<(), String> {
    journal.storage(|db| db.journal_delete(pid).map(drop))
}

/// The images every launch journal under `directory` names, each with
/// an owner whose journal names it: what a sweep must spare, and `rm`
/// refuse, while the server is down, so that recovery finds them. Only
/// the databases with a launch mark are opened (every journal with rows
/// has one, see `weir_store::journal`); in a data dir last served by a
/// build before marks, every database is. One that cannot be read is an
/// error: the images it names cannot be known. The caller holds the data
/// dir, so no server changes a journal meanwhile.
pub fn journaled_images(
    directory: &weir_actors::ActorDirectory,
) -> Result<std::collections::BTreeMap<crate::Digest, Owner>, String> {
    let mut images = std::collections::BTreeMap::new();
    let marks_kept = directory.marks_kept();
    for class in directory.classes().map_err(|e| e.to_string())? {
        let found = directory.scan(&class).map_err(|e| e.to_string())?;
        let searched = if marks_kept {
            found.marked
        } else {
            found.actors
        };
        for actor in searched {
            let rows = directory
                .open(&actor)
                .and_then(|db| Ok(db.journal()?))
                .map_err(|e| {
                    format!(
                        "cannot read the launch journal of actor {}/{}: {e}",
                        actor.class, actor.name
                    )
                })?;
            for row in rows {
                let Some(digest) = LaunchSpec::decode(&row.spec)
                    .and_then(|spec| spec.image.parse::<crate::Digest>().ok())
                else {
                    continue;
                };
                images.entry(digest).or_insert_with(|| Owner {
                    class: actor.class.clone(),
                    name: actor.name.clone(),
                });
            }
        }
    }
    Ok(images)
}

/// What only a recovery receipt has.
#[derive(Serialize)]
struct RecoveryFields<'a> {
    class: &'a str,
    name: &'a str,
    old_pid: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    new_pid: Option<u64>,
    image: &'a str,
}

/// One receipt per row recovery handled: `recovered` (with the new pid)
/// or `lost` (with why).
pub fn write_recovery_receipt(
    sink: &dyn ReceiptSink,
    owner: &Owner,
    old_pid: u64,
    new_pid: Option<u64>,
    image: &str,
    lost: Option<&str>,
) {
    write_receipt(
        sink,
        PROCESS_TARGET,
        "recovery",
        SystemTime::now(),
        &RecoveryFields {
            class: &owner.class,
            name: &owner.name,
            old_pid,
            new_pid,
            image,
        },
        &Terminal {
            outcome: if lost.is_some() { "lost" } else { "recovered" },
            error: lost.map(|_| "process_lost"),
            status: None,
            queued_us: None,
            wasm_us: None,
            total_us: 0,
            operations: 0,
            operations_refused: 0,
            detail: lost,
        },
    );
}
