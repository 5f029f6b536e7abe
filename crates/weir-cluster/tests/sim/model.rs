//! The coordinator in memory, keeping PostgreSQL's rules step for step
//! (see `weir_cluster::postgres`): one atomic step per call, the model's
//! clock deciding leases. It also records what the invariants are checked
//! against: which session committed at each epoch.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use super::object::unframe;
use tokio::time::Instant;
use weir_cluster::coordinator::{
    Claimed, Deleted, DueObject, Entry, Fence, History, Listed, NodeInfo, ObjectState, Owner,
    Registration, Renewal, SessionId,
};

/// The Unix time the simulation's clock starts at, in ms.
pub const EPOCH_MS: i64 = 1_700_000_000_000;

struct NodeRow {
    name: String,
    address: String,
    expires: Instant,
}

#[derive(Clone, Copy)]
struct Row {
    id: i64,
    owner: Option<SessionId>,
    epoch: i64,
    head: u64,
    checksum: u64,
    log_bytes: u64,
    alarm_at: Option<i64>,
}

#[derive(Default)]
struct State {
    next_session: SessionId,
    next_id: i64,
    nodes: BTreeMap<SessionId, NodeRow>,
    rows: BTreeMap<String, Row>,
    log: BTreeMap<i64, Vec<(u64, Vec<u8>)>>,
    /// Who committed at each (object, epoch).
    committers: BTreeMap<(i64, i64), SessionId>,
    violations: Vec<String>,
    /// Claims that took an object from another session (or none).
    takeovers: u64,
    /// Commits the fence refused.
    refused: u64,
    /// Accepted entries that carried more than one write.
    runs: u64,
    /// Where each accepted entry ended: `(object, head)`.
    ends: BTreeSet<(i64, u64)>,
    /// Each object's latest stored snapshot: its head and bytes.
    snapshots: BTreeMap<i64, (u64, Vec<u8>)>,
    /// Snapshots stored.
    stored: u64,
    /// Deleted objects' logs, by key: when each was deleted, and its
    /// entries (the checks tell a write a deletion took from a lost one).
    erased: BTreeMap<String, Vec<Erased>>,
    /// Deletions accepted.
    deletions: u64,
}

/// A deleted object's log: when it was deleted, and its entries.
pub type Erased = (Instant, Vec<Vec<u8>>);

/// The model.
pub struct Model {
    state: Mutex<State>,
    start: Instant,
    /// False: commits skip the fence (owner, epoch, lease) — a broken
    /// coordinator, to show the checks catch one.
    fenced: bool,
}

impl Model {
    pub fn new(fenced: bool) -> Model {
        Model {
            state: Mutex::new(State::default()),
            start: Instant::now(),
            fenced,
        }
    }

    /// Takeovers, refused commits, entries that carried more than one
    /// write, stored snapshots and accepted deletions, so far.
    pub fn counts(&self) -> (u64, u64, u64, u64, u64) {
        let s = self.lock();
        (s.takeovers, s.refused, s.runs, s.stored, s.deletions)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// The model's wall clock, in ms since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        EPOCH_MS + (Instant::now() - self.start).as_millis() as i64
    }

    fn state_of(row: &Row) -> ObjectState {
        ObjectState {
            id: row.id,
            epoch: row.epoch,
            head: row.head,
            checksum: row.checksum,
            log_bytes: row.log_bytes,
        }
    }

    fn live(s: &State, session: SessionId) -> bool {
        s.nodes
            .get(&session)
            .is_some_and(|n| n.expires > Instant::now())
    }

    fn live_nodes(s: &State) -> Vec<NodeInfo> {
        s.nodes
            .iter()
            .filter(|(_, n)| n.expires > Instant::now())
            .map(|(session, n)| NodeInfo {
                session: *session,
                name: n.name.clone(),
                address: n.address.clone(),
            })
            .collect()
    }

