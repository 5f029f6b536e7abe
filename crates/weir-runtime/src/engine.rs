//! The wasmtime `Engine`s of a Weir process and their epoch tickers.
//!
//! Invariant owned here: exactly one thread advances each engine's time
//! for Wasm, whatever the number of requests (its own `EpochTicker`, or
//! its compute share's, which ticks every engine that serves requests),
//! and every engine's instances reserve their memory from the one
//! process-wide budget. Every store yields to tokio at each epoch tick, so
//! a guest that spins is interrupted by the same tokio timers that bound
//! every other wait — no thread or timer is created per request.

use std::sync::Arc;

use wasmtime::{Config, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::compute_share::ComputeShare;
use crate::epoch_ticker::EpochTicker;
use crate::memory_budget::{MAX_TABLE_ELEMENTS, MemoryBudget};

/// Instance slots the pooling allocator reserves beyond the lanes: an
/// abandoned generation's slot is released when its store drops, but a
/// replacement may be instantiated a moment before, so each lane may briefly
/// hold two.
pub const POOL_SLOTS_PER_LANE: u32 = 2;

/// Core instances and memories one component may hold. Components built by
/// `cargo` for wasm32-wasip2 have one main module plus the adapter shims;
/// 16 leaves room for composed components.
pub const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 16;

/// Wasm stack per instance: 1 MiB, wasmtime's own default, stated so that
/// it is a decision and not an accident.
pub const MAX_WASM_STACK_BYTES: usize = 1 << 20;

/// Bytes of each pooled memory and table reset with `memset` instead of
/// being returned to the kernel when a generation is dropped. Typical guest
/// memories are about 1 MiB; resetting them in place avoids a page-fault
/// storm on the next instantiation and a TLB shootdown on every retirement.
pub const KEEP_RESIDENT_BYTES: usize = 2 << 20;

/// Guard pages after an on-demand instance's linear memory. Accesses are bounds-checked
/// (the reservation is the memory limit, not 4 GiB), so the guard only
/// catches the checks' own offsets; one Wasm page is enough.
pub const ON_DEMAND_GUARD_BYTES: u64 = 64 << 10;

/// Errors building the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot configure the Wasm engine: {0}")]
    Config(String),
}

/// Sizing the engine needs up front (the pooling allocator reserves slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineSizing {
    /// Total lanes across every app this engine will run.
    pub lanes: u32,
    /// The largest `memory_limit_bytes` of any app.
    pub memory_limit_bytes: u64,
}

/// Which engine configuration: everything the code an engine compiles
/// depends on, so that a compiler process can build the same engine from
/// it ([`EngineKind::to_arg`], [`EngineKind::parse`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// Lanes of apps: instance slots reserved up front ([`WeirEngine::new`]).
    Pooled(EngineSizing),
    /// Many mostly idle keyed instances ([`WeirEngine::on_demand`]).
    OnDemand { memory_limit_bytes: u64 },
    /// Few instances that each run long or hot: programs
    /// ([`WeirEngine::for_programs`]).
    Programs { memory_limit_bytes: u64 },
}

impl EngineKind {
    /// The kind as one command-line word.
    pub fn to_arg(&self) -> String {
        match self {
            EngineKind::Pooled(s) => format!("pooled:{}:{}", s.lanes, s.memory_limit_bytes),
            EngineKind::OnDemand { memory_limit_bytes } => {
                format!("on-demand:{memory_limit_bytes}")
            }
            EngineKind::Programs { memory_limit_bytes } => {
                format!("programs:{memory_limit_bytes}")
            }
        }
    }

    /// The kind [`EngineKind::to_arg`] wrote.
    pub fn parse(arg: &str) -> Option<EngineKind> {
        let mut parts = arg.split(':');
        let kind = match (parts.next()?, parts.next(), parts.next()) {
            ("pooled", Some(lanes), Some(memory)) => EngineKind::Pooled(EngineSizing {
                lanes: lanes.parse().ok()?,
                memory_limit_bytes: memory.parse().ok()?,
            }),
            ("on-demand", Some(memory), None) => EngineKind::OnDemand {
                memory_limit_bytes: memory.parse().ok()?,
            },
            ("programs", Some(memory), None) => EngineKind::Programs {
                memory_limit_bytes: memory.parse().ok()?,
            },
            _ => return None,
        };
        parts.next().is_none().then_some(kind)
    }
}

/// What every engine of Weir has: epoch interruption (every store yields
/// at each tick), the stack bound, the component model.
fn base_config() -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config.max_wasm_stack(MAX_WASM_STACK_BYTES);
    config.wasm_component_model(true);
    config
}

/// The shared engine plus its ticker (its own, or its share's); dropping
/// it stops its own ticker.
pub struct WeirEngine {
    engine: wasmtime::Engine,
    kind: EngineKind,
    budget: Arc<MemoryBudget>,
    /// What advances its epoch, kept as long as the engine.
    _clock: Clock,
}

/// The one thread that advances an engine's epoch: its own ticker, or the
/// ticker of the compute share it serves requests under.
enum Clock {
    Own { _ticker: EpochTicker },
    Share { _share: Arc<ComputeShare> },
}

