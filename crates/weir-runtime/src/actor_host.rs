//! The host side of `weir:actor` (storage, timers, identity) and the turn
//! gate that every one of an actor's effects passes through.
//!
//! Invariants owned here:
//! - an actor's storage calls, SQL and timer changes all run in the one
//!   transaction of the current turn ([`TurnGate`]); nothing commits until
//!   the turn ends or the guest calls `sync`;
//! - the output gate: before anything the turn produced leaves the actor —
//!   an outbound request, a call to another actor — the writes that came
//!   before it are made durable ([`TurnGate::flush`]). A flush or commit that
//!   fails poisons the turn: the turn runner resets the actor instead of
//!   answering, and the caller gets `storage_commit_failed`;
//! - a worker (a generation without a seat) gets `not-an-actor` from every
//!   call and touches no database.
//!
//! Calls on one key (`get`, `put`, `delete`), timers and identity run on
//! the turn's own thread: one actor's SQLite is only ever used by its one
//! running turn, each is one bounded B-tree step, and a hand-off to another
//! thread would cost more than the call. Calls whose cost grows with the
//! data — SQL, lists, multi-key calls, `delete-all` — run on the SQL pool,
//! never on an async worker, and every statement of a turn stops at the
//! turn's deadline or abandonment ([`TurnGate::begin`]).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use wasmtime::component::{HasData, Linker};
use weir_store::actor::{ActorDb, ActorStoreError, ListOptions, PID_STRIDE};
use weir_store::sql::{StatementResult, Value};

use crate::scope::EventScope;
use crate::sql_pool::SqlPool;
use weir_store::confinement::StopCheck;

mod generated {
    wasmtime::component::bindgen!({
        path: "../../wit/weir-actor",
        world: "weir:actor/imports",
        imports: {
            "weir:actor/storage.get-many": async | trappable,
            "weir:actor/storage.put-many": async | trappable,
            "weir:actor/storage.delete-many": async | trappable,
            "weir:actor/storage.list": async | trappable,
            "weir:actor/storage.delete-all": async | trappable,
            "weir:actor/storage.exec": async | trappable,
            default: trappable,
        },
    });
}

use generated::weir::actor::{identity, storage, timers, types};

/// The alarm export's interface name, as components export it.
pub const ALARM_INTERFACE: &str = "weir:actor/alarm@0.1.0";

/// Who an actor is, as its guest sees it.
#[derive(Clone, Debug)]
pub struct ActorIdentity {
    pub class: String,
    pub name: String,
    pub incarnation: u64,
}

struct GateState {
    db: ActorDb,
    /// The turn has writes not yet committed.
    dirty: bool,
    /// Why a commit of this turn failed; the turn must not answer.
    failed: Option<String>,
    /// The guest scheduled or cancelled a timer since this was last read.
    timers_changed: bool,
}

/// One actor's database and the state of its current turn.
pub struct TurnGate {
    state: Mutex<GateState>,
}

