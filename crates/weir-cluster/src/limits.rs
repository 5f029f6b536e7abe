//! The limits cluster mode adds, declared once like every layer's
//! (`weir_runtime::limit_table!`) and set from the same `[limits]` table.

use std::time::Duration;

use weir_runtime::limit_table;

use crate::config::{MAX_LEASE, MIN_LEASE};

limit_table! {
    /// The limits of a node of a cluster.
    pub struct ClusterLimits {
        cluster_lease: Duration = "cluster_lease_ms" {
            default: 5_000, range: MIN_LEASE.as_millis() as u64, MAX_LEASE.as_millis() as u64, unit: Millis,
            meaning: "a node's lease in the cluster database, renewed every third of it; a dead node's actors move after it",
        },
        cluster_schema_patience: Duration = "cluster_schema_patience_ms" {
            default: 120_000, range: 1_000, 86_400_000, unit: Millis,
            meaning: "how long a starting node keeps trying to add what a newer build adds to the cluster database's schema while others hold its tables (a backup, a long transaction), before it stops naming them",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_table_says_what_the_code_does() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .unwrap();
        let wrong = weir_runtime::limit_table::readme_disagreements(ClusterLimits::SPECS, &readme);
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn the_default_lease_is_the_configs() {
        assert_eq!(
            ClusterLimits::default().cluster_lease,
            crate::config::DEFAULT_LEASE
        );
        assert_eq!(
            ClusterLimits::default().cluster_schema_patience,
            crate::postgres::SCHEMA_PATIENCE
        );
        for spec in ClusterLimits::SPECS {
            assert!(
                weir_runtime::limits::spec(spec.name).is_err(),
                "{}",
                spec.name
            );
        }
    }
}
