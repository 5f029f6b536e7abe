//! Key-value stores and SQL databases in cluster mode: each is owned by one
//! node at a time, like an actor, and every call to it — from a worker on
//! any node — runs on its owner's local replica, whose commits ship
//! through the owner row's fence before the call answers.
//!
//! Invariants owned here:
//! - a store's object key is `kv/<app>/<store>` (a database's
//!   `sql/<app>/<database>`), the same on every node;
//! - a call runs on a replica opened at the owner row's head under this
//!   node's current claim; a replica whose shipping failed, or whose claim
//!   is over, is closed and never used again (the next call reopens it,
//!   checked or rebuilt);
//! - a call answers only once the commits it made or read are durable at
//!   the coordinator; if they are not, it answers that it could not say
//!   (`storage_unavailable`, `ownership_lost`) rather than success.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use weir_actors::Forwarded;
use weir_runtime::WeirError;
use weir_runtime::extension::{StoreCall, StoreRouter};
use weir_runtime::sql_pool::SqlPool;
use weir_store::kv_op::{KvAnswer, KvOp};
use weir_store::replica::{LogEntry, Mirror, SharedCapture};
use weir_store::sql::{BatchError, SqlDatabase, Statement, StatementResult};
use weir_store::statement_bounds::StopCheck;
use weir_store::{Durability, KvStore, StoreError};

use crate::envelope::{self, Target};
use crate::error_code::ClusterErrorCode;
use crate::internal::{FORWARD_TIMEOUT, Forwarder};
use crate::ownership::{Located, Owned, Ownership};
use crate::replicas::Replicas;
use crate::shipper::Shipper;
use crate::store_wire::{self, Bounds};

/// The page size of stores and databases: SQLite's default, which guests
/// cannot change (their SQL may not set pragmas).
pub const STORE_PAGE_BYTES: u32 = 4096;

/// Which kind of storage a key names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Kv,
    Sql,
}

/// A replica open here.
enum Replica {
    Kv(Arc<KvStore>),
    Sql(Arc<SqlDatabase>),
}

impl Replica {
    fn capture(&self) -> Option<&SharedCapture> {
        match self {
            Replica::Kv(s) => s.capture(),
            Replica::Sql(d) => d.capture(),
        }
    }

    fn snapshot(&self) -> Result<Option<(u64, Vec<u8>)>, weir_store::replica::ReplicaError> {
        match self {
            Replica::Kv(s) => s.snapshot(),
            Replica::Sql(d) => d.snapshot(),
        }
    }

    fn checkpoint(&self) -> Result<bool, weir_store::replica::ReplicaError> {
        match self {
            Replica::Kv(s) => s.checkpoint(),
            Replica::Sql(d) => d.checkpoint(),
        }
    }
}

struct Open {
    replica: Replica,
    shipper: Shipper,
    owned: Owned,
}

/// The bounds an app's own calls to its stores run under, which bound the
/// calls other nodes send here for it too.
#[derive(Clone, Copy, Debug)]
pub struct OwnBounds {
    /// Each store's and database's size (`max_database_bytes`).
    pub max_bytes: u64,
    /// What one call hands back (`max_sql_result_bytes`).
    pub max_result_bytes: usize,
    /// The longest one of its own calls may run: to the end of its event
    /// or session (`event_limit_ms`, `session_limit_ms`).
    pub longest_call: std::time::Duration,
}

/// The stores and databases of one app, wherever their owners are.
pub struct StorePlacement {
    pub(crate) app: String,
    /// The app's data directory (stores under `kv/`, databases under `sql/`).
    pub(crate) data_dir: PathBuf,
    pub(crate) stores: HashSet<String>,
    pub(crate) databases: HashSet<String>,
    pub(crate) durability: Durability,
    /// Each store's and database's bound (`max_database_bytes`).
    pub(crate) max_bytes: u64,
    /// What one call hands back at most, and runs for at most: a call
    /// from another node is bounded by them too, whatever it asks.
    pub(crate) max_result_bytes: usize,
    pub(crate) longest_call: std::time::Duration,
    pub(crate) ownership: Arc<Ownership>,
    pub(crate) replicas: Arc<Replicas>,
    pub(crate) forwarder: Forwarder,
    pub(crate) pool: Arc<SqlPool>,
    open: Mutex<HashMap<String, Arc<Open>>>,
    /// Opening a replica is one at a time (it may rebuild it).
    opening: tokio::sync::Mutex<()>,
    /// Itself, for the futures its calls return.
    me: std::sync::Weak<StorePlacement>,
}

