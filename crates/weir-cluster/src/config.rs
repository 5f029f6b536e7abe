//! What a node of a cluster is started with, checked.
//!
//! Invariant owned here: a node never starts with a configuration that
//! could not work — a name other nodes could confuse, a secret short
//! enough to guess, a lease too short to renew in time — and what is wrong
//! is named.

use std::net::SocketAddr;
use std::time::Duration;

/// The default lease: long enough that a busy database's slow renewal does
/// not cost a node its objects, short enough that a dead node's actors
/// move within seconds.
pub const DEFAULT_LEASE: Duration = Duration::from_millis(5000);

/// The shortest lease allowed: a third of it must cover a renewal's round
/// trip with room to retry.
pub const MIN_LEASE: Duration = Duration::from_millis(300);

/// The longest lease allowed: past it a dead node holds its actors for
/// longer than any caller waits.
pub const MAX_LEASE: Duration = Duration::from_secs(300);

/// The shortest shared secret accepted, in bytes: 128 bits.
pub const MIN_SECRET_BYTES: usize = 16;

/// Longest node name.
pub const MAX_NODE_NAME: usize = 64;

/// The largest `max_database_bytes` a node runs with: a database's
/// snapshot is stored as one PostgreSQL value, which cannot exceed 1 GB,
/// and a snapshot of pages that do not compress is a little larger than
/// the database (its headers and LZ4's frames). 960 MiB leaves 64 MiB for
/// them.
pub const MAX_DATABASE_BYTES: u64 = 960 << 20;

/// One node's cluster settings.
#[derive(Clone)]
pub struct ClusterConfig {
    /// The PostgreSQL database every node shares (`postgres://…`).
    pub database: String,
    /// This node's name, unique in the cluster and stable across restarts.
    pub node: String,
    /// Where this node listens for the other nodes.
    pub listen: SocketAddr,
    /// Where the other nodes reach it; the bound listen address unless set.
    pub advertise: Option<String>,
    /// Shared by every node; a call between nodes without it is refused.
    pub secret: String,
    /// `cluster_lease_ms`.
    pub lease: Duration,
    /// `cluster_schema_patience_ms`.
    pub schema_patience: Duration,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("database", &crate::postgres::redacted(&self.database))
            .field("node", &self.node)
            .field("listen", &self.listen)
            .field("advertise", &self.advertise)
            .field("secret", &"<secret>")
            .field("lease", &self.lease)
            .field("schema_patience", &self.schema_patience)
            .finish()
    }
}

/// What is wrong with a cluster configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("node name `{0}` must be 1-{MAX_NODE_NAME} characters of a-z, 0-9, `.`, `_` or `-`")]
    NodeName(String),
    #[error("the cluster secret is {0} bytes; at least {MIN_SECRET_BYTES} are required")]
    Secret(usize),
    #[error("cluster_lease_ms must be between {min} and {max}; got {0}", min = MIN_LEASE.as_millis(), max = MAX_LEASE.as_millis())]
    Lease(u128),
    #[error("the cluster database must be a postgres:// or postgresql:// URL")]
    Database,
}

impl ClusterConfig {
    /// Checks every setting, naming the first that is wrong.
    pub fn check(&self) -> Result<(), ConfigError> {
        let name_ok = !self.node.is_empty()
            && self.node.len() <= MAX_NODE_NAME
            && self
                .node
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if !name_ok {
            return Err(ConfigError::NodeName(self.node.clone()));
        }
        if self.secret.len() < MIN_SECRET_BYTES {
            return Err(ConfigError::Secret(self.secret.len()));
        }
        if self.lease < MIN_LEASE || self.lease > MAX_LEASE {
            return Err(ConfigError::Lease(self.lease.as_millis()));
        }
        if !(self.database.starts_with("postgres://") || self.database.starts_with("postgresql://"))
        {
            return Err(ConfigError::Database);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ClusterConfig {
        ClusterConfig {
            database: "postgres://weir@127.0.0.1/weir".into(),
            node: "n1".into(),
            listen: "127.0.0.1:0".parse().unwrap(),
            advertise: None,
            secret: "0123456789abcdef".into(),
            lease: DEFAULT_LEASE,
            schema_patience: crate::postgres::SCHEMA_PATIENCE,
        }
    }

    #[test]
    fn every_setting_is_checked_by_name() {
        assert_eq!(config().check(), Ok(()));
        for bad in ["", "N1", "n 1", &"n".repeat(65)] {
            let c = ClusterConfig {
                node: bad.to_string(),
                ..config()
            };
            assert_eq!(c.check(), Err(ConfigError::NodeName(bad.to_string())));
        }
        let c = ClusterConfig {
            secret: "short".into(),
            ..config()
        };
        assert_eq!(c.check(), Err(ConfigError::Secret(5)));
        let c = ClusterConfig {
            lease: Duration::from_millis(100),
            ..config()
        };
        assert_eq!(c.check(), Err(ConfigError::Lease(100)));
        let c = ClusterConfig {
            database: "mysql://x".into(),
            ..config()
        };
        assert_eq!(c.check(), Err(ConfigError::Database));
        let shown = format!(
            "{:?}",
            ClusterConfig {
                database: "postgres://weir:hunter2@db/weir".into(),
                ..config()
            }
        );
        assert!(
            !shown.contains("hunter2") && !shown.contains("0123456789abcdef"),
            "{shown}"
        );
    }
}
