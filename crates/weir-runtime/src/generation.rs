//! A generation: one `Store` and one instance of an app, numbered per app.
//!
//! Invariant owned here: everything a guest can hold between events — its
//! linear memory, its globals, its resource table, its WASI context — lives
//! in the generation's `Store`, so dropping the generation drops all of it at
//! once. A generation is never reused after it is dropped, and its number is
//! never given to another.

use std::time::{Duration, Instant};

use wasmtime::Store;
use wasmtime::component::{Instance, ResourceTable};
use wasmtime_wasi::WasiCtx;
use wasmtime_wasi_http::WasiHttpCtx;
use wasmtime_wasi_http::p2::bindings::Proxy;

pub use crate::code::InstantiateError;
use crate::code::{AppCode, Entry};
use crate::extension::Extras;
use crate::guest_output::GuestOutput;
use crate::guest_state::GenerationState;
use crate::memory_budget::MemoryLimiter;
use crate::metrics::AppMetrics;
use crate::outbound::OutboundPolicy;

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

impl Generation {
    /// Instantiates a fresh generation with fresh linear memory.
    pub async fn instantiate(
        code: &AppCode,
        metrics: &AppMetrics,
        number: u64,
        extras: Extras,
    ) -> Result<Generation, InstantiateError> {
        Self::instantiate_with(code, metrics, number, extras, WasiCtx::builder()).await
    }

    /// [`Generation::instantiate`] with a WASI context of the caller's
    /// (a resident program's arguments and environment); its stdout and
    /// stderr are set here: records in the app's log with the per-event
    /// budget ([`crate::guest_log`]).
    pub async fn instantiate_with(
        code: &AppCode,
        metrics: &AppMetrics,
        number: u64,
        mut extras: Extras,
        mut wasi: wasmtime_wasi::WasiCtxBuilder,
    ) -> Result<Generation, InstantiateError> {
        let log = extras.guest_log.take();
        let (stdout, stderr) = GuestOutput::pair(log.as_ref().or(code.guest_log.as_ref()));
        let wasi = wasi.stdout(stdout).stderr(stderr.clone()).build();
        let mut store = new_store(code, metrics, extras, wasi, stderr);
        // A start function is guest code: it runs under the same bound as
        // a handler, so a guest that spins while it starts cannot hold a
        // lane (or the server's start) forever.
        let limit = ("event_limit_ms", code.limits.event_limit);
        let instance = start(code, &mut store, number, limit).await?;
        let proxy = Proxy::new(&mut store, &instance).map_err(|e| InstantiateError {
            number,
            reason: format!("{e:#}"),
            over_budget: false,
        })?;
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

/// A fresh store for one instance of `code`: the guest state with `wasi`
/// as its WASI context and `output` as the output budget each new scope
/// restarts, the memory limiter, and a yield to tokio at every epoch tick
/// (a spinning guest then returns control to the call's own timers, which
/// decide its fate; a long computation then also waits for its slice of
/// the engine's [`crate::compute_share`]). Every instance Weir makes — a generation, a keyed
/// instance, a program — gets its store here.
pub fn new_store<E: Entry>(
    code: &AppCode<E>,
    metrics: &AppMetrics,
    extras: Extras,
    wasi: WasiCtx,
    output: GuestOutput,
) -> Store<GenerationState> {
    let mut outbound = OutboundPolicy::new(
        code.outbound.clone(),
        &code.limits,
        metrics.clone(),
        code.routes.clone(),
    );
    outbound.output_gate = extras.output_gate;
    outbound.caller = extras.caller;
    let state = GenerationState {
        extension: extras.data,
        offered: None,
        wasi,
        output,
        table: held_table(),
        http: WasiHttpCtx::new(),
        outbound,
        kv: code.kv.clone(),
        sql: code.sql.clone(),
        pool: code.pool.clone(),
        router: code.router.clone(),
        max_result_bytes: code.limits.max_sql_result_bytes,
        memory: MemoryLimiter::new(code.limits.memory_limit_bytes as usize, code.budget.clone()),
        slices: 0,
        share: code.share.clone(),
    };
    let mut store = Store::new(code.engine(), state);
    store.limiter_async(|s| &mut s.memory);
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|mut store| store.data_mut().interrupted());
    store
}

/// A store's resource table, bounded at [`crate::held::MAX_GUEST_HANDLES`].
fn held_table() -> ResourceTable {
    let mut table = ResourceTable::new();
    table.set_max_capacity(crate::held::MAX_GUEST_HANDLES);
    table
}

/// Instantiates `code` in `store`, running its start functions for at most
/// `limit` (named as the limit it is): a guest that spins while it starts
/// is refused, not waited for.
pub async fn start<E: Entry>(
    code: &AppCode<E>,
    store: &mut Store<GenerationState>,
    number: u64,
    (limit_name, limit): (&str, Duration),
) -> Result<Instance, InstantiateError> {
    let started = tokio::time::timeout(
        limit,
        code.pre.instance_pre().instantiate_async(&mut *store),
    )
    .await;
    match started {
        Ok(Ok(instance)) => Ok(instance),
        Ok(Err(e)) => Err(InstantiateError {
            number,
            reason: format!("{e:#}"),
            over_budget: store.data().memory.over_budget,
        }),
        Err(_) => Err(InstantiateError {
            number,
            reason: format!(
                "its start did not finish within {limit_name} ({} ms)",
                limit.as_millis()
            ),
            over_budget: false,
        }),
    }
}