/// How a call that failed here ended, as its caller is told: whether it
/// did not run (it may be sent again as it is) or may have (sent again,
/// a write could happen twice). Key-value and SQL calls say the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ran {
    No,
    Perhaps,
}

/// A key-value call that failed with `code`: `unavailable: …` when it did
/// not run, `outcome_unknown: …` when it may have.
fn unavailable(code: ClusterErrorCode, ran: Ran) -> StoreError {
    StoreError::Unavailable(match ran {
        Ran::No => format!("unavailable: {} (the call did not run)", code.as_str()),
        Ran::Perhaps => format!("outcome_unknown: {} (the call may have run)", code.as_str()),
    })
}

/// A SQL batch that failed with `code`, told as [`unavailable`] tells it.
fn batch_unavailable(code: ClusterErrorCode, ran: Ran) -> BatchError {
    match ran {
        Ran::No => BatchError::NotRun(format!(
            "unavailable: {} (the batch did not run)",
            code.as_str()
        )),
        Ran::Perhaps => BatchError::OutcomeUnknown(format!(
            "outcome_unknown: {} (the batch may have run)",
            code.as_str()
        )),
    }
}

/// The bounds a call from another node runs under here: what it asked,
/// within this node's own. Its time ends at the sender's deadline, and at
/// the latest when this node's own calls would have ended, or no sender
/// waits any more ([`FORWARD_TIMEOUT`]), even when it asked for no limit;
/// its answer is at most what this node's own calls may hand back.
fn own_bounds(
    asked: Bounds,
    max_result_bytes: usize,
    longest_call: std::time::Duration,
) -> (StopCheck, usize) {
    let own = longest_call.min(FORWARD_TIMEOUT);
    let left = asked.left.unwrap_or(own).min(own);
    let deadline = Instant::now() + left;
    (
        Arc::new(move || Instant::now() >= deadline),
        asked.max_result_bytes.min(max_result_bytes),
    )
}

fn bounds(call: &StoreCall) -> Bounds {
    Bounds {
        left: call
            .deadline
            .map(|d| d.saturating_duration_since(Instant::now())),
        max_result_bytes: call.max_result_bytes,
    }
}

