//! Shipping: an owned object's commits made durable at the coordinator —
//! in order, fenced, several at a time — and the tickets that hold each
//! effect back until the commits before it are durable.
//!
//! Invariants owned here:
//! - entries go to the coordinator in head order, each batch continuing
//!   from the last head the coordinator accepted; a batch is sent only
//!   while the session that claimed the object holds its lease;
//! - the first batch that fails ends the shipper: a fenced one (another
//!   node owns the object now) as `ownership_lost`, an unanswered one as
//!   `storage_unavailable` (it may or may not have been kept); every
//!   ticket waiting then, and every later one, fails with it, and its
//!   holder resets the object rather than trusting its local copy;
//! - a ticket ([`Shipper::settled`]) resolves `Ok` only once everything
//!   shipped before it was accepted and the node still holds the lease it
//!   claimed the object under, so nothing leaves on a lapsed lease;
//! - while a batch is in flight, newer commits wait and go together in the
//!   next one, as one log entry spanning them ([`Commit::encode_run`]): one
//!   round trip, one encode and one log row carry as many commits as
//!   arrived during the last; a run never crosses the head of a pending
//!   snapshot, so every snapshot falls on an entry's boundary and a
//!   restore replays whole entries after it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use weir_store::replica::{LogEntry, encode_run};

use crate::coordinator::{CoordError, Coordinator, Entry, Mirror, Owner};
use crate::error_code::ClusterErrorCode;
use crate::ownership::{Owned, Ownership};

/// Commits sent in one batch at most: bounds the work of one encode and
/// the size of one log row.
pub const MAX_BATCH_COMMITS: usize = 256;

/// Bytes of pages sent in one batch at most, before compression (a batch
/// always takes at least one commit, whatever its size): bounds one log
/// row and one statement.
pub const MAX_BATCH_BYTES: usize = 8 << 20;

/// A commit as a shipper queues it: the commits that go to the
/// coordinator in one batch become one log entry.
pub trait Commit: Send + 'static {
    /// Its number in the object's history.
    fn head(&self) -> u64;
    /// The object's checksum after it.
    fn checksum(&self) -> u64;
    /// The bytes it holds, against [`MAX_BATCH_BYTES`].
    fn bytes(&self) -> usize;
    /// The object's size after it, in bytes (when a snapshot is due).
    fn db_bytes(&self) -> u64;
    /// One log entry for a run of consecutive commits, which a restore
    /// applies as it would apply each of them in turn.
    fn encode_run(run: &[Self]) -> Result<Vec<u8>, String>
    where
        Self: Sized;
}

/// A replica's commit: its pages, encoded with the rest of its run as one
/// LTX file.
impl Commit for LogEntry {
    fn head(&self) -> u64 {
        self.head
    }

    fn checksum(&self) -> u64 {
        self.checksum.into_inner()
    }

    fn bytes(&self) -> usize {
        self.page_bytes()
    }

    fn db_bytes(&self) -> u64 {
        LogEntry::db_bytes(self)
    }

    fn encode_run(run: &[LogEntry]) -> Result<Vec<u8>, String> {
        encode_run(run).map_err(|e| e.to_string())
    }
}

/// Log bytes since the last snapshot past which a snapshot is taken,
/// at least; a snapshot is also due once the log outgrows the database,
/// so that a restore never replays much more than it rebuilds.
pub const SNAPSHOT_MIN_LOG_BYTES: u64 = 1 << 20;

/// What became of the last shipped commit, for the placement that opens
/// the object next: whether its local copy can be trusted without being
/// read again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Record {
    head: u64,
    checksum: u64,
    shipped: u64,
    broken: bool,
}

/// Every object's `Record`, kept across hibernation.
#[derive(Default)]
pub struct Records(Mutex<HashMap<String, Record>>);

impl Records {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The head and checksum the local copy of `key` holds, when every
    /// commit made on it was accepted (and none failed).
    pub fn clean(&self, key: &str) -> Option<(u64, u64)> {
        self.lock()
            .get(key)
            .filter(|r| !r.broken && r.shipped == r.head)
            .map(|r| (r.head, r.checksum))
    }

    /// True when a commit of `key` failed since its local copy was last
    /// opened (its fate may be unknown).
    pub fn failed(&self, key: &str) -> bool {
        self.lock().get(key).is_some_and(|r| r.broken)
    }

    /// The local copy of `key` is at `head` (opened, restored or checked).
    pub fn opened(&self, key: &str, head: u64, checksum: u64) {
        self.lock().insert(
            key.to_string(),
            Record {
                head,
                checksum,
                shipped: head,
                broken: false,
            },
        );
    }

    fn queued(&self, key: &str, head: u64, checksum: u64) {
        if let Some(r) = self.lock().get_mut(key) {
            r.head = head;
            r.checksum = checksum;
        }
    }

