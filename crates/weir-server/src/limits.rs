//! Every limit a server has, from every layer: the runtime's, the
//! actors' and the programs'. One `[limits]` table and one `--limit NAME=VALUE` set them all.
//!
//! Invariant owned here: a flat limit name belongs to exactly one layer's
//! table (checked by each layer's tests); an unknown name is refused with
//! every known name listed.

use weir_actors::ActorLimits;
use weir_cluster::ClusterLimits;
use weir_http::websocket::SocketLimits;
use weir_programs::ProgramLimits;
use weir_runtime::Limits;
use weir_runtime::limit_table::{
    LimitError, LimitSpec, LimitTable, split_assignment, unknown_among,
};

/// The limits of every layer of one server.
#[derive(Clone, Debug, Default)]
pub struct ServerLimits {
    pub runtime: Limits,
    pub actors: ActorLimits,
    pub programs: ProgramLimits,
    pub sockets: SocketLimits,
    pub cluster: ClusterLimits,
}

impl ServerLimits {
    /// Every limit's spec, the runtime's first.
    pub fn specs() -> impl Iterator<Item = &'static LimitSpec> {
        Limits::specs()
            .iter()
            .chain(ActorLimits::specs())
            .chain(ProgramLimits::specs())
            .chain(SocketLimits::specs())
            .chain(ClusterLimits::specs())
    }

    /// Sets one limit by its flat name, checking its range.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), LimitError> {
        if ActorLimits::specs().iter().any(|s| s.name == name) {
            return self.actors.set_limit(name, value);
        }
        if ProgramLimits::specs().iter().any(|s| s.name == name) {
            return self.programs.set_limit(name, value);
        }
        if SocketLimits::specs().iter().any(|s| s.name == name) {
            return self.sockets.set_limit(name, value);
        }
        if ClusterLimits::specs().iter().any(|s| s.name == name) {
            return self.cluster.set_limit(name, value);
        }
        self.runtime.set_limit(name, value).map_err(|e| {
            unknown_among(
                e,
                &[
                    Limits::specs(),
                    ActorLimits::specs(),
                    ProgramLimits::specs(),
                    SocketLimits::specs(),
                    ClusterLimits::specs(),
                ],
            )
        })
    }

    /// Applies a `NAME=VALUE` assignment.
    pub fn apply(&mut self, assignment: &str) -> Result<(), LimitError> {
        let (name, value) = split_assignment(assignment)?;
        self.set(name, value)
    }

    /// A limit's value by its flat name, in its spec's unit.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.runtime
            .value(name)
            .or_else(|| self.actors.value(name))
            .or_else(|| self.programs.value(name))
            .or_else(|| self.sockets.value(name))
            .or_else(|| self.cluster.value(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_layer_sets_its_own_limits() {
        let mut limits = ServerLimits::default();
        limits.apply("actor_max_queued=7").unwrap();
        limits.apply("max_concurrent=3").unwrap();
        limits.apply("run_time_limit_ms=5").unwrap();
        assert_eq!(limits.programs.run_time_limit.as_millis(), 5);
        assert_eq!(limits.actors.actor_max_queued, 7);
        assert_eq!(limits.runtime.max_concurrent, 3);
        assert_eq!(limits.get("actor_max_queued"), Some(7));
        let err = limits.apply("bogus=1").unwrap_err().to_string();
        assert!(
            err.contains("max_concurrent") && err.contains("actor_idle_ms"),
            "{err}"
        );
        let err = limits.apply("actor_max_queued=0").unwrap_err().to_string();
        assert!(err.contains("actor_max_queued"), "{err}");
    }
}
