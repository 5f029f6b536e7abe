//! The metrics of programs: resident processes live, spawned and ended by
//! outcome, and one-shot runs by outcome, in the server's one registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use weir_runtime::metrics::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

/// The handles; cheap to clone.
#[derive(Clone, Default)]
pub struct ProgramMetrics {
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
            m.processes_live.clone(),
        );
        metrics.register(
            "process_spawns",
            "Spawns by result (ok, refused, failed)",
            m.spawns.clone(),
        );
        metrics.register(
            "process_exits",
            "Resident processes ended, by outcome (killed, exited, failed)",
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

    fn count(family: &Family<OutcomeLabels, Counter>, outcome: &str) {
        family
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn spawned(&self, result: &str) {
        Self::count(&self.spawns, result);
        if result == "ok" {
            self.processes_live.inc();
        }
    }

    pub fn exited(&self, outcome: &str) {
        self.processes_live.dec();
        Self::count(&self.exits, outcome);
    }

    pub fn recovered(&self, outcome: &str) {
        Self::count(&self.recoveries, outcome);
    }

    pub fn ran(&self, outcome: &str) {
        Self::count(&self.runs, outcome);
    }
}
