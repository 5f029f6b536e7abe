//! A generation: one `Store` and one instance of an app, numbered per app.
//!
//! Invariant owned here: everything a guest can hold between events — its
//! linear memory, its globals, its resource table, its WASI context — lives
//! in the generation's `Store`, so dropping the generation drops all of it at
//! once. A generation is never reused after it is dropped, and its number is
//! never given to another.

use std::time::Instant;

use wasmtime::component::{Instance, ResourceTable};
use wasmtime::{Store, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::bindings::Proxy;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use std::sync::Arc;

use weir_store::KvStores;
use weir_store::sql::SqlDatabases;

use crate::app::AppCode;
use crate::extension::Extras;
use crate::guest_output::GuestOutput;
use crate::keyvalue::KeyValueView;
use crate::memory_budget::MemoryLimiter;
use crate::metrics::AppMetrics;
use crate::outbound::OutboundPolicy;
use crate::scope::EventScope;
use crate::sql::SqlView;
use crate::sql_pool::SqlPool;

/// Everything a generation's store holds for its guest.
pub struct GenerationState {
    wasi: WasiCtx,
    table: ResourceTable,
    http: WasiHttpCtx,
    pub(crate) outbound: OutboundPolicy,
    kv: Arc<KvStores>,
    sql: Arc<SqlDatabases>,
    pool: Arc<SqlPool>,
    max_result_bytes: usize,
    pub(crate) memory: MemoryLimiter,
    /// The guest's output budget (shared by its stdout and stderr).
    output: GuestOutput,
    /// A layer's own data for this generation ([`Extras::data`]).
    extension: Option<Box<dyn std::any::Any + Send>>,
}

impl WasiView for GenerationState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl GenerationState {
    /// What `wasi:keyvalue` calls see: the app's stores and the event's scope.
    pub(crate) fn keyvalue(&mut self) -> KeyValueView<'_> {
        KeyValueView {
            table: &mut self.table,
            stores: &self.kv,
            scope: self.outbound.scope.as_ref(),
            pool: &self.pool,
            max_result_bytes: self.max_result_bytes,
        }
    }
}

impl GenerationState {
    /// What `weir:sql` calls see: the app's databases and the event's scope.
    pub(crate) fn sql(&mut self) -> SqlView<'_> {
        SqlView {
            databases: &self.sql,
            scope: self.outbound.scope.as_ref(),
            pool: &self.pool,
            max_result_bytes: self.max_result_bytes,
        }
    }
}

impl GenerationState {
    /// The data a layer attached to this generation, if it is a `T`.
    pub fn extension<T: 'static>(&self) -> Option<&T> {
        self.extension.as_ref()?.downcast_ref()
    }

    /// The scope of the event running now, if any: host functions register
    /// their operations in it.
    pub fn scope(&self) -> Option<&Arc<EventScope>> {
        self.outbound.scope.as_ref()
    }

    /// The threads that run storage work, off the async workers.
    pub fn pool(&self) -> &Arc<SqlPool> {
        &self.pool
    }

    /// Sets (or clears) the scope of the event or turn running now.
    /// A new scope is a new event: the guest's output budget starts over.
    pub fn set_scope(&mut self, scope: Option<Arc<EventScope>>) {
        if scope.is_some() {
            self.output.reset();
        }
        self.outbound.scope = scope;
    }

    /// Why the guest was refused memory, if it was: past its own limit,
    /// or past the total budget.
    pub fn memory_refusal(&self) -> Option<crate::ErrorCode> {
        if self.memory.over_budget {
            Some(crate::ErrorCode::MemoryBudgetExceeded)
        } else if self.memory.exceeded {
            Some(crate::ErrorCode::MemoryLimitExceeded)
        } else {
            None
        }
    }
}

impl WasiHttpView for GenerationState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            hooks: &mut self.outbound,
            table: &mut self.table,
            ctx: &mut self.http,
        }
    }
}

/// One live instance of an app.
pub struct Generation {
    pub number: u64,
    pub store: Store<GenerationState>,
    pub proxy: Proxy,
    /// The instance itself, for a layer's own exports.
    pub instance: Instance,
    /// Events admitted to this generation so far.
    pub admitted: u32,
    pub created: Instant,
}

/// Why a fresh generation could not be created.
#[derive(Debug, thiserror::Error)]
#[error("cannot instantiate generation {number}: {reason}")]
pub struct InstantiateError {
    pub number: u64,
    pub reason: String,
    /// Its memory did not fit in the total guest memory budget.
    pub over_budget: bool,
}

impl Generation {
    /// Instantiates a fresh generation with fresh linear memory.
    pub async fn instantiate(
        code: &AppCode,
        metrics: &AppMetrics,
        number: u64,
        extras: Extras,
    ) -> Result<Generation, InstantiateError> {
        let mut outbound = OutboundPolicy::new(
            code.outbound.clone(),
            &code.limits,
            metrics.clone(),
            code.routes.clone(),
        );
        outbound.output_gate = extras.output_gate;
        let (stdout, stderr) = GuestOutput::pair();
        let state = GenerationState {
            extension: extras.data,
            wasi: WasiCtx::builder()
                .stdout(stdout)
                .stderr(stderr.clone())
                .build(),
            output: stderr,
            table: ResourceTable::new(),
            http: WasiHttpCtx::new(),
            outbound,
            kv: code.kv.clone(),
            sql: code.sql.clone(),
            pool: code.pool.clone(),
            max_result_bytes: code.limits.max_sql_result_bytes,
            memory: MemoryLimiter::new(
                code.limits.memory_limit_bytes as usize,
                code.budget.clone(),
            ),
        };
        let mut store = Store::new(code.engine(), state);
        store.limiter_async(|s| &mut s.memory);
        // Yield to tokio at every epoch tick: a spinning guest then returns
        // control to the event's own timers, which decide its fate.
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|_| Ok(UpdateDeadline::Yield(1)));
        let fail = |e: wasmtime::Error| InstantiateError {
            number,
            reason: format!("{e:#}"),
            over_budget: false,
        };
        // A start function is guest code: it runs under the same bound as
        // a handler, so a guest that spins while it starts cannot hold a
        // lane (or the server's start) forever.
        let limit = code.limits.event_limit;
        let started =
            tokio::time::timeout(limit, code.pre.instance_pre().instantiate_async(&mut store))
                .await;
        let instance = match started {
            Ok(Ok(instance)) => instance,
            Ok(Err(e)) => {
                return Err(InstantiateError {
                    over_budget: store.data().memory.over_budget,
                    ..fail(e)
                });
            }
            Err(_) => {
                return Err(InstantiateError {
                    number,
                    reason: format!(
                        "its start did not finish within event_limit_ms ({} ms)",
                        limit.as_millis()
                    ),
                    over_budget: false,
                });
            }
        };
        let proxy = Proxy::new(&mut store, &instance).map_err(fail)?;
        Ok(Generation {
            instance,
            number,
            store,
            proxy,
            admitted: 0,
            created: Instant::now(),
        })
    }

    /// Linear memory the guest has reached, in bytes.
    pub fn memory_bytes(&self) -> usize {
        self.store.data().memory.peak
    }
}