    pub fn register(&self, name: &str, address: &str, ttl_ms: u64) -> Registration {
        let mut s = self.lock();
        let now = Instant::now();
        if s.nodes.values().any(|n| n.name == name && n.expires > now) {
            return Registration::NameInUse;
        }
        s.next_session += 1;
        let session = s.next_session;
        s.nodes.insert(
            session,
            NodeRow {
                name: name.to_string(),
                address: address.to_string(),
                expires: now + std::time::Duration::from_millis(ttl_ms),
            },
        );
        Registration::Registered {
            session,
            nodes: Model::live_nodes(&s),
        }
    }

    pub fn renew(&self, session: SessionId, ttl_ms: u64) -> Renewal {
        let mut s = self.lock();
        let now = Instant::now();
        match s.nodes.get_mut(&session) {
            Some(n) if n.expires > now => {
                n.expires = now + std::time::Duration::from_millis(ttl_ms);
                Renewal::Renewed(Model::live_nodes(&s))
            }
            _ => Renewal::Expired,
        }
    }

    pub fn release(&self, session: SessionId) {
        let mut s = self.lock();
        for row in s.rows.values_mut() {
            if row.owner == Some(session) {
                row.owner = None;
            }
        }
        s.nodes.remove(&session);
    }

    pub fn left(&self, address: &str) -> bool {
        !self.lock().nodes.values().any(|n| n.address == address)
    }

    fn lookup_locked(s: &State, key: &str, session: SessionId) -> Owner {
        let Some(row) = s.rows.get(key) else {
            return Owner::Nobody;
        };
        match row.owner {
            Some(owner) if Model::live(s, owner) && owner == session => {
                Owner::Me(Model::state_of(row))
            }
            Some(owner) if Model::live(s, owner) => Owner::Other {
                session: owner,
                address: s.nodes[&owner].address.clone(),
            },
            _ => Owner::Nobody,
        }
    }

    /// The objects with history under `prefix` (as PostgreSQL's list).
    pub fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Vec<Listed> {
        let s = self.lock();
        let after = after.map(|a| format!("{prefix}{a}"));
        s.rows
            .iter()
            .filter(|(key, row)| key.starts_with(prefix) && row.head > 0)
            .filter(|(key, _)| after.as_ref().is_none_or(|a| *key > a))
            .take(limit)
            .map(|(key, row)| Listed {
                key: key.clone(),
                alarm_at: row.alarm_at,
                owner: row
                    .owner
                    .filter(|o| Model::live(&s, *o))
                    .map(|o| s.nodes[&o].name.clone()),
            })
            .collect()
    }

    /// Those of `keys` with history (as PostgreSQL's).
    pub fn with_history(&self, keys: &[String]) -> Vec<String> {
        let s = self.lock();
        keys.iter()
            .filter(|k| s.rows.get(*k).is_some_and(|row| row.head > 0))
            .cloned()
            .collect()
    }

    pub fn lookup(&self, key: &str, session: SessionId) -> Owner {
        Model::lookup_locked(&self.lock(), key, session)
    }

    pub fn claim(&self, key: &str, session: SessionId, empty: u64) -> Claimed {
        let mut s = self.lock();
        if Model::live(&s, session) {
            let claimable = match s.rows.get(key) {
                None => true,
                Some(row) => row.owner.is_none_or(|o| !Model::live(&s, o)),
            };
            if claimable {
                let row = match s.rows.get(key).copied() {
                    None => {
                        s.next_id += 1;
                        Row {
                            id: s.next_id,
                            owner: Some(session),
                            epoch: 1,
                            head: 0,
                            checksum: empty,
                            log_bytes: 0,
                            alarm_at: None,
                        }
                    }
                    Some(row) => {
                        s.takeovers += 1;
                        Row {
                            owner: Some(session),
                            epoch: row.epoch + 1,
                            ..row
                        }
                    }
                };
                s.rows.insert(key.to_string(), row);
                return Claimed::Owned(Model::state_of(&row));
            }
        }
        match Model::lookup_locked(&s, key, session) {
            Owner::Me(state) => Claimed::Owned(state),
            Owner::Other { session, address } => Claimed::Other { session, address },
            Owner::Nobody => Claimed::LeaseLost,
        }
    }