impl StorePlacement {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        app: &str,
        data_dir: PathBuf,
        stores: &[String],
        databases: &[String],
        durability: Durability,
        own: OwnBounds,
        ownership: Arc<Ownership>,
        replicas: Arc<Replicas>,
        forwarder: Forwarder,
        pool: Arc<SqlPool>,
    ) -> Arc<StorePlacement> {
        Arc::new_cyclic(|me| StorePlacement {
            me: me.clone(),
            app: app.to_string(),
            data_dir,
            stores: stores.iter().cloned().collect(),
            databases: databases.iter().cloned().collect(),
            durability,
            max_bytes: own.max_bytes,
            max_result_bytes: own.max_result_bytes,
            longest_call: own.longest_call,
            ownership,
            replicas,
            forwarder,
            pool,
            open: Mutex::new(HashMap::new()),
            opening: tokio::sync::Mutex::new(()),
        })
    }

    fn key(&self, kind: Kind, name: &str) -> String {
        match kind {
            Kind::Kv => format!("kv/{}/{name}", self.app),
            Kind::Sql => format!("sql/{}/{name}", self.app),
        }
    }

    fn open_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Open>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn usable(&self, key: &str, owned: &Owned) -> Option<Arc<Open>> {
        let open = self.open_map().get(key).cloned()?;
        (open.shipper.broken().is_none() && open.owned.fence() == owned.fence()).then_some(open)
    }

    /// The replica of `name` open here under `owned`, opened (its local
    /// copy checked or rebuilt) when it is not.
    async fn replica(
        &self,
        kind: Kind,
        name: &str,
        owned: Owned,
    ) -> Result<Arc<Open>, ClusterErrorCode> {
        let key = self.key(kind, name);
        if let Some(open) = self.usable(&key, &owned) {
            return Ok(open);
        }
        let _one = self.opening.lock().await;
        if let Some(open) = self.usable(&key, &owned) {
            return Ok(open);
        }
        // The old replica (if any) goes: nothing of it is trusted.
        self.open_map().remove(&key);
        let dir = self.data_dir.join(match kind {
            Kind::Kv => "kv",
            Kind::Sql => "sql",
        });
        std::fs::create_dir_all(&dir).map_err(|e| {
            tracing::error!(key, error = %e, "cannot make a store's directory");
            ClusterErrorCode::StorageUnavailable
        })?;
        let path = dir.join(format!("{name}.sqlite3"));
        let (start, owned) = self
            .replicas
            .prepare(&key, &path, STORE_PAGE_BYTES, owned)
            .await?;
        let (durability, max_bytes, name_owned) =
            (self.durability, self.max_bytes, name.to_string());
        let opened = tokio::task::spawn_blocking(move || match kind {
            Kind::Kv => {
                KvStore::open_replica(&path, &name_owned, durability, start).and_then(|s| {
                    s.set_max_bytes(max_bytes)?;
                    Ok(Replica::Kv(Arc::new(s)))
                })
            }
            Kind::Sql => SqlDatabase::open_replica(&path, durability, start).and_then(|d| {
                d.set_max_bytes(max_bytes)?;
                Ok(Replica::Sql(Arc::new(d)))
            }),
        })
        .await
        .map_err(|_| ClusterErrorCode::StorageUnavailable)?
        .map_err(|e| {
            tracing::error!(key, error = %e, "cannot open a store's replica");
            ClusterErrorCode::StorageUnavailable
        })?;
        let shipper = Shipper::new(
            &key,
            self.ownership.clone(),
            self.replicas.records.clone(),
            owned,
        );
        let open = Arc::new(Open {
            replica: opened,
            shipper,
            owned,
        });
        // Whatever opening committed (a new store's table) ships first.
        ship(&open)?;
        self.open_map().insert(key, open.clone());
        Ok(open)
    }

    /// Waits for the call's commits (and those it read) to be durable,
    /// then snapshots the replica if its log has grown enough, and
    /// checkpoints its WAL if that has grown long and all of it is shipped.
    async fn settle(&self, open: &Arc<Open>) -> Result<(), ClusterErrorCode> {
        open.shipper.settled().await?;
        let checkpoint = open.replica.capture().is_some_and(|c| c.checkpoint_due());
        if open.shipper.wants_snapshot() || checkpoint {
            let taken = open.clone();
            let snapshot = self
                .pool
                .run(move || {
                    ship(&taken)?;
                    if checkpoint && taken.shipper.idle() {
                        let _ = taken.replica.checkpoint();
                    }
                    if !taken.shipper.wants_snapshot() {
                        return Ok(None);
                    }
                    taken.replica.snapshot().map_err(|e| {
                        tracing::warn!(error = %e, "cannot snapshot a store");
                        ClusterErrorCode::StorageUnavailable
                    })
                })
                .await;
            if let Ok(Ok(Some((head, ltx)))) = snapshot {
                open.shipper.snapshot(head, ltx);
            }
        }
        Ok(())
    }

    /// Runs a key-value call on the replica here.
    async fn kv_here(
        &self,
        store: &str,
        owned: Owned,
        op: KvOp,
        stop: Option<StopCheck>,
        max_result_bytes: usize,
    ) -> Result<KvAnswer, StoreError> {
        let open = self
            .replica(Kind::Kv, store, owned)
            .await
            .map_err(|code| unavailable(code, Ran::No))?;
        // A write not confirmed durable may have run; a read did nothing.
        let ran = if op.writes() { Ran::Perhaps } else { Ran::No };
        let taken = open.clone();
        let answer = self
            .pool
            .run(move || {
                let Replica::Kv(kv) = &taken.replica else {
                    unreachable!("a key-value key opens a store")
                };
                let answer = kv.apply(op, stop, max_result_bytes);
                ship(&taken).map_err(|code| unavailable(code, ran))?;
                answer
            })
            .await
            .map_err(|_| unavailable(ClusterErrorCode::StorageUnavailable, ran))?;
        self.settle(&open)
            .await
            .map_err(|code| unavailable(code, ran))?;
        answer
    }

    /// Runs a SQL batch on the replica here.
    async fn sql_here(
        &self,
        database: &str,
        owned: Owned,
        statements: Vec<Statement>,
        stop: StopCheck,
        max_result_bytes: usize,
    ) -> Result<Vec<StatementResult>, BatchError> {
        let open = self
            .replica(Kind::Sql, database, owned)
            .await
            .map_err(|code| batch_unavailable(code, Ran::No))?;
        let taken = open.clone();
        let ran = self
            .pool
            .run(move || {
                let Replica::Sql(db) = &taken.replica else {
                    unreachable!("a SQL key opens a database")
                };
                let ran = db.run(&statements, stop, max_result_bytes);
                ship(&taken).map_err(|code| batch_unavailable(code, Ran::Perhaps))?;
                ran
            })
            .await
            .map_err(|e| BatchError::OutcomeUnknown(format!("outcome_unknown: {e}")))?;
        self.settle(&open)
            .await
            .map_err(|code| batch_unavailable(code, Ran::Perhaps))?;
        ran
    }

    /// Where `name` runs, or the refusal.
    async fn locate(
        &self,
        kind: Kind,
        name: &str,
        refresh: bool,
        forwarded: bool,
    ) -> Result<Located, ClusterErrorCode> {
        self.ownership
            .locate(&self.key(kind, name), refresh, forwarded)
            .await
    }

    /// Runs a call here if this node owns `name`, else where it is owned;
    /// handed on again (once) only when it did not run where it was sent.
    async fn route<T>(
        &self,
        kind: Kind,
        name: &str,
        body: Bytes,
        here: impl AsyncFnOnce(Owned) -> T,
        answer: impl Fn(Bytes) -> Result<T, envelope::Malformed>,
        failed: impl Fn(ClusterErrorCode, Ran) -> T,
    ) -> T {
        let target = match kind {
            Kind::Kv => Target::Kv {
                app: self.app.clone(),
                store: name.to_string(),
            },
            Kind::Sql => Target::Sql {
                app: self.app.clone(),
                database: name.to_string(),
            },
        };
        let mut last = ClusterErrorCode::OwnerUnreachable;
        for attempt in 0..2 {
            match self.locate(kind, name, attempt > 0, false).await {
                Ok(Located::Here(owned)) => return here(owned).await,
                Ok(Located::Elsewhere(node)) => {
                    match self
                        .forwarder
                        .call(&node, &target, envelope::store_call(body.clone()))
                        .await
                    {
                        Forwarded::Answered(response) => {
                            return answer(response.into_body()).unwrap_or_else(|e| {
                                tracing::warn!(error = %e, "a storage answer from another node is malformed");
                                failed(ClusterErrorCode::OwnerUnreachable, Ran::Perhaps)
                            });
                        }
                        Forwarded::NotRun(_) => last = ClusterErrorCode::OwnerUnreachable,
                        Forwarded::Failed(_) => {
                            return failed(ClusterErrorCode::OwnerUnreachable, Ran::Perhaps);
                        }
                    }
                }
                Err(code) => return failed(code, Ran::No),
            }
        }
        failed(last, Ran::No)
    }

    /// A key-value call another node sent: run here, or `None` when this
    /// node does not own the store (nothing ran).
    pub(crate) async fn forwarded_kv(&self, store: &str, body: Bytes) -> Option<Bytes> {
        let answer = match store_wire::decode_kv(body) {
            Err(e) => Err(StoreError::Unavailable(e.to_string())),
            Ok(_) if !self.stores.contains(store) => {
                Err(StoreError::NoSuchStore(store.to_string()))
            }
            Ok((op, bounds)) => match self.locate(Kind::Kv, store, false, true).await {
                Ok(Located::Here(owned)) => {
                    let (stop, max_result_bytes) =
                        own_bounds(bounds, self.max_result_bytes, self.longest_call);
                    self.kv_here(store, owned, op, Some(stop), max_result_bytes)
                        .await
                }
                Ok(Located::Elsewhere(_)) => return None,
                Err(code) => Err(unavailable(code, Ran::No)),
            },
        };
        Some(store_wire::encode_kv_answer(&answer))
    }

    /// A SQL batch another node sent: run here, or `None` when this node
    /// does not own the database (nothing ran).
    pub(crate) async fn forwarded_sql(&self, database: &str, body: Bytes) -> Option<Bytes> {
        let answer = match store_wire::decode_sql(body) {
            Err(e) => Err(BatchError::Refused {
                index: 0,
                message: e.to_string(),
            }),
            Ok(_) if !self.databases.contains(database) => {
                Err(BatchError::NoSuchDatabase(database.to_string()))
            }
            Ok((statements, bounds)) => match self.locate(Kind::Sql, database, false, true).await {
                Ok(Located::Here(owned)) => {
                    let (stop, max_result_bytes) =
                        own_bounds(bounds, self.max_result_bytes, self.longest_call);
                    self.sql_here(database, owned, statements, stop, max_result_bytes)
                        .await
                }
                Ok(Located::Elsewhere(_)) => return None,
                Err(code) => Err(batch_unavailable(code, Ran::No)),
            },
        };
        Some(store_wire::encode_sql_answer(&answer))
    }
}