    fn shipped(&self, key: &str, head: u64) {
        if let Some(r) = self.lock().get_mut(key) {
            r.shipped = head;
        }
    }

    fn broken(&self, key: &str) {
        if let Some(r) = self.lock().get_mut(key) {
            r.broken = true;
        }
    }

    /// `key`'s history was deleted: nothing is known of a local copy.
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    shipped: u64,
    failure: Option<ClusterErrorCode>,
}

struct State<C> {
    /// Commits to ship, each with what the object's row mirrors after it.
    queue: Vec<(C, Mirror)>,
    /// What the row mirrors after the last queued commit.
    mirror: Mirror,
    queued: u64,
    shipped: u64,
    failure: Option<ClusterErrorCode>,
    /// Log bytes accepted since the last snapshot.
    log_bytes: u64,
    /// The database's size at the last queued commit, in bytes.
    db_bytes: u64,
    snapshot: Option<(u64, Vec<u8>)>,
    running: bool,
    /// What waits for a head to be accepted, in head order: released by
    /// the shipping task itself, with no task of their own.
    waiters: std::collections::VecDeque<(u64, Waiter)>,
    /// Waiters taken off `waiters` are being called (outside the lock):
    /// until they all are, a new one waits behind them, so that none is
    /// called before one made earlier.
    dispatching: bool,
}

/// Something to do once the commits before it are accepted (or failed).
pub type Waiter = Box<dyn FnOnce(Result<(), ClusterErrorCode>) + Send>;

struct Inner<C> {
    key: String,
    /// Where the shipping task runs: commits may be handed over from the
    /// storage threads, which are not the runtime's.
    runtime: tokio::runtime::Handle,
    ownership: Arc<Ownership>,
    records: Arc<Records>,
    owned: Owned,
    state: Mutex<State<C>>,
    progress: watch::Sender<Progress>,
}

/// The shipper of one open object (of a replica's commits, unless said
/// otherwise).
pub struct Shipper<C = LogEntry> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for Shipper<C> {
    fn clone(&self) -> Self {
        Shipper {
            inner: self.inner.clone(),
        }
    }
}