    pub fn commit(
        &self,
        fence: Fence,
        previous: u64,
        entries: &[Entry],
        alarm: Option<i64>,
    ) -> bool {
        let mut s = self.lock();
        let Some(last) = entries.last() else {
            return true;
        };
        let live = Model::live(&s, fence.session);
        let Some(key) = s
            .rows
            .iter()
            .find(|(_, r)| r.id == fence.object)
            .map(|(k, _)| k.clone())
        else {
            return false;
        };
        let row = s.rows[&key];
        let holds = row.owner == Some(fence.session) && row.epoch == fence.epoch && live;
        if row.head != previous || (self.fenced && !holds) {
            s.refused += 1;
            return false;
        }
        if fence.epoch < row.epoch {
            let v = format!(
                "object {}: a commit of epoch {} was accepted after epoch {} was claimed",
                fence.object, fence.epoch, row.epoch
            );
            s.violations.push(v);
        }
        // The invariant: one committing owner per epoch.
        match s.committers.get(&(fence.object, fence.epoch)) {
            Some(other) if *other != fence.session => {
                let v = format!(
                    "object {} epoch {}: sessions {other} and {} both committed",
                    fence.object, fence.epoch, fence.session
                );
                s.violations.push(v);
            }
            _ => {
                s.committers
                    .insert((fence.object, fence.epoch), fence.session);
            }
        }
        let bytes: u64 = entries.iter().map(|e| e.ltx.len() as u64).sum();
        // Each entry is a run of writes ending at its head: taken apart,
        // they must number on from the head before it, without a gap.
        let mut writes = Vec::new();
        let mut at = previous;
        for e in entries {
            let run = unframe(&e.ltx);
            if e.head != at + run.len() as u64 || run.is_empty() {
                let v = format!(
                    "object {}: an entry of {} writes ends at head {} after head {at}",
                    fence.object,
                    run.len(),
                    e.head
                );
                s.violations.push(v);
            }
            if run.len() > 1 {
                s.runs += 1;
            }
            for (i, write) in run.into_iter().enumerate() {
                writes.push((at + 1 + i as u64, write));
            }
            at = e.head;
            s.ends.insert((fence.object, e.head));
        }
        s.log.entry(fence.object).or_default().extend(writes);
        let row = s.rows.get_mut(&key).unwrap();
        row.head = last.head;
        row.checksum = last.checksum;
        row.alarm_at = alarm;
        row.log_bytes += bytes;
        true
    }

    /// Deletes the object the fence names, whole, while the fence holds
    /// (as PostgreSQL's does): the head its row had. Its log is kept aside
    /// for the checks.
    pub fn delete(&self, fence: Fence) -> Deleted {
        let mut s = self.lock();
        let live = Model::live(&s, fence.session);
        let Some((key, row)) = s
            .rows
            .iter()
            .find(|(_, r)| r.id == fence.object)
            .map(|(k, r)| (k.clone(), *r))
        else {
            return Deleted::Gone;
        };
        let holds = row.owner == Some(fence.session) && row.epoch == fence.epoch && live;
        if self.fenced && !holds {
            return Deleted::Fenced;
        }
        if fence.epoch < row.epoch {
            let v = format!(
                "object {}: a deletion of epoch {} was accepted after epoch {} was claimed",
                fence.object, fence.epoch, row.epoch
            );
            s.violations.push(v);
        }
        s.rows.remove(&key);
        let log = s.log.remove(&fence.object).unwrap_or_default();
        s.snapshots.remove(&fence.object);
        s.erased
            .entry(key)
            .or_default()
            .push((Instant::now(), log.into_iter().map(|(_, e)| e).collect()));
        s.deletions += 1;
        Deleted::Deleted { head: row.head }
    }

