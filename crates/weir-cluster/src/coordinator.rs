//! The coordinator: everything the cluster protocol asks of the one
//! database every node trusts (PostgreSQL, in [`crate::postgres`]). Leases,
//! ownership rows and the fenced log are its state; each call below is one
//! atomic step of the protocol, and the protocol's safety rests on these
//! steps alone:
//!
//! - a session's lease is renewed only while it has not expired (by the
//!   coordinator's clock); an expired session stays expired;
//! - an object is claimed only when it has no owner or its owner's lease
//!   expired, only by a session whose own lease is live, and every claim
//!   moves its epoch forward;
//! - a commit is accepted only from the owning session, at the object's
//!   current epoch and head, while that session's lease is live; it
//!   appends its log entries and moves the head in one step, or does
//!   nothing;
//! - an object is deleted only by its owning session, at its current
//!   epoch, while that session's lease is live, and whole: its row, log
//!   and snapshots go in one step, or nothing does.
//!
//! A second implementation (the deterministic simulation's, in the tests)
//! keeps the same rules in memory, so the node-side protocol code that runs
//! against PostgreSQL in production runs unchanged under simulated faults.

use async_trait::async_trait;
pub use weir_store::replica::Mirror;

/// A node's registration: a new one at every start and after every lease
/// that was lost.
pub type SessionId = i64;

/// A live node, as the coordinator lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub session: SessionId,
    pub name: String,
    /// Where its internal listener is reached.
    pub address: String,
}

/// An object's row: its identity, its fence and where its history stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectState {
    pub id: i64,
    pub epoch: i64,
    /// The last commit accepted.
    pub head: u64,
    /// The database's checksum after it (LTX's running CRC-64).
    pub checksum: u64,
    /// Log bytes accepted since the last snapshot.
    pub log_bytes: u64,
}

/// Who owns an object, as the coordinator knows it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// No row yet, or a row nobody live owns.
    Nobody,
    /// This session.
    Me(ObjectState),
    /// Another live session, reached at `address`.
    Other { session: SessionId, address: String },
}

/// What a commit or snapshot is fenced by: the owning session and the
/// epoch its claim created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub object: i64,
    pub epoch: i64,
    pub session: SessionId,
}

/// One log entry as shipped: the run of commits that ends at `head`.
#[derive(Clone, Debug)]
pub struct Entry {
    pub head: u64,
    pub ltx: Vec<u8>,
    pub checksum: u64,
}

/// One object's batch of entries for one commit step: they continue from
/// `previous` (the head its fence last had accepted), and `mirror` is what
/// the object's row mirrors after the last of them.
#[derive(Clone, Debug)]
pub struct ShipBatch {
    pub fence: Fence,
    pub previous: u64,
    pub entries: Vec<Entry>,
    pub mirror: Mirror,
}

impl ShipBatch {
    /// The commits it carries: its entries span every head after
    /// `previous` up to the last one's.
    pub fn commits(&self) -> u64 {
        self.entries
            .last()
            .map_or(0, |e| e.head.saturating_sub(self.previous))
    }
}

/// How a claim ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// This session owns the object now (or already did).
    Owned(ObjectState),
    /// Another live session owns it.
    Other { session: SessionId, address: String },
    /// This session's lease is not live: it may claim nothing.
    LeaseLost,
}

/// An object with history, as an operator's listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    /// Its next alarm, ms since the Unix epoch.
    pub alarm_at: Option<i64>,
    /// The name of the live node that owns it now, if one does.
    pub owner: Option<String>,
}

/// How a deletion ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    /// Deleted; its row was at this head.
    Deleted { head: u64 },
    /// No object has the fence's id (an earlier deletion whose answer
    /// was lost took it): nothing is left to delete.
    Gone,
    /// The object is there and the fence no longer holds it (another
    /// owner, another epoch, or a lapsed lease): nothing was deleted.
    Fenced,
}

/// How a lease renewal ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Renewed; the live nodes now.
    Renewed(Vec<NodeInfo>),
    /// The lease had expired: the session is over.
    Expired,
}

/// How a registration ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registration {
    Registered {
        session: SessionId,
        nodes: Vec<NodeInfo>,
    },
    /// A live session of the same name exists (an earlier run of this
    /// node whose lease has not expired yet): try again later.
    NameInUse,
}

