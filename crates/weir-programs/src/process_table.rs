//! The process table: which actor owns which resident process, under which
//! pid and in which slot, and the budgets that bound them.
//!
//! Invariants owned here:
//! - a pid is above the pid base of the incarnation that asks for it
//!   (`incarnation × PID_STRIDE`) and above every pid its owner was given
//!   before, so it never repeats within the owner: an owner's live
//!   instance and a re-drive under a newer incarnation may reserve in
//!   turn, and neither makes the other count again from its base. A pid
//!   at or below the owner's current base belongs to an earlier
//!   incarnation;
//! - an owner holds at most `max_processes_per_actor` slots and the server
//!   at most `max_processes`, counting processes still booting. A slot is
//!   the lowest free number, and it is given back only when its process is
//!   fully gone (its instance dropped), never during teardown, so two
//!   processes never share one;
//! - a refused spawn names the limit and who holds the most (owner, pids,
//!   bytes), not a bare "limit reached".

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use weir_store::actor::PID_STRIDE;

use crate::process::Process;

/// An actor that owns processes: class and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Owner {
    pub class: String,
    pub name: String,
}

/// Owner `name` of class `c`, for unit tests.
#[cfg(test)]
pub(crate) fn owner(name: &str) -> Owner {
    Owner {
        class: "c".into(),
        name: name.into(),
    }
}

impl From<&weir_actors::ActorAddress> for Owner {
    fn from(actor: &weir_actors::ActorAddress) -> Owner {
        Owner {
            class: actor.class.clone(),
            name: actor.name.clone(),
        }
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.class, self.name)
    }
}

/// A pid and slot reserved for a process being spawned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub pid: u64,
    pub slot: u32,
}

/// A reservation that gives itself back unless its process started.
pub struct Reserved {
    table: Arc<ProcessTable>,
    pub owner: Owner,
    pub reservation: Reservation,
    armed: bool,
}

impl Reserved {
    /// The process is up: it holds the slot from now on, until
    /// [`ProcessTable::ended`].
    pub fn started(mut self, resident: Arc<Process>) {
        self.armed = false;
        self.table.started(&self.owner, resident);
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if self.armed {
            self.table.release(&self.owner, self.reservation);
        }
    }
}

/// What one owner holds.
#[derive(Default)]
struct Owned {
    /// The last pid given: the next is above it, whatever incarnation
    /// asks.
    last_pid: u64,
    slots: BTreeSet<u32>,
    /// Running processes (booting ones hold a slot but are not here yet).
    running: BTreeMap<u64, Arc<Process>>,
    /// The last processes that ended (each says how): what a request to
    /// one of them is told, and what `status` shows.
    ended: VecDeque<Arc<Process>>,
    peak: usize,
}

/// Ended processes an owner's table remembers: enough that a request
/// racing a kill or a crash is told what happened; bounded, so a spawn loop
/// cannot grow it.
pub const ENDED_REMEMBERED: usize = 64;

/// One owner's line in the budgets ledger.
#[derive(Clone, Debug, Serialize)]
pub struct Holder {
    pub owner: Owner,
    pub pids: Vec<u64>,
    /// Slots held (booting processes included).
    pub slots: usize,
    pub peak: usize,
    /// Linear memory of its running processes.
    pub memory_bytes: u64,
    /// The images its running processes hold rooted.
    pub images: std::collections::BTreeSet<crate::Digest>,
}

/// Why a spawn was refused before anything started.
#[derive(Debug, thiserror::Error)]
#[error("{limit} ({value}) reached: {holders}")]
pub struct LimitRefusal {
    pub limit: &'static str,
    pub value: usize,
    pub holders: String,
}

/// Every resident process of one server.
pub struct ProcessTable {
    owners: Mutex<HashMap<Owner, Owned>>,
    max_per_owner: usize,
    max_total: usize,
}