impl<C: Commit> Shipper<C> {
    /// A shipper for `key`, owned as `owned` (its head is where shipping
    /// continues from). Made inside the async runtime it ships on.
    pub fn new(
        key: &str,
        ownership: Arc<Ownership>,
        records: Arc<Records>,
        owned: Owned,
    ) -> Shipper<C> {
        let head = owned.state.head;
        Shipper {
            inner: Arc::new(Inner {
                key: key.to_string(),
                runtime: tokio::runtime::Handle::current(),
                ownership,
                records,
                owned,
                state: Mutex::new(State {
                    queue: Vec::new(),
                    mirror: Mirror::default(),
                    queued: head,
                    shipped: head,
                    failure: None,
                    log_bytes: owned.state.log_bytes,
                    db_bytes: 0,
                    snapshot: None,
                    running: false,
                    waiters: std::collections::VecDeque::new(),
                    dispatching: false,
                }),
                progress: watch::channel(Progress {
                    shipped: head,
                    failure: None,
                })
                .0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<C>> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `commits` (continuing the last queued head) with what the
    /// object's row mirrors after them.
    pub fn ship(&self, commits: Vec<C>, mirror: Mirror) {
        let Some(last) = commits.last() else { return };
        let (head, checksum, db_bytes) = (last.head(), last.checksum(), last.db_bytes());
        let start = {
            let mut s = self.lock();
            if s.failure.is_some() {
                return;
            }
            debug_assert_eq!(commits[0].head(), s.queued + 1, "commits continue the log");
            // Within one call only the mirror after the last entry is
            // known; the earlier ones get what is safe between it and the
            // one before, so a mirrored alarm is at worst early (a wake
            // that finds nothing due), never missing.
            let between = s.mirror.either(mirror);
            let n = commits.len();
            for (i, commit) in commits.into_iter().enumerate() {
                let after = if i + 1 == n { mirror } else { between };
                s.queue.push((commit, after));
            }
            s.queued = head;
            s.mirror = mirror;
            s.db_bytes = db_bytes;
            !std::mem::replace(&mut s.running, true)
        };
        self.inner.records.queued(&self.inner.key, head, checksum);
        if start {
            self.inner.runtime.spawn(self.clone().run());
        }
    }

    /// Resolves once everything queued until now was accepted and this
    /// node may still answer for the object.
    pub fn settled(&self) -> impl Future<Output = Result<(), ClusterErrorCode>> + Send + 'static {
        let target = self.lock().queued;
        let mut progress = self.inner.progress.subscribe();
        let inner = self.inner.clone();
        async move {
            loop {
                let now = *progress.borrow_and_update();
                if let Some(failure) = now.failure {
                    return Err(failure);
                }
                if now.shipped >= target {
                    break;
                }
                if progress.changed().await.is_err() {
                    return Err(ClusterErrorCode::StorageUnavailable);
                }
            }
            inner.may_answer()
        }
    }

    /// Calls `done` once everything queued until now was accepted (with
    /// whether this node may still answer for the object), or failed: at
    /// once if it is settled already, else from the shipping task, in the
    /// order the calls were made.
    pub fn on_settled(&self, done: Waiter) {
        let ready = {
            let mut s = self.lock();
            match s.failure {
                Some(failure) => Err(failure),
                // At once only behind no earlier waiter, queued or being
                // called: the calls keep their order (a socket's messages
                // theirs).
                None if s.shipped >= s.queued && s.waiters.is_empty() && !s.dispatching => Ok(()),
                None => {
                    let target = s.queued;
                    s.waiters.push_back((target, done));
                    return;
                }
            }
        };
        done(ready.and_then(|()| self.inner.may_answer()));
    }

    /// Calls the waiters whose heads are accepted now (or all of them,
    /// with the failure), in order: one release at a time calls them, and
    /// calls the ones that came meanwhile too before it ends.
    fn release(&self) {
        let mut s = self.lock();
        if s.dispatching {
            return;
        }
        s.dispatching = true;
        loop {
            let result = match s.failure {
                Some(failure) => Err(failure),
                None => Ok(()),
            };
            let mut ready = Vec::new();
            while let Some((target, _)) = s.waiters.front() {
                if result.is_ok() && *target > s.shipped {
                    break;
                }
                ready.push(s.waiters.pop_front().expect("a front").1);
            }
            if ready.is_empty() {
                s.dispatching = false;
                return;
            }
            drop(s);
            let result = result.and_then(|()| self.inner.may_answer());
            for done in ready {
                done(result);
            }
            s = self.lock();
        }
    }

    /// Why the object's state here can no longer be trusted, once it
    /// cannot: a batch failed, or the session it was claimed under ended.
    pub fn broken(&self) -> Option<ClusterErrorCode> {
        if let Some(failure) = self.lock().failure {
            return Some(failure);
        }
        let lease = self.inner.ownership.lease();
        (lease.generation() != self.inner.owned.held.generation)
            .then_some(ClusterErrorCode::OwnershipLost)
    }

    /// True when everything queued was accepted and nothing failed.
    pub fn idle(&self) -> bool {
        let s = self.lock();
        s.failure.is_none() && s.shipped == s.queued
    }

    /// True when a snapshot would compact the log.
    pub fn wants_snapshot(&self) -> bool {
        let s = self.lock();
        s.failure.is_none()
            && s.snapshot.is_none()
            && s.log_bytes >= SNAPSHOT_MIN_LOG_BYTES.max(s.db_bytes)
    }

    /// Stores a snapshot at `head` once everything before it is accepted.
    pub fn snapshot(&self, head: u64, ltx: Vec<u8>) {
        let start = {
            let mut s = self.lock();
            if s.failure.is_some() {
                return;
            }
            s.snapshot = Some((head, ltx));
            !std::mem::replace(&mut s.running, true)
        };
        if start {
            self.inner.runtime.spawn(self.clone().run());
        }
    }

    fn fail(&self, failure: ClusterErrorCode) {
        {
            let mut s = self.lock();
            s.failure = Some(failure);
            s.queue.clear();
            s.snapshot = None;
        }
        self.inner.records.broken(&self.inner.key);
        if failure == ClusterErrorCode::OwnershipLost {
            self.inner.ownership.lost(&self.inner.key);
        }
        self.inner
            .progress
            .send_modify(|p| p.failure = Some(failure));
        self.release();
    }

    /// Ships batches until the queue is empty.
    async fn run(self) {
        let fence = self.inner.owned.fence();
        let coordinator = self.inner.ownership.coordinator().clone();
        let ownership = self.inner.ownership.clone();
        loop {
            let (run, mirror, previous, snapshot) = {
                let mut s = self.lock();
                if s.failure.is_some() || (s.queue.is_empty() && s.snapshot.is_none()) {
                    s.running = false;
                    return;
                }
                // A pending snapshot's head ends the run it falls in.
                let boundary = match (&s.snapshot, s.queue.first()) {
                    (Some((at, _)), Some((first, _))) if first.head() <= *at => *at,
                    _ => u64::MAX,
                };
                let mut bytes = 0;
                let take = s
                    .queue
                    .iter()
                    .take(MAX_BATCH_COMMITS)
                    .take_while(|(c, _)| {
                        bytes += c.bytes();
                        bytes <= MAX_BATCH_BYTES && c.head() <= boundary
                    })
                    .count()
                    .max(1)
                    .min(s.queue.len());
                let mut mirror = Mirror::default();
                let run: Vec<C> = s
                    .queue
                    .drain(..take)
                    .map(|(commit, after)| {
                        mirror = after;
                        commit
                    })
                    .collect();
                let snapshot = if run.is_empty() {
                    s.snapshot.take()
                } else {
                    None
                };
                (run, mirror, s.shipped, snapshot)
            };
            if let Some((head, ltx)) = snapshot {
                match coordinator.snapshot(fence, head, &ltx).await {
                    Ok(true) => {
                        self.lock().log_bytes = 0;
                        crate::counters::add(&ownership.counters().snapshots, 1);
                    }
                    Ok(false) => {
                        self.fail(ClusterErrorCode::OwnershipLost);
                        return;
                    }
                    Err(e) => {
                        // Only compaction waits: the log stays whole.
                        tracing::warn!(key = %self.inner.key, error = %e, "cannot store a snapshot; the log keeps growing until the next try");
                    }
                }
                continue;
            }
            if let Err(failure) = self.inner.may_commit(&*coordinator).await {
                self.fail(failure);
                return;
            }
            let last = run.last().expect("a batch is never empty");
            let last = (last.head(), last.checksum());
            let sent = std::time::Instant::now();
            let commits = run.len();
            let entry = match C::encode_run(&run) {
                Ok(ltx) => Entry {
                    head: last.0,
                    ltx,
                    checksum: last.1,
                },
                Err(e) => {
                    tracing::error!(key = %self.inner.key, error = %e, "cannot encode the commits to ship");
                    self.fail(ClusterErrorCode::StorageUnavailable);
                    return;
                }
            };
            drop(run);
            let bytes = entry.ltx.len() as u64;
            let committed = ownership
                .committer()
                .commit(fence, previous, vec![entry], mirror)
                .await;
            tracing::debug!(key = %self.inner.key, commits, bytes, us = sent.elapsed().as_micros() as u64, "shipped");
            match committed {
                Ok(true) => {
                    let (head, checksum) = last;
                    let log_bytes = {
                        let mut s = self.lock();
                        s.shipped = head;
                        s.log_bytes += bytes;
                        s.log_bytes
                    };
                    self.inner.ownership.advanced(
                        &self.inner.key,
                        self.inner.owned.held,
                        head,
                        checksum,
                        log_bytes,
                    );
                    self.inner.records.shipped(&self.inner.key, head);
                    self.inner.progress.send_modify(|p| p.shipped = head);
                    self.release();
                }
                Ok(false) => {
                    tracing::warn!(key = %self.inner.key, epoch = fence.epoch, "a commit was fenced: another node owns the object now");
                    self.fail(ClusterErrorCode::OwnershipLost);
                    return;
                }
                Err(e) => {
                    tracing::warn!(key = %self.inner.key, error = %e, "a commit did not reach the cluster database");
                    self.fail(match e {
                        CoordError::Unavailable(_) | CoordError::Refused(_) => {
                            ClusterErrorCode::StorageUnavailable
                        }
                    });
                    return;
                }
            }
        }
    }
}

impl<C> Inner<C> {
    /// Whether this node may send a commit of the object now: it holds
    /// the lease it claimed the object under. A lapsed lease sends nothing;
    /// it only asks (a read) whether another node has the object now, so
    /// that the error says which happened.
    async fn may_commit(&self, coordinator: &dyn Coordinator) -> Result<(), ClusterErrorCode> {
        match self.may_answer() {
            Err(ClusterErrorCode::StorageUnavailable) => {
                let owner = coordinator.lookup(&self.key, self.owned.held.session).await;
                tracing::warn!(key = %self.key, ?owner, "this node's lease lapsed before a commit was sent");
                match owner {
                    Ok(Owner::Me(state)) if state.epoch == self.owned.state.epoch => {
                        Err(ClusterErrorCode::StorageUnavailable)
                    }
                    Ok(_) => Err(ClusterErrorCode::OwnershipLost),
                    Err(_) => Err(ClusterErrorCode::StorageUnavailable),
                }
            }
            other => other,
        }
    }

    /// Whether this node may answer for the object now: it holds the lease
    /// it claimed the object under.
    fn may_answer(&self) -> Result<(), ClusterErrorCode> {
        match self.ownership.lease().held() {
            Some(held) if held == self.owned.held => Ok(()),
            Some(_) => Err(ClusterErrorCode::OwnershipLost),
            None if self.ownership.lease().generation() != self.owned.held.generation => {
                Err(ClusterErrorCode::OwnershipLost)
            }
            None => Err(ClusterErrorCode::StorageUnavailable),
        }
    }
}