    /// Deleted objects' logs by key: when each went, and its entries.
    pub fn erased(&self) -> BTreeMap<String, Vec<Erased>> {
        self.lock().erased.clone()
    }

    /// Stores a snapshot at `head` while the fence holds and the row is
    /// at or past it (as PostgreSQL's does). A snapshot must fall where an
    /// entry ended: a restore replays whole entries after it.
    pub fn snapshot(&self, fence: Fence, head: u64, bytes: &[u8]) -> bool {
        let mut s = self.lock();
        let live = Model::live(&s, fence.session);
        let Some(row) = s.rows.values().find(|r| r.id == fence.object).copied() else {
            return false;
        };
        let holds = row.owner == Some(fence.session) && row.epoch == fence.epoch && live;
        if (self.fenced && !holds) || row.head < head {
            return false;
        }
        if head > 0 && !s.ends.contains(&(fence.object, head)) {
            let v = format!(
                "object {}: a snapshot at head {head} falls inside a log entry",
                fence.object
            );
            s.violations.push(v);
        }
        if s.snapshots
            .get(&fence.object)
            .is_none_or(|(at, _)| *at < head)
        {
            s.snapshots.insert(fence.object, (head, bytes.to_vec()));
        }
        s.stored += 1;
        if let Some(row) = s.rows.values_mut().find(|r| r.id == fence.object) {
            row.log_bytes = 0;
        }
        true
    }

    /// The latest snapshot at or before `head` and the writes after it
    /// (the model keeps every write, for the checks).
    pub fn history(&self, id: i64, head: u64) -> History {
        let s = self.lock();
        let snapshot = s.snapshots.get(&id).filter(|(at, _)| *at <= head).cloned();
        let from = snapshot.as_ref().map_or(0, |(at, _)| *at);
        History {
            snapshot,
            log: s
                .log
                .get(&id)
                .map(|l| {
                    l.iter()
                        .filter(|(h, _)| *h > from && *h <= head)
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    pub fn claim_due(&self, session: SessionId, limit: i64) -> Vec<DueObject> {
        let mut s = self.lock();
        if !Model::live(&s, session) {
            return Vec::new();
        }
        let now_ms = self.now_ms();
        let due: Vec<String> = s
            .rows
            .iter()
            .filter(|(_, r)| {
                r.alarm_at.is_some_and(|at| at <= now_ms)
                    && r.owner.is_none_or(|o| o == session || !Model::live(&s, o))
            })
            .map(|(k, _)| k.clone())
            .take(limit as usize)
            .collect();
        let mut claimed = Vec::new();
        for key in due {
            let row = s.rows.get_mut(&key).unwrap();
            let taken = row.owner != Some(session);
            if taken {
                row.owner = Some(session);
                row.epoch += 1;
            }
            claimed.push(DueObject {
                state: Model::state_of(row),
                alarm_at: row.alarm_at,
                journaled: false,
                key,
            });
            if taken {
                s.takeovers += 1;
            }
        }
        claimed
    }

    /// Every object's log, by key.
    pub fn logs(&self) -> BTreeMap<String, Vec<Vec<u8>>> {
        let s = self.lock();
        s.rows
            .iter()
            .map(|(key, row)| {
                let log = s
                    .log
                    .get(&row.id)
                    .map(|l| l.iter().map(|(_, e)| e.clone()).collect())
                    .unwrap_or_default();
                (key.clone(), log)
            })
            .collect()
    }

    /// Heads must be the log's length, without gaps.
    pub fn check_logs(&self) -> Vec<String> {
        let s = self.lock();
        let mut wrong = s.violations.clone();
        for (key, row) in &s.rows {
            let heads: Vec<u64> = s
                .log
                .get(&row.id)
                .map(|l| l.iter().map(|(h, _)| *h).collect())
                .unwrap_or_default();
            let expected: Vec<u64> = (1..=row.head).collect();
            if heads != expected {
                wrong.push(format!("{key}: log heads {heads:?}, head {}", row.head));
            }
        }
        wrong
    }
}
