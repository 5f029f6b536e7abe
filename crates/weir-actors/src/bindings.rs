//! The host side of `weir:actor` — storage, timers, identity — for the
//! generations of actor classes, added to every app's linker through the
//! runtime's extension point ([`ActorInterfaces`]).
//!
//! Invariants owned here:
//! - every call runs against the seat's turn gate as an operation of the
//!   turn's scope (counted in receipts, refused once the scope closes);
//! - a worker (a generation without a seat) gets `not-an-actor` from every
//!   call and touches no database;
//! - calls on one key (`get`, `put`, `delete`), timers and identity run on
//!   the turn's own thread: one actor's SQLite is only ever used by its one
//!   running turn, each is one bounded B-tree step, and a hand-off to
//!   another thread would cost more than the call. Calls whose cost grows
//!   with the data — SQL, lists, multi-key calls, `delete-all` — run on the
//!   SQL pool, never on an async worker.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker};
use weir_runtime::code::HostInterfaces;
use weir_runtime::guest_state::GenerationState;
use weir_runtime::scope::EventScope;
use weir_runtime::sql_pool::SqlPool;
use weir_store::actor::{ActorStoreError, ListOptions, PID_STRIDE};
use weir_store::sql::{StatementResult, Value};

use crate::gate::{GateError, TurnGate};
use crate::timers::now_ms;

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

/// Who an actor is, as its guest sees it, and as the routers see it when
/// it calls out (the chain of the turn it runs).
#[derive(Clone, Debug)]
pub struct ActorIdentity {
    pub class: String,
    pub name: String,
    pub incarnation: u64,
    pub turn_chain: crate::call_chain::TurnChain,
}

impl ActorIdentity {
    /// The actors whose turns wait on the turn this actor runs now.
    pub fn chain(&self) -> crate::call_chain::CallChain {
        self.turn_chain.get()
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

fn to_guest_error(e: GateError) -> types::Error {
    let e = match e {
        GateError::Poisoned(why) => return types::Error::CommitFailed(why),
        GateError::Store(e) => e,
    };
    match e {
        ActorStoreError::EntryTooLarge { .. } => types::Error::EntryTooLarge(e.to_string()),
        ActorStoreError::Refused(m) => types::Error::Refused(m),
        ActorStoreError::TooLarge(_) | ActorStoreError::OverMemory(_) => {
            types::Error::Refused(e.to_string())
        }
        ActorStoreError::Stopped => types::Error::Failed(e.to_string()),
        ActorStoreError::Store(s) => types::Error::Failed(s.to_string()),
        ActorStoreError::Replica(_) | ActorStoreError::Untaken => {
            types::Error::CommitFailed(e.to_string())
        }
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
    fn call<T>(&self, f: impl FnOnce(&TurnGate) -> Result<T, GateError>) -> GuestResult<T> {
        let Some(seat) = self.seat else {
            return Ok(Err(types::Error::NotAnActor));
        };
        let _op = match self.scope.map(|s| s.register()) {
            Some(Ok(op)) => op,
            Some(Err(e)) => return Ok(Err(types::Error::Failed(e.to_string()))),
            None => return Ok(Err(types::Error::Failed("event_scope_closed".into()))),
        };
        Ok(f(&seat.gate).map_err(to_guest_error))
    }

    /// [`ActorView::call`] for a call whose cost grows with the data: it
    /// runs on the SQL pool, holding its operation until it ends.
    async fn pooled<T: Send + 'static>(
        &self,
        f: impl FnOnce(&TurnGate) -> Result<T, GateError> + Send + 'static,
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
                f(&gate).map_err(to_guest_error)
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
        self.call(|g| g.flush().map_err(GateError::Poisoned))
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

/// What the `weir:actor` host functions see of a generation: its seat
/// (none in a worker's), the turn's scope and the SQL pool.
fn view(state: &mut GenerationState) -> ActorView<'_> {
    ActorView {
        seat: state.extension::<ActorSeat>(),
        scope: state.scope(),
        pool: state.pool(),
    }
}

/// `weir:actor` (storage, timers, identity), for every app's linker.
pub struct ActorInterfaces;

impl HostInterfaces for ActorInterfaces {
    fn add_to_linker(&self, linker: &mut Linker<GenerationState>) -> wasmtime::Result<()> {
        types::add_to_linker::<_, HasActor>(linker, view)?;
        storage::add_to_linker::<_, HasActor>(linker, view)?;
        timers::add_to_linker::<_, HasActor>(linker, view)?;
        identity::add_to_linker::<_, HasActor>(linker, view)?;
        Ok(())
    }
}