/// An object's history, as far as a given head: its newest snapshot at or
/// before it and the log entries after that.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub snapshot: Option<(u64, Vec<u8>)>,
    pub log: Vec<(u64, Vec<u8>)>,
}

/// An object claimed because its alarm was due, or because its launch
/// journal has rows, and its owner was gone.
#[derive(Clone, Debug)]
pub struct DueObject {
    pub key: String,
    pub state: ObjectState,
    /// Its next alarm, if it has one (due, unless it was claimed for its
    /// journal).
    pub alarm_at: Option<i64>,
    /// Its launch journal has rows: the processes it owns are owed.
    pub journaled: bool,
}

/// Why the coordinator could not answer.
#[derive(Clone, Debug, thiserror::Error)]
pub enum CoordError {
    /// It could not be reached, or did not answer in time; a step that
    /// was sent may or may not have taken effect.
    #[error("the cluster database is unavailable: {0}")]
    Unavailable(String),
    /// It answered with an error.
    #[error("the cluster database refused: {0}")]
    Refused(String),
}

/// The protocol's steps, each atomic at the coordinator.
#[async_trait]
pub trait Coordinator: Send + Sync + 'static {
    /// Starts a session for node `name`, unless a live one of that name
    /// exists; its lease lasts `ttl_ms` from now (the coordinator's now).
    async fn register(
        &self,
        name: &str,
        address: &str,
        ttl_ms: u64,
    ) -> Result<Registration, CoordError>;

    /// Renews a live lease by `ttl_ms` from now.
    async fn renew(&self, session: SessionId, ttl_ms: u64) -> Result<Renewal, CoordError>;

    /// Ends a session: its objects are released for others to claim at
    /// once, and its lease is gone.
    async fn release(&self, session: SessionId) -> Result<(), CoordError>;

    /// Whether every node that held a lease at `address` released it: no
    /// session there is live, or lapsed without being released. (A
    /// lapsed session's row stays until its node starts again under its
    /// name and owns nothing.)
    async fn left(&self, address: &str) -> Result<bool, CoordError>;

    /// Who owns `key` now, from `session`'s point of view.
    async fn lookup(&self, key: &str, session: SessionId) -> Result<Owner, CoordError>;

    /// Claims `key` for `session` if nobody live owns it (creating its row
    /// at head 0 with `empty_checksum` if it has none).
    async fn claim(
        &self,
        key: &str,
        session: SessionId,
        empty_checksum: u64,
    ) -> Result<Claimed, CoordError>;

    /// For each batch (of distinct objects, one session's), appends its
    /// entries and moves its object's head to the last of them, with the
    /// object's next alarm — where the batch's fence still holds; each
    /// batch is kept or not on its own, and the answer says which
    /// (`false`: another owner, another epoch, another head, or a lapsed
    /// lease; nothing of it was written). One atomic step.
    async fn commit_many(&self, batches: &[ShipBatch]) -> Result<Vec<bool>, CoordError>;

    /// Stores a snapshot at `head` and drops the log and snapshots it
    /// makes redundant; `false` when the fence no longer holds.
    async fn snapshot(&self, fence: Fence, head: u64, ltx: &[u8]) -> Result<bool, CoordError>;

    /// Deletes the object the fence names — its row, its log and its
    /// snapshots, in one step — where the fence still holds. A later
    /// claim of its key makes a new row, with a new id, that no fence of
    /// the old one matches.
    async fn delete(&self, fence: Fence) -> Result<Deleted, CoordError>;

    /// At most `limit` of the objects whose key starts with `prefix` and
    /// that have history (a head past 0), in key order, from the first
    /// whose key is past `prefix` followed by `after`.
    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, CoordError>;

    /// Those of `keys` whose objects have history (a head past 0).
    async fn with_history(&self, keys: &[String]) -> Result<Vec<String>, CoordError>;

    /// The history of object `id` up to `head`.
    async fn history(&self, id: i64, head: u64) -> Result<History, CoordError>;

    /// Claims, for `session`, up to `limit` actors whose alarm is due (by
    /// the coordinator's clock) and whose owner is gone; with them, the
    /// due actors `session` owns already (their epoch unchanged), so an
    /// alarm of an actor this node claimed but never opened fires too;
    /// and up to `limit` actors whose launch journal has rows and whose
    /// owner is gone (their processes run nowhere).
    async fn claim_due(&self, session: SessionId, limit: i64)
    -> Result<Vec<DueObject>, CoordError>;
}