impl WeirEngine {
    /// An engine of lanes: instance slots reserved up front. With a
    /// `share`, the share's ticker advances its epoch, so that a slice of
    /// the share handed out at a tick lasts the whole tick (the engines
    /// that serve requests are ticked by one; which share a call's long
    /// computations take their slices from is its app's,
    /// [`crate::code::Stores::share`]); without one it has its own ticker.
    pub fn new(
        sizing: EngineSizing,
        budget: Arc<MemoryBudget>,
        share: Option<Arc<ComputeShare>>,
    ) -> Result<Self, EngineError> {
        let mut config = base_config();

        let slots = sizing.lanes.saturating_mul(POOL_SLOTS_PER_LANE).max(4);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(slots);
        pool.total_core_instances(slots.saturating_mul(MAX_CORE_INSTANCES_PER_COMPONENT));
        pool.total_memories(slots.saturating_mul(MAX_CORE_INSTANCES_PER_COMPONENT));
        pool.total_tables(slots.saturating_mul(MAX_CORE_INSTANCES_PER_COMPONENT));
        pool.total_stacks(slots);
        pool.max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT);
        pool.max_memories_per_component(MAX_CORE_INSTANCES_PER_COMPONENT);
        pool.max_tables_per_component(MAX_CORE_INSTANCES_PER_COMPONENT);
        pool.max_memory_size(sizing.memory_limit_bytes as usize);
        pool.table_elements(MAX_TABLE_ELEMENTS);
        pool.linear_memory_keep_resident(KEEP_RESIDENT_BYTES);
        pool.table_keep_resident(KEEP_RESIDENT_BYTES);
        // Where the kernel can say which pages a retired instance dirtied
        // (Linux 6.7+), only those are reset; elsewhere the kept-resident
        // bytes are reset whole.
        pool.pagemap_scan(wasmtime::Enabled::Auto);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        Self::with_config(&config, EngineKind::Pooled(sizing), budget, share)
    }

    /// An engine for many, mostly idle instances (the keyed instances of
    /// the layers above): memories are allocated on demand and given back
    /// to the kernel when an instance is dropped (a pool would keep every
    /// slot reserved and resident). Each memory reserves only
    /// `memory_limit_bytes` of address space, so tens of thousands of live
    /// instances fit in the address space and the kernel's map count;
    /// accesses are then bounds-checked. Its epoch as [`WeirEngine::new`]'s.
    pub fn on_demand(
        memory_limit_bytes: u64,
        budget: Arc<MemoryBudget>,
        share: Option<Arc<ComputeShare>>,
    ) -> Result<Self, EngineError> {
        let mut config = base_config();
        config.memory_reservation(memory_limit_bytes);
        config.memory_guard_size(ON_DEMAND_GUARD_BYTES);
        config.memory_reservation_for_growth(0);
        config.allocation_strategy(InstanceAllocationStrategy::OnDemand);
        let kind = EngineKind::OnDemand { memory_limit_bytes };
        Self::with_config(&config, kind, budget, share)
    }

    /// The engine of programs: few instances, each run long or hot (a
    /// one-shot command over its input, a resident server). Each memory
    /// reserves wasmtime's default address range with its guard region, so
    /// the compiled code needs no bounds check on an access (measured: a
    /// byte loop over 4 MiB ran about a quarter slower bounds-checked); the
    /// limiter still holds each memory to `memory_limit_bytes`. Memory is
    /// allocated per instance and returned when it ends. Programs run on
    /// threads of their own, so the engine has its own ticker.
    pub fn for_programs(
        memory_limit_bytes: u64,
        budget: Arc<MemoryBudget>,
    ) -> Result<Self, EngineError> {
        let mut config = base_config();
        config.allocation_strategy(InstanceAllocationStrategy::OnDemand);
        let kind = EngineKind::Programs { memory_limit_bytes };
        Self::with_config(&config, kind, budget, None)
    }

    /// The engine of `kind`, with its own ticker.
    pub fn of_kind(kind: EngineKind, budget: Arc<MemoryBudget>) -> Result<Self, EngineError> {
        match kind {
            EngineKind::Pooled(sizing) => Self::new(sizing, budget, None),
            EngineKind::OnDemand { memory_limit_bytes } => {
                Self::on_demand(memory_limit_bytes, budget, None)
            }
            EngineKind::Programs { memory_limit_bytes } => {
                Self::for_programs(memory_limit_bytes, budget)
            }
        }
    }

    fn with_config(
        config: &Config,
        kind: EngineKind,
        budget: Arc<MemoryBudget>,
        share: Option<Arc<ComputeShare>>,
    ) -> Result<Self, EngineError> {
        let engine =
            wasmtime::Engine::new(config).map_err(|e| EngineError::Config(format!("{e:#}")))?;
        let clock = match share {
            Some(share) => {
                share.tick(engine.clone());
                Clock::Share { _share: share }
            }
            None => {
                let engine = engine.clone();
                let ticker = EpochTicker::start(move || engine.increment_epoch())
                    .map_err(|e| EngineError::Config(format!("cannot start epoch ticker: {e}")))?;
                Clock::Own { _ticker: ticker }
            }
        };
        Ok(WeirEngine {
            engine,
            kind,
            budget,
            _clock: clock,
        })
    }

    pub fn engine(&self) -> &wasmtime::Engine {
        &self.engine
    }

    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    pub fn kind(&self) -> EngineKind {
        self.kind
    }
}