impl ProcessTable {
    pub fn new(max_per_owner: usize, max_total: usize) -> Arc<ProcessTable> {
        Arc::new(ProcessTable {
            owners: Mutex::new(HashMap::new()),
            max_per_owner,
            max_total,
        })
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, Owned>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pid and the lowest free slot for a new process of `owner` in its
    /// `incarnation`, held until the process starts or the guard drops (a
    /// spawn that fails, or whose turn ends first, gives them back).
    pub fn reserve_guarded(
        self: &Arc<Self>,
        owner: &Owner,
        incarnation: u64,
    ) -> Result<Reserved, LimitRefusal> {
        let reservation = self.reserve(owner, incarnation)?;
        Ok(Reserved {
            table: self.clone(),
            owner: owner.clone(),
            reservation,
            armed: true,
        })
    }

    /// A pid and the lowest free slot for a new process of `owner` in its
    /// `incarnation`, or the limit that refuses it.
    fn reserve(&self, owner: &Owner, incarnation: u64) -> Result<Reservation, LimitRefusal> {
        let mut owners = self.owners();
        let total: usize = owners.values().map(|o| o.slots.len()).sum();
        if total >= self.max_total {
            return Err(refusal("max_processes", self.max_total, &owners, None));
        }
        let held = owners.get(owner).map_or(0, |o| o.slots.len());
        if held >= self.max_per_owner {
            return Err(refusal(
                "max_processes_per_actor",
                self.max_per_owner,
                &owners,
                Some(owner),
            ));
        }
        let owned = owners.entry(owner.clone()).or_default();
        let pid = owned
            .last_pid
            .max(incarnation.saturating_mul(PID_STRIDE))
            .saturating_add(1);
        owned.last_pid = pid;
        let slot = (0..)
            .find(|s| !owned.slots.contains(s))
            .expect("a free slot");
        owned.slots.insert(slot);
        owned.peak = owned.peak.max(owned.slots.len());
        Ok(Reservation { pid, slot })
    }

    /// The reserved process is up.
    fn started(&self, owner: &Owner, resident: Arc<Process>) {
        if let Some(owned) = self.owners().get_mut(owner) {
            owned.running.insert(resident.pid, resident);
        }
    }

    /// The process is fully gone (or never started): its slot is free.
    fn release(&self, owner: &Owner, reservation: Reservation) {
        let mut owners = self.owners();
        if let Some(owned) = owners.get_mut(owner) {
            owned.running.remove(&reservation.pid);
            owned.slots.remove(&reservation.slot);
        }
    }

    /// The process is fully gone after running: its slot is free, and how
    /// it ended is remembered.
    pub fn ended(&self, owner: &Owner, reservation: Reservation, why: &str) {
        let mut owners = self.owners();
        if let Some(owned) = owners.get_mut(owner) {
            let gone = owned.running.remove(&reservation.pid);
            owned.slots.remove(&reservation.slot);
            if let Some(gone) = gone {
                debug_assert_eq!(gone.ended().as_deref(), Some(why));
                if owned.ended.len() == ENDED_REMEMBERED {
                    owned.ended.pop_front();
                }
                owned.ended.push_back(gone);
            }
        }
    }

    /// How `owner`'s process `pid` ended, if it did recently.
    pub fn ended_how(&self, owner: &Owner, pid: u64) -> Option<String> {
        self.recent(owner, pid)?.ended()
    }

    /// `owner`'s process `pid`, running or recently ended.
    pub fn recent(&self, owner: &Owner, pid: u64) -> Option<Arc<Process>> {
        let owners = self.owners();
        let owned = owners.get(owner)?;
        owned
            .running
            .get(&pid)
            .or_else(|| owned.ended.iter().find(|r| r.pid == pid))
            .cloned()
    }

    /// `owner`'s running process `pid`.
    pub fn get(&self, owner: &Owner, pid: u64) -> Option<Arc<Process>> {
        self.owners().get(owner)?.running.get(&pid).cloned()
    }

    /// Every running process, by owner and pid.
    pub fn all(&self) -> Vec<Arc<Process>> {
        let owners = self.owners();
        let mut all: Vec<_> = owners
            .values()
            .flat_map(|o| o.running.values().cloned())
            .collect();
        all.sort_by(|a, b| (&a.owner, a.pid).cmp(&(&b.owner, b.pid)));
        all
    }

    /// `owner`'s running processes, by pid.
    pub fn of(&self, owner: &Owner) -> Vec<Arc<Process>> {
        self.owners()
            .get(owner)
            .map(|o| o.running.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every owner that holds a slot, the biggest holder first.
    pub fn ledger(&self) -> Vec<Holder> {
        ledger(&self.owners())
    }

    /// Running processes and held slots, server-wide.
    pub fn counts(&self) -> (usize, usize) {
        let owners = self.owners();
        (
            owners.values().map(|o| o.running.len()).sum(),
            owners.values().map(|o| o.slots.len()).sum(),
        )
    }
}

/// Most holders a refusal names.
const HOLDERS_NAMED: usize = 3;

fn ledger(owners: &HashMap<Owner, Owned>) -> Vec<Holder> {
    let mut holders: Vec<Holder> = owners
        .iter()
        .filter(|(_, o)| !o.slots.is_empty())
        .map(|(owner, o)| Holder {
            owner: owner.clone(),
            pids: o.running.keys().copied().collect(),
            slots: o.slots.len(),
            peak: o.peak,
            memory_bytes: o.running.values().map(|r| r.memory_bytes()).sum(),
            images: o.running.values().map(|r| r.image).collect(),
        })
        .collect();
    holders.sort_by(|a, b| {
        (b.slots, b.memory_bytes, &a.owner).cmp(&(a.slots, a.memory_bytes, &b.owner))
    });
    holders
}

fn refusal(
    limit: &'static str,
    value: usize,
    owners: &HashMap<Owner, Owned>,
    only: Option<&Owner>,
) -> LimitRefusal {
    let holders = ledger(owners)
        .into_iter()
        .filter(|h| only.is_none_or(|o| &h.owner == o))
        .take(HOLDERS_NAMED)
        .map(|h| {
            let booting = h.slots - h.pids.len();
            let mut line = format!(
                "{} holds {} (pids {:?}, {} bytes",
                h.owner, h.slots, h.pids, h.memory_bytes
            );
            if booting > 0 {
                line.push_str(&format!(", {booting} booting"));
            }
            line.push(')');
            line
        })
        .collect::<Vec<_>>()
        .join("; ");
    LimitRefusal {
        limit,
        value,
        holders,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_come_from_the_incarnation_and_slots_are_reused_lowest_first() {
        let table = ProcessTable::new(3, 100);
        let a = owner("a");
        let first = table.reserve(&a, 2).unwrap();
        let second = table.reserve(&a, 2).unwrap();
        assert_eq!(
            first,
            Reservation {
                pid: 2_000_001,
                slot: 0
            }
        );
        assert_eq!(
            second,
            Reservation {
                pid: 2_000_002,
                slot: 1
            }
        );
        table.release(&a, first);
        let third = table.reserve(&a, 2).unwrap();
        assert_eq!(
            third,
            Reservation {
                pid: 2_000_003,
                slot: 0
            },
            "pid never reused, slot 0 is"
        );
        // A new incarnation counts from its own base.
        let fourth = table.reserve(&a, 3).unwrap();
        assert_eq!(
            fourth,
            Reservation {
                pid: 3_000_001,
                slot: 2
            }
        );
        // An older incarnation that is still live (a re-drive adopted the
        // newer one meanwhile) never counts from its base again.
        table.release(&a, fourth);
        let older = table.reserve(&a, 2).unwrap();
        assert_eq!(older.pid, 3_000_002);
        table.release(&a, older);
        assert_eq!(table.reserve(&a, 3).unwrap().pid, 3_000_003);
    }

    #[test]
    fn a_refusal_names_the_limit_and_the_holders() {
        let table = ProcessTable::new(2, 3);
        let (a, b) = (owner("a"), owner("b"));
        table.reserve(&a, 1).unwrap();
        table.reserve(&a, 1).unwrap();
        let e = table.reserve(&a, 1).unwrap_err();
        assert_eq!(e.limit, "max_processes_per_actor");
        assert_eq!(
            e.to_string(),
            "max_processes_per_actor (2) reached: c/a holds 2 (pids [], 0 bytes, 2 booting)"
        );
        table.reserve(&b, 1).unwrap();
        let e = table.reserve(&b, 1).unwrap_err();
        assert_eq!(e.limit, "max_processes");
        assert!(
            e.to_string()
                .starts_with("max_processes (3) reached: c/a holds 2"),
            "{e}"
        );
        assert!(e.to_string().contains("; c/b holds 1"), "{e}");
    }
}
