//! Prometheus metrics: events by outcome, generation counts, queue depth and
//! latency histograms.
//!
//! Invariant owned here: every metric handle used on the hot path is
//! resolved once per app at start, so recording an event touches only
//! atomics — never a label lookup or a lock (the latency histograms are
//! [`LatencyHistogram`]s for that reason).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::latency_histogram::LatencyHistogram;
use crate::outcome::Outcome;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    app: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GenerationLabels {
    app: String,
    event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutboundLabels {
    app: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AppLabels {
    app: String,
}

/// The registry of one Weir process.
pub struct Metrics {
    /// Behind a lock only so that the layers above can add their own
    /// families at start ([`Metrics::register`]); recording never locks.
    registry: std::sync::Mutex<Registry>,
    events: Family<OutcomeLabels, Counter>,
    generations: Family<GenerationLabels, Counter>,
    outbound: Family<OutboundLabels, Counter>,
    queue_depth: Family<AppLabels, Gauge>,
    event_seconds: Family<AppLabels, LatencyHistogram>,
    wasm_seconds: Family<AppLabels, LatencyHistogram>,
    guest_memory: Gauge,
    guest_memory_budget: Gauge,
    guest_memory_refusals: Counter,
    /// The budget the guest memory gauges are read from, at each encode.
    budget: std::sync::OnceLock<std::sync::Arc<crate::memory_budget::MemoryBudget>>,
    /// Refusals already added to `guest_memory_refusals`.
    refusals_seen: AtomicU64,
    sql_over_memory: Counter,
    /// Statements already added to `sql_over_memory`.
    sql_over_memory_seen: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("weir");
        let events = Family::<OutcomeLabels, Counter>::default();
        let generations = Family::<GenerationLabels, Counter>::default();
        let queue_depth = Family::<AppLabels, Gauge>::default();
        let outbound = Family::<OutboundLabels, Counter>::default();
        let event_seconds = Family::<AppLabels, LatencyHistogram>::default();
        let wasm_seconds = Family::<AppLabels, LatencyHistogram>::default();
        registry.register("events", "Events by terminal outcome", events.clone());
        registry.register(
            "generations",
            "Generations created, retired, abandoned, or that failed to instantiate",
            generations.clone(),
        );
        registry.register(
            "outbound_refused",
            "Outbound requests refused before anything was sent: denied host, or the event's operations full",
            outbound.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting for a lane",
            queue_depth.clone(),
        );
        registry.register(
            "event_duration_seconds",
            "Arrival to end of response, per event",
            event_seconds.clone(),
        );
        registry.register(
            "wasm_duration_seconds",
            "Wasm entry to response headers, per event",
            wasm_seconds.clone(),
        );
        let guest_memory = Gauge::default();
        let guest_memory_budget = Gauge::default();
        let guest_memory_refusals = Counter::default();
        registry.register(
            "guest_memory_bytes",
            "Linear memory reserved by every live instance together",
            guest_memory.clone(),
        );
        registry.register(
            "guest_memory_budget_bytes",
            "max_total_guest_memory_bytes: what all live instances may reserve together",
            guest_memory_budget.clone(),
        );
        registry.register(
            "guest_memory_refusals",
            "Memory growths refused because they did not fit in the budget",
            guest_memory_refusals.clone(),
        );
        let sql_over_memory = Counter::default();
        registry.register(
            "sql_statements_over_memory",
            "Guest SQL statements stopped at max_sql_statement_memory_bytes, in every app",
            sql_over_memory.clone(),
        );
        Metrics {
            sql_over_memory,
            sql_over_memory_seen: AtomicU64::new(0),
            guest_memory,
            guest_memory_budget,
            guest_memory_refusals,
            budget: std::sync::OnceLock::new(),
            refusals_seen: AtomicU64::new(0),
            registry: std::sync::Mutex::new(registry),
            events,
            generations,
            outbound,
            queue_depth,
            event_seconds,
            wasm_seconds,
        }
    }

    /// The handles one app records into.
    pub fn for_app(&self, app: &str) -> AppMetrics {
        let outcome = |o: Outcome| {
            self.events
                .get_or_create(&OutcomeLabels {
                    app: app.to_string(),
                    outcome: o.as_str(),
                })
                .clone()
        };
        let generation = |event: &'static str| {
            self.generations
                .get_or_create(&GenerationLabels {
                    app: app.to_string(),
                    event,
                })
                .clone()
        };
        // Each handle is resolved in its own closure call: a family's lookup
        // guard must be released before the next lookup in the same family.
        let outbound = |result: &'static str| {
            self.outbound
                .get_or_create(&OutboundLabels {
                    app: app.to_string(),
                    result,
                })
                .clone()
        };
        let labels = AppLabels {
            app: app.to_string(),
        };
        AppMetrics {
            inner: Arc::new(AppMetricsInner {
                outcomes: Outcome::ALL.iter().map(|o| outcome(*o)).collect(),
                created: generation("created"),
                retired: generation("retired"),
                abandoned: generation("abandoned"),
                failed: generation("instantiation_failed"),
                outbound_denied: outbound("denied"),
                outbound_capacity: outbound("event_operation_capacity"),
                queue_depth: self.queue_depth.get_or_create(&labels).clone(),
                event_seconds: self.event_seconds.get_or_create(&labels).clone(),
                wasm_seconds: self.wasm_seconds.get_or_create(&labels).clone(),
                counts: GenerationCounts::default(),
            }),
        }
    }

    /// Adds a metric family of a layer above (registered at start, under
    /// the `weir_` prefix).
    pub fn register(
        &self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        self.registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .register(name, help, metric);
    }

    /// Reports the guest memory budget in every later exposition.
    pub fn watch_budget(&self, budget: std::sync::Arc<crate::memory_budget::MemoryBudget>) {
        let _ = self.budget.set(budget);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        if let Some(budget) = self.budget.get() {
            self.guest_memory.set(budget.used() as i64);
            self.guest_memory_budget.set(budget.limit() as i64);
            let refusals = budget.refusals();
            let seen = self.refusals_seen.swap(refusals, Ordering::Relaxed);
            self.guest_memory_refusals
                .inc_by(refusals.saturating_sub(seen));
        }
        let over = weir_store::statement_memory::statements_over_memory();
        let seen = self.sql_over_memory_seen.swap(over, Ordering::Relaxed);
        self.sql_over_memory.inc_by(over.saturating_sub(seen));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

/// Generation counts, also shown by `/status`.
#[derive(Default)]
pub struct GenerationCounts {
    pub created: AtomicU64,
    pub retired: AtomicU64,
    pub abandoned: AtomicU64,
    pub instantiation_failed: AtomicU64,
}

struct AppMetricsInner {
    outcomes: Vec<Counter>,
    created: Counter,
    retired: Counter,
    abandoned: Counter,
    failed: Counter,
    outbound_denied: Counter,
    outbound_capacity: Counter,
    queue_depth: Gauge,
    event_seconds: LatencyHistogram,
    wasm_seconds: LatencyHistogram,
    counts: GenerationCounts,
}

/// One app's metric handles; cheap to clone.
#[derive(Clone)]
pub struct AppMetrics {
    inner: Arc<AppMetricsInner>,
}

impl AppMetrics {
    /// An event ended: `total` from its arrival, `wasm` from its Wasm
    /// entry to its response's head, if it got that far.
    pub fn event(&self, outcome: Outcome, total: Duration, wasm: Option<Duration>) {
        if let Some(c) = self.inner.outcomes.get(outcome as usize) {
            c.inc();
        }
        self.inner.event_seconds.observe(total);
        if let Some(w) = wasm {
            self.inner.wasm_seconds.observe(w);
        }
    }

    pub fn generation_created(&self) {
        self.inner.created.inc();
        self.inner.counts.created.fetch_add(1, Ordering::Relaxed);
    }

    pub fn generation_retired(&self) {
        self.inner.retired.inc();
        self.inner.counts.retired.fetch_add(1, Ordering::Relaxed);
    }

    pub fn generation_abandoned(&self) {
        self.inner.abandoned.inc();
        self.inner.counts.abandoned.fetch_add(1, Ordering::Relaxed);
    }

    pub fn instantiation_failed(&self) {
        self.inner.failed.inc();
        self.inner
            .counts
            .instantiation_failed
            .fetch_add(1, Ordering::Relaxed);
    }

    pub fn outbound_denied(&self) {
        self.inner.outbound_denied.inc();
    }

    pub fn outbound_refused(&self) {
        self.inner.outbound_capacity.inc();
    }

    pub fn set_queue_depth(&self, depth: usize) {
        self.inner.queue_depth.set(depth as i64);
    }

    pub fn counts(&self) -> &GenerationCounts {
        &self.inner.counts
    }
}