/// Hands what the replica committed to its shipper (in commit order).
fn ship(open: &Open) -> Result<(), ClusterErrorCode> {
    let Some(capture) = open.replica.capture() else {
        return Ok(());
    };
    capture
        .ship_with(|log: Vec<LogEntry>| open.shipper.ship(log, Mirror::default()))
        .map_err(|e| {
            tracing::error!(error = %e, "cannot capture a store's commits");
            ClusterErrorCode::StorageUnavailable
        })
}

type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl StoreRouter for StorePlacement {
    fn has_store(&self, name: &str) -> bool {
        self.stores.contains(name)
    }

    fn has_database(&self, name: &str) -> bool {
        self.databases.contains(name)
    }

    fn kv(&self, store: String, op: KvOp, call: StoreCall) -> Boxed<Result<KvAnswer, StoreError>> {
        let this = self.clone_handle();
        Box::pin(async move {
            let body = store_wire::encode_kv(&op, bounds(&call));
            let (stop, max) = (call.stop.clone(), call.max_result_bytes);
            this.route(
                Kind::Kv,
                &store,
                body,
                async |owned| this.kv_here(&store, owned, op, stop, max).await,
                store_wire::decode_kv_answer,
                |code, ran| Err(unavailable(code, ran)),
            )
            .await
        })
    }

    fn sql(
        &self,
        database: String,
        statements: Vec<Statement>,
        call: StoreCall,
    ) -> Boxed<Result<Vec<StatementResult>, BatchError>> {
        let this = self.clone_handle();
        Box::pin(async move {
            let body = store_wire::encode_sql(&statements, bounds(&call));
            let stop = call.stop.clone().unwrap_or_else(|| Arc::new(|| false));
            let max = call.max_result_bytes;
            this.route(
                Kind::Sql,
                &database,
                body,
                async |owned| this.sql_here(&database, owned, statements, stop, max).await,
                store_wire::decode_sql_answer,
                |code, ran| Err(batch_unavailable(code, ran)),
            )
            .await
        })
    }
}

impl StorePlacement {
    /// A handle the router's futures own (they outlive the borrow).
    fn clone_handle(&self) -> Arc<StorePlacement> {
        self.me
            .upgrade()
            .expect("a store placement is used through its Arc")
    }
}