/// Milliseconds since the Unix epoch: the clock timers are kept in.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl TurnGate {
    pub fn new(db: ActorDb) -> Arc<TurnGate> {
        Arc::new(TurnGate {
            state: Mutex::new(GateState {
                db,
                dirty: false,
                failed: None,
                timers_changed: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the database outside of any turn bookkeeping (reads,
    /// and the runner's own begin/commit).
    pub fn with_db<T>(&self, f: impl FnOnce(&mut ActorDb) -> T) -> T {
        f(&mut self.lock().db)
    }

    /// Starts a turn whose statements stop when `stop` says so.
    pub fn begin(&self, stop: StopCheck) -> Result<(), ActorStoreError> {
        let mut s = self.lock();
        s.dirty = false;
        s.failed = None;
        s.db.watch(Some(stop));
        s.db.begin_turn()
    }

    /// Ends the turn: commits its writes, or says why they were not.
    pub fn commit(&self) -> Result<(), String> {
        let mut s = self.lock();
        // Weir's own commit is never cut by the turn's deadline.
        s.db.watch(None);
        if let Some(why) = s.failed.take() {
            let _ = s.db.rollback_turn();
            return Err(why);
        }
        s.dirty = false;
        s.db.commit_turn().map_err(|e| e.to_string())
    }

    /// Drops the turn's writes.
    pub fn rollback(&self) {
        let mut s = self.lock();
        s.db.watch(None);
        s.dirty = false;
        let _ = s.db.rollback_turn();
    }

    /// The output gate: makes the turn's writes so far durable before
    /// anything leaves. A failure poisons the turn.
    pub fn flush(&self) -> Result<(), String> {
        let mut s = self.lock();
        if let Some(why) = &s.failed {
            return Err(why.clone());
        }
        if !s.dirty {
            return Ok(());
        }
        match s.db.sync() {
            Ok(()) => {
                s.dirty = false;
                Ok(())
            }
            Err(e) => {
                let why = e.to_string();
                s.failed = Some(why.clone());
                Err(why)
            }
        }
    }

    /// True (once) when the guest changed its timers since the last call:
    /// the timer index then needs the actor's new earliest deadline.
    pub fn take_timers_changed(&self) -> bool {
        std::mem::take(&mut self.lock().timers_changed)
    }

    /// Why this turn may not answer, if it may not.
    pub fn failure(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    fn read<T>(
        &self,
        f: impl FnOnce(&ActorDb) -> Result<T, ActorStoreError>,
    ) -> Result<T, types::Error> {
        let s = self.lock();
        if let Some(why) = &s.failed {
            return Err(types::Error::CommitFailed(why.clone()));
        }
        f(&s.db).map_err(to_guest_error)
    }

    fn write_timers<T>(
        &self,
        f: impl FnOnce(&mut ActorDb) -> Result<T, ActorStoreError>,
    ) -> Result<T, types::Error> {
        self.lock().timers_changed = true;
        self.write(f)
    }

    fn write<T>(
        &self,
        f: impl FnOnce(&mut ActorDb) -> Result<T, ActorStoreError>,
    ) -> Result<T, types::Error> {
        let mut s = self.lock();
        if let Some(why) = &s.failed {
            return Err(types::Error::CommitFailed(why.clone()));
        }
        let result = f(&mut s.db).map_err(to_guest_error);
        s.dirty = true;
        result
    }
}

/// An actor's place in a generation: its identity and its gate.
#[derive(Clone)]
pub struct ActorSeat {
    pub identity: ActorIdentity,
    pub gate: Arc<TurnGate>,
    /// The class exports `alarm`; without it, timers cannot be scheduled.
    pub has_alarm: bool,
}

fn to_guest_error(e: ActorStoreError) -> types::Error {
    match e {
        ActorStoreError::EntryTooLarge { .. } => types::Error::EntryTooLarge(e.to_string()),
        ActorStoreError::Refused(m) => types::Error::Refused(m),
        ActorStoreError::TooLarge(_) => types::Error::Refused(e.to_string()),
        ActorStoreError::Stopped => types::Error::Failed(e.to_string()),
        ActorStoreError::Store(s) => types::Error::Failed(s.to_string()),
    }
}

fn to_store(v: types::Value) -> Value {
    match v {
        types::Value::Null => Value::Null,
        types::Value::Integer(i) => Value::Integer(i),
        types::Value::Real(r) => Value::Real(r),
        types::Value::Text(t) => Value::Text(t),
        types::Value::Blob(b) => Value::Blob(b),
    }
}

fn to_guest(v: Value) -> types::Value {
    match v {
        Value::Null => types::Value::Null,
        Value::Integer(i) => types::Value::Integer(i),
        Value::Real(r) => types::Value::Real(r),
        Value::Text(t) => types::Value::Text(t),
        Value::Blob(b) => types::Value::Blob(b),
    }
}

fn to_guest_result(r: StatementResult) -> storage::StatementResult {
    storage::StatementResult {
        columns: r.columns,
        rows: r
            .rows
            .into_iter()
            .map(|row| row.into_iter().map(to_guest).collect())
            .collect(),
        rows_read: r.rows_read,
        rows_written: r.rows_written,
        last_insert_id: r.last_insert_id,
    }
}

/// What the actor host functions see of a generation.
pub struct ActorView<'a> {
    pub seat: Option<&'a ActorSeat>,
    pub scope: Option<&'a Arc<EventScope>>,
    pub pool: &'a Arc<SqlPool>,
}

type GuestResult<T> = wasmtime::Result<Result<T, types::Error>>;

impl ActorView<'_> {
    /// Runs one call against the seat's gate as an operation of the turn's
    /// scope (so receipts count it and a closed scope refuses it).
    fn call<T>(&self, f: impl FnOnce(&TurnGate) -> Result<T, types::Error>) -> GuestResult<T> {
        let Some(seat) = self.seat else {
            return Ok(Err(types::Error::NotAnActor));
        };
        let _op = match self.scope.map(|s| s.register()) {
            Some(Ok(op)) => op,
            Some(Err(e)) => return Ok(Err(types::Error::Failed(e.to_string()))),
            None => return Ok(Err(types::Error::Failed("event_scope_closed".into()))),
        };
        Ok(f(&seat.gate))
    }

    /// [`ActorView::call`] for a call whose cost grows with the data: it
    /// runs on the SQL pool, holding its operation until it ends.
    async fn pooled<T: Send + 'static>(
        &self,
        f: impl FnOnce(&TurnGate) -> Result<T, types::Error> + Send + 'static,
    ) -> GuestResult<T> {
        let Some(seat) = self.seat else {
            return Ok(Err(types::Error::NotAnActor));
        };
        let op = match self.scope.map(|s| s.register()) {
            Some(Ok(op)) => op,
            Some(Err(e)) => return Ok(Err(types::Error::Failed(e.to_string()))),
            None => return Ok(Err(types::Error::Failed("event_scope_closed".into()))),
        };
        let gate = seat.gate.clone();
        Ok(self
            .pool
            .run(move || {
                let _op = op;
                f(&gate)
            })
            .await
            .unwrap_or_else(|e| Err(types::Error::Failed(e.to_string()))))
    }
}

impl types::Host for ActorView<'_> {}

impl storage::Host for ActorView<'_> {
    fn get(&mut self, key: String) -> GuestResult<Option<Vec<u8>>> {
        self.call(|g| g.read(|db| db.get(&key)))
    }

    async fn get_many(&mut self, keys: Vec<String>) -> GuestResult<Vec<Option<Vec<u8>>>> {
        self.pooled(move |g| g.read(|db| db.get_many(&keys))).await
    }

    fn put(&mut self, key: String, value: Vec<u8>) -> GuestResult<()> {
        self.call(|g| g.write(|db| db.put(&key, &value)))
    }

    async fn put_many(&mut self, entries: Vec<(String, Vec<u8>)>) -> GuestResult<()> {
        self.pooled(move |g| g.write(|db| db.put_many(&entries)))
            .await
    }

    fn delete(&mut self, key: String) -> GuestResult<bool> {
        self.call(|g| g.write(|db| db.delete(&key)))
    }

    async fn delete_many(&mut self, keys: Vec<String>) -> GuestResult<u32> {
        self.pooled(move |g| {
            g.write(|db| {
                let mut n = 0;
                for k in &keys {
                    n += u32::from(db.delete(k)?);
                }
                Ok(n)
            })
        })
        .await
    }

    async fn list(&mut self, options: storage::ListOptions) -> GuestResult<Vec<(String, Vec<u8>)>> {
        let options = ListOptions {
            start: options.start,
            end: options.end,
            prefix: options.prefix,
            reverse: options.reverse,
            limit: options.limit,
        };
        self.pooled(move |g| g.read(|db| db.list(&options))).await
    }

    async fn delete_all(&mut self) -> GuestResult<()> {
        self.pooled(|g| g.write(|db| db.delete_all())).await
    }

    async fn exec(
        &mut self,
        sql: String,
        params: Vec<types::Value>,
    ) -> GuestResult<storage::StatementResult> {
        let params: Vec<Value> = params.into_iter().map(to_store).collect();
        self.pooled(move |g| g.write(|db| db.exec(&sql, &params)).map(to_guest_result))
            .await
    }

    fn sync(&mut self) -> GuestResult<()> {
        self.call(|g| g.flush().map_err(types::Error::CommitFailed))
    }
}

impl timers::Host for ActorView<'_> {
    fn schedule(&mut self, reason: String, at_ms: u64) -> GuestResult<()> {
        if self.seat.is_some_and(|s| !s.has_alarm) {
            return Ok(Err(types::Error::Refused(format!(
                "this actor class does not export {ALARM_INTERFACE}; its timers could never fire"
            ))));
        }
        let at = i64::try_from(at_ms).unwrap_or(i64::MAX);
        self.call(|g| g.write_timers(|db| db.schedule(&reason, at)))
    }

    fn cancel(&mut self, reason: String) -> GuestResult<bool> {
        self.call(|g| g.write_timers(|db| db.cancel(&reason)))
    }

    fn list(&mut self) -> GuestResult<Vec<timers::Timer>> {
        self.call(|g| {
            g.read(|db| db.timers()).map(|ts| {
                ts.into_iter()
                    .map(|t| timers::Timer {
                        reason: t.reason,
                        at_ms: t.at_ms.max(0) as u64,
                        attempt: t.attempt,
                    })
                    .collect()
            })
        })
    }

    fn now_ms(&mut self) -> wasmtime::Result<u64> {
        Ok(now_ms().max(0) as u64)
    }
}

impl identity::Host for ActorView<'_> {
    fn self_(&mut self) -> wasmtime::Result<identity::ActorInfo> {
        Ok(match self.seat {
            Some(seat) => identity::ActorInfo {
                class: seat.identity.class.clone(),
                name: seat.identity.name.clone(),
                incarnation: seat.identity.incarnation,
                pid_base: seat.identity.incarnation.saturating_mul(PID_STRIDE),
            },
            None => identity::ActorInfo {
                class: String::new(),
                name: String::new(),
                incarnation: 0,
                pid_base: 0,
            },
        })
    }
}

struct HasActor;

impl HasData for HasActor {
    type Data<'a> = ActorView<'a>;
}

/// Adds `weir:actor` (storage, timers, identity) to a linker.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> ActorView<'_>,
) -> wasmtime::Result<()> {
    types::add_to_linker::<_, HasActor>(linker, view)?;
    storage::add_to_linker::<_, HasActor>(linker, view)?;
    timers::add_to_linker::<_, HasActor>(linker, view)?;
    identity::add_to_linker::<_, HasActor>(linker, view)?;
    Ok(())
}
