//! The cluster database's tables, and their creation: once, under an
//! advisory lock, whichever nodes start together; a database whose schema
//! is newer than this build knows is refused, never written.

use super::{Postgres, classify, timed};
use crate::coordinator::CoordError;

/// The advisory lock that serializes schema creation between nodes.
const SCHEMA_LOCK: i64 = 0x7765_6972; // "weir"

/// The version of [`SCHEMA`], kept in `weir_schema`. Tables added beside
/// the others (the shared images') keep it: a node of an older build
/// never reads them and runs as before.
const SCHEMA_VERSION: i32 = 1;

const SCHEMA: &str = "
-- Each statement below that finds its table already there would say so
-- in a notice, which every node after the first would log on its start.
SET LOCAL client_min_messages = warning;
CREATE TABLE IF NOT EXISTS weir_schema (version INT NOT NULL);
CREATE TABLE IF NOT EXISTS weir_nodes (
    session BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL,
    address TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS weir_nodes_name ON weir_nodes (name);
CREATE TABLE IF NOT EXISTS weir_objects (
    id BIGSERIAL PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    owner BIGINT,
    epoch BIGINT NOT NULL,
    head BIGINT NOT NULL,
    checksum BIGINT NOT NULL,
    log_bytes BIGINT NOT NULL DEFAULT 0,
    alarm_at BIGINT
);
CREATE INDEX IF NOT EXISTS weir_objects_alarm ON weir_objects (alarm_at) WHERE alarm_at IS NOT NULL;
-- Added beside the others (the version stays): an owner of resident
-- processes, which some live node must hold. A node of an older build
-- neither reads nor writes it.
ALTER TABLE weir_objects ADD COLUMN IF NOT EXISTS journaled BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS weir_objects_journaled ON weir_objects (id) WHERE journaled;
CREATE TABLE IF NOT EXISTS weir_log (
    object BIGINT NOT NULL,
    head BIGINT NOT NULL,
    ltx BYTEA NOT NULL,
    PRIMARY KEY (object, head)
);
CREATE TABLE IF NOT EXISTS weir_snapshots (
    object BIGINT NOT NULL,
    head BIGINT NOT NULL,
    ltx BYTEA NOT NULL,
    PRIMARY KEY (object, head)
);
CREATE TABLE IF NOT EXISTS weir_images (
    digest TEXT PRIMARY KEY,
    bytes BIGINT NOT NULL,
    shared_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS weir_images_removed (
    digest TEXT PRIMARY KEY,
    removed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS weir_image_pieces (
    digest TEXT NOT NULL,
    piece INT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (digest, piece)
);
";

impl Postgres {
    /// Creates the schema if it is missing, and checks its version.
    pub(super) async fn migrate(&self) -> Result<(), CoordError> {
        timed(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(classify)?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
                .await
                .map_err(classify)?;
            tx.batch_execute(SCHEMA).await.map_err(classify)?;
            let version: Option<i32> = tx
                .query_opt("SELECT version FROM weir_schema", &[])
                .await
                .map_err(classify)?
                .map(|r| r.get(0));
            match version {
                None => {
                    tx.execute(
                        "INSERT INTO weir_schema (version) VALUES ($1)",
                        &[&SCHEMA_VERSION],
                    )
                    .await
                    .map_err(classify)?;
                }
                Some(v) if v > SCHEMA_VERSION => {
                    return Err(CoordError::Refused(format!(
                        "the cluster database has schema version {v}; this build knows {SCHEMA_VERSION}"
                    )));
                }
                Some(_) => {}
            }
            tx.commit().await.map_err(classify)
        })
        .await
    }
}
