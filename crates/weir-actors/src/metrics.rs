//! Actor metrics: turns by class, kind and result; wakes, hibernations,
//! overloaded refusals, new actors refused and dropped alarms; turn latency;
//! actors in memory.
//!
//! Invariant owned here: like the runtime's, every handle a turn records
//! into is resolved once per class at start (registered in the server's
//! one registry under the `weir_` prefix), so a turn touches only atomics.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use weir_runtime::latency_histogram::LatencyHistogram;
use weir_runtime::metrics::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TurnLabels {
    class: String,
    turn: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActorEventLabels {
    class: String,
    event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: String,
}

/// The actor families of the server's registry.
pub struct ActorMetrics {
    actor_turns: Family<TurnLabels, Counter>,
    actor_events: Family<ActorEventLabels, Counter>,
    actor_turn_seconds: Family<ClassLabels, LatencyHistogram>,
    actors_in_memory: Gauge,
}

impl ActorMetrics {
    /// Registers the actor families in `metrics`.
    pub fn register(metrics: &Metrics) -> ActorMetrics {
        let actor_turns = Family::<TurnLabels, Counter>::default();
        let actor_events = Family::<ActorEventLabels, Counter>::default();
        let actor_turn_seconds = Family::<ClassLabels, LatencyHistogram>::default();
        let actors_in_memory = Gauge::default();
        metrics.register(
            "actor_turns",
            "Actor turns by class, kind (request, alarm, call) and result (ok, failed)",
            actor_turns.clone(),
        );
        metrics.register(
            "actor_events",
            "Actor wakes, hibernations, overloaded refusals, new actors refused (too_many_actors) and dropped alarms, by class",
            actor_events.clone(),
        );
        metrics.register(
            "actor_turn_duration_seconds",
            "Call arrival to end of turn, queueing included, per request turn",
            actor_turn_seconds.clone(),
        );
        metrics.register(
            "actors_in_memory",
            "Actors in memory (not hibernated)",
            actors_in_memory.clone(),
        );
        ActorMetrics {
            actor_turns,
            actor_events,
            actor_turn_seconds,
            actors_in_memory,
        }
    }

    /// The handles one actor class records into.
    pub fn for_class(&self, class: &str) -> ActorClassMetrics {
        let turn = |turn: &'static str, result: &'static str| {
            self.actor_turns
                .get_or_create(&TurnLabels {
                    class: class.to_string(),
                    turn,
                    result,
                })
                .clone()
        };
        let event = |event: &'static str| {
            self.actor_events
                .get_or_create(&ActorEventLabels {
                    class: class.to_string(),
                    event,
                })
                .clone()
        };
        ActorClassMetrics {
            inner: Arc::new(ActorClassInner {
                request_ok: turn("request", "ok"),
                request_failed: turn("request", "failed"),
                alarm_ok: turn("alarm", "ok"),
                alarm_failed: turn("alarm", "failed"),
                call_ok: turn("call", "ok"),
                call_failed: turn("call", "failed"),
                wakes: event("wake"),
                hibernations: event("hibernation"),
                overloaded: event("overloaded"),
                refused_new: event("too_many_actors"),
                alarms_dropped: event("alarm_dropped"),
                turn_seconds: self
                    .actor_turn_seconds
                    .get_or_create(&ClassLabels {
                        class: class.to_string(),
                    })
                    .clone(),
                in_memory: self.actors_in_memory.clone(),
            }),
        }
    }
}

struct ActorClassInner {
    request_ok: Counter,
    request_failed: Counter,
    alarm_ok: Counter,
    alarm_failed: Counter,
    call_ok: Counter,
    call_failed: Counter,
    wakes: Counter,
    hibernations: Counter,
    overloaded: Counter,
    refused_new: Counter,
    alarms_dropped: Counter,
    turn_seconds: LatencyHistogram,
    in_memory: Gauge,
}

/// What one actor class records: turns, wakes, hibernations, refusals.
#[derive(Clone)]
pub struct ActorClassMetrics {
    inner: Arc<ActorClassInner>,
}

impl ActorClassMetrics {
    /// A request turn ended, `took` after the call's arrival.
    pub fn request_turn(&self, ok: bool, took: Duration) {
        let i = &self.inner;
        if ok { &i.request_ok } else { &i.request_failed }.inc();
        i.turn_seconds.observe(took);
    }

    pub fn alarm_turn(&self, ok: bool) {
        let i = &self.inner;
        if ok { &i.alarm_ok } else { &i.alarm_failed }.inc();
    }

    /// A turn that called one of the class's exports for a layer above.
    pub fn call_turn(&self, ok: bool) {
        let i = &self.inner;
        if ok { &i.call_ok } else { &i.call_failed }.inc();
    }

    pub fn woke(&self) {
        self.inner.wakes.inc();
    }

    pub fn hibernated(&self) {
        self.inner.hibernations.inc();
    }

    pub fn overloaded(&self) {
        self.inner.overloaded.inc();
    }

    /// A call was refused because its actor would have been one past
    /// `max_actors`.
    pub fn refused_new(&self) {
        self.inner.refused_new.inc();
    }

    pub fn alarm_dropped(&self) {
        self.inner.alarms_dropped.inc();
    }

    /// Actors in memory across every class.
    pub fn set_in_memory(&self, n: usize) {
        self.inner.in_memory.set(n as i64);
    }
}
