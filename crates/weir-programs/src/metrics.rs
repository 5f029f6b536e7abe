//! The metrics of programs: resident processes live, spawned and ended by
//! outcome, and one-shot runs by outcome, in the server's one registry,
//! each series labelled with the app whose actors ran them.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use weir_runtime::metrics::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AppLabels {
    app: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    app: String,
    outcome: String,
}

/// The handles of one app (see [`ProgramMetrics::for_app`]); cheap to
/// clone.
#[derive(Clone, Default)]
pub struct ProgramMetrics {
    app: String,
    live: Family<AppLabels, Gauge>,
    processes_live: Gauge,
    spawns: Family<OutcomeLabels, Counter>,
    exits: Family<OutcomeLabels, Counter>,
    runs: Family<OutcomeLabels, Counter>,
    recoveries: Family<OutcomeLabels, Counter>,
}

impl ProgramMetrics {
    /// Registers the programs' metrics in `metrics`.
    pub fn register(metrics: &Metrics) -> ProgramMetrics {
        let m = ProgramMetrics::default();
        metrics.register(
            "processes_live",
            "Resident processes running",
            m.live.clone(),
        );
        metrics.register(
            "process_spawns",
            "Spawns by result (ok, refused, failed)",
            m.spawns.clone(),
        );
        metrics.register(
            "process_exits",
            "Resident processes ended, by outcome (killed, stopped with the server, exited, failed)",
            m.exits.clone(),
        );
        metrics.register(
            "program_runs",
            "One-shot runs from actors, by outcome (ok, trap, deadline, limit)",
            m.runs.clone(),
        );
        metrics.register(
            "process_recoveries",
            "Journal rows recovered after a crash, by outcome (recovered, lost)",
            m.recoveries.clone(),
        );
        m
    }

    /// The same families, counting for `app`.
    pub fn for_app(&self, app: &str) -> ProgramMetrics {
        ProgramMetrics {
            app: app.to_string(),
            processes_live: self
                .live
                .get_or_create(&AppLabels { app: app.into() })
                .clone(),
            ..self.clone()
        }
    }

    fn count(&self, family: &Family<OutcomeLabels, Counter>, outcome: &str) {
        family
            .get_or_create(&OutcomeLabels {
                app: self.app.clone(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn spawned(&self, result: &str) {
        self.count(&self.spawns, result);
        if result == "ok" {
            self.processes_live.inc();
        }
    }

    pub fn exited(&self, outcome: &str) {
        self.processes_live.dec();
        self.count(&self.exits, outcome);
    }

    pub fn recovered(&self, outcome: &str) {
        self.count(&self.recoveries, outcome);
    }

    pub fn ran(&self, outcome: &str) {
        self.count(&self.runs, outcome);
    }
}
