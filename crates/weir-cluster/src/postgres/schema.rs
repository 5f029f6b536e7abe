//! The cluster database's tables, and their creation: a node finds out
//! what of them is missing with one read of the catalog, which takes no
//! lock any other session waits for, so a node starting beside busy ones
//! (or beside a backup) holds up nobody; what is missing is added once,
//! under an advisory lock, whichever nodes start together, by statements
//! that never queue for a table's lock longer than [`SCHEMA_LOCK_WAIT`]
//! (every statement sent to that table after them queues behind them);
//! a database whose schema is newer than this build knows is refused,
//! never written.

use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;

use super::Postgres;
use super::connection::{classify, timed_for};
use crate::coordinator::CoordError;

/// The advisory lock that serializes schema changes between nodes.
const SCHEMA_LOCK: i64 = 0x7765_6972; // "weir"

/// The version of [`PARTS`], kept in `weir_schema`. Parts added beside
/// the others (the shared images', the journaled column) keep it: a node
/// of an older build never reads them and runs as before.
const SCHEMA_VERSION: i32 = 1;

/// How long one statement of a schema change waits for its table's lock
/// before the change is given up and tried again: while it waits, every
/// statement of every node sent to that table waits behind it, so this
/// is all a schema change may hold the cluster up by (a backup's read, a
/// long query, holds its lock for minutes).
pub const SCHEMA_LOCK_WAIT: Duration = Duration::from_millis(100);

/// How long after a change that could not get its locks it is tried again.
pub const SCHEMA_RETRY: Duration = Duration::from_millis(500);

/// How long a starting node keeps trying a schema change whose locks are
/// held by others before it gives up, naming who held them, unless
/// `cluster_schema_patience_ms` says otherwise: a backup of a big
/// database can run this long, and a node that waits for it longer is
/// better stopped and started after it.
pub const SCHEMA_PATIENCE: Duration = Duration::from_secs(120);

/// How long a schema change may run once it has its locks: an index
/// built over every actor's row of a big cluster takes its time, and a
/// node's statements are otherwise bounded by
/// [`STATEMENT_TIMEOUT`](super::STATEMENT_TIMEOUT).
pub const SCHEMA_CHANGE_TIMEOUT: Duration = Duration::from_secs(600);

/// How often a node that waits for a schema change's locks says so.
const SCHEMA_WAIT_LOG_EVERY: Duration = Duration::from_secs(10);

/// One part of the schema: a table, an index, or a column added to a
/// table after it was first made.
struct Part {
    /// The relation the part is (a table, an index), or has (a column).
    relation: &'static str,
    /// The column, for a column.
    column: Option<&'static str>,
    /// The table whose lock adding it takes, if it is not new itself.
    locks: Option<&'static str>,
    /// The statement that adds it.
    add: &'static str,
}

const fn table(relation: &'static str, add: &'static str) -> Part {
    Part {
        relation,
        column: None,
        locks: None,
        add,
    }
}

const fn index(relation: &'static str, on: &'static str, add: &'static str) -> Part {
    Part {
        relation,
        column: None,
        locks: Some(on),
        add,
    }
}

/// The schema, in the order its parts are added.
const PARTS: &[Part] = &[
    table(
        "weir_schema",
        "CREATE TABLE weir_schema (version INT NOT NULL)",
    ),
    table(
        "weir_nodes",
        "CREATE TABLE weir_nodes (
            session BIGSERIAL PRIMARY KEY,
            name TEXT NOT NULL,
            address TEXT NOT NULL,
            started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            expires_at TIMESTAMPTZ NOT NULL
        )",
    ),
    index(
        "weir_nodes_name",
        "weir_nodes",
        "CREATE INDEX weir_nodes_name ON weir_nodes (name)",
    ),
    table(
        "weir_objects",
        "CREATE TABLE weir_objects (
            id BIGSERIAL PRIMARY KEY,
            key TEXT NOT NULL UNIQUE,
            owner BIGINT,
            epoch BIGINT NOT NULL,
            head BIGINT NOT NULL,
            checksum BIGINT NOT NULL,
            log_bytes BIGINT NOT NULL DEFAULT 0,
            alarm_at BIGINT
        )",
    ),
    index(
        "weir_objects_alarm",
        "weir_objects",
        "CREATE INDEX weir_objects_alarm ON weir_objects (alarm_at) WHERE alarm_at IS NOT NULL",
    ),
    // Added beside the others (the version stays): an owner of resident
    // processes, which some live node must hold. A node of an older
    // build neither reads nor writes it.
    Part {
        relation: "weir_objects",
        column: Some("journaled"),
        locks: Some("weir_objects"),
        add: "ALTER TABLE weir_objects ADD COLUMN journaled BOOLEAN NOT NULL DEFAULT false",
    },
    index(
        "weir_objects_journaled",
        "weir_objects",
        "CREATE INDEX weir_objects_journaled ON weir_objects (id) WHERE journaled",
    ),
    table(
        "weir_log",
        "CREATE TABLE weir_log (
            object BIGINT NOT NULL,
            head BIGINT NOT NULL,
            ltx BYTEA NOT NULL,
            PRIMARY KEY (object, head)
        )",
    ),
    table(
        "weir_snapshots",
        "CREATE TABLE weir_snapshots (
            object BIGINT NOT NULL,
            head BIGINT NOT NULL,
            ltx BYTEA NOT NULL,
            PRIMARY KEY (object, head)
        )",
    ),
    table(
        "weir_images",
        "CREATE TABLE weir_images (
            digest TEXT PRIMARY KEY,
            bytes BIGINT NOT NULL,
            shared_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
    ),
    table(
        "weir_images_removed",
        "CREATE TABLE weir_images_removed (
            digest TEXT PRIMARY KEY,
            removed_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
    ),
    table(
        "weir_image_pieces",
        "CREATE TABLE weir_image_pieces (
            digest TEXT NOT NULL,
            piece INT NOT NULL,
            data BYTEA NOT NULL,
            PRIMARY KEY (digest, piece)
        )",
    ),
];

/// The parts of [`PARTS`] the database lacks (their places in it), read
/// from the catalog alone.
const MISSING: &str = "
SELECT p.at::INT - 1 FROM unnest($1::TEXT[], $2::TEXT[]) WITH ORDINALITY AS p(relation, col, at)
WHERE CASE WHEN p.col = '' THEN to_regclass(p.relation) IS NULL
      ELSE NOT EXISTS (SELECT 1 FROM pg_attribute a
                       WHERE a.attrelid = to_regclass(p.relation)
                         AND a.attname = p.col AND NOT a.attisdropped) END
ORDER BY p.at";

/// The sessions holding a lock on a table, but this one: who a schema
/// change that could not get its lock waited for.
const HOLDERS: &str = "
SELECT DISTINCT a.pid, coalesce(nullif(a.application_name, ''), 'an unnamed client'),
       coalesce(a.state, ''), coalesce(to_char(a.xact_start, 'YYYY-MM-DD HH24:MI:SS TZ'), '')
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.relation = to_regclass($1) AND l.granted AND l.pid <> pg_backend_pid()
ORDER BY a.pid";

/// How a schema change ended that did not end well.
enum Unchanged {
    /// A statement waited [`SCHEMA_LOCK_WAIT`] for `table`'s lock.
    Locked {
        table: &'static str,
    },
    Failed(CoordError),
}

impl From<CoordError> for Unchanged {
    fn from(e: CoordError) -> Self {
        Unchanged::Failed(e)
    }
}

impl Postgres {
    /// Adds what of the schema is missing, and checks its version; a
    /// change whose locks others hold is tried for `patience`.
    pub(super) async fn migrate(&self, patience: Duration) -> Result<(), CoordError> {
        let started = Instant::now();
        let mut said = None::<Instant>;
        loop {
            let (missing, version) = timed_for(super::CALL_TIMEOUT, self.present()).await?;
            check_version(version)?;
            if missing.is_empty() && version.is_some() {
                return Ok(());
            }
            let names = missing.iter().map(|&i| name(&PARTS[i])).collect::<Vec<_>>();
            let changing = Instant::now();
            match timed_for(SCHEMA_CHANGE_TIMEOUT, self.change()).await {
                Ok(added) => {
                    if !added.is_empty() {
                        tracing::info!(
                            added = %added.join(", "),
                            took_ms = changing.elapsed().as_millis() as u64,
                            "the cluster database's schema was completed"
                        );
                    }
                    return Ok(());
                }
                Err(Unchanged::Failed(e)) => return Err(e),
                Err(Unchanged::Locked { table }) => {
                    let holders = timed_for(super::CALL_TIMEOUT, self.holders(table))
                        .await
                        .unwrap_or_else(|e| vec![format!("(unknown: {e})")]);
                    let holders = if holders.is_empty() {
                        "sessions that have since let go".to_string()
                    } else {
                        holders.join("; ")
                    };
                    if started.elapsed() >= patience {
                        return Err(CoordError::Unavailable(format!(
                            "the schema change ({}) could not lock {table} for {} ms \
                             (cluster_schema_patience_ms); it is held by {holders}",
                            names.join(", "),
                            patience.as_millis()
                        )));
                    }
                    if said.is_none_or(|at| at.elapsed() >= SCHEMA_WAIT_LOG_EVERY) {
                        said = Some(Instant::now());
                        tracing::warn!(
                            missing = %names.join(", "),
                            table,
                            held_by = %holders,
                            waited_ms = started.elapsed().as_millis() as u64,
                            "the cluster database's schema change waits for a table others hold"
                        );
                    }
                    tokio::time::sleep(SCHEMA_RETRY).await;
                }
            }
        }
    }

    /// The parts the database lacks, and the version it keeps (none when
    /// `weir_schema` is missing or empty), read without a lock anyone
    /// waits for.
    async fn present(&self) -> Result<(Vec<usize>, Option<i32>), CoordError> {
        let client = self.client().await?;
        let missing = missing(&*client).await?;
        let version = if missing.iter().any(|&i| PARTS[i].relation == "weir_schema") {
            None
        } else {
            client
                .query_opt("SELECT max(version) FROM weir_schema", &[])
                .await
                .map_err(classify)?
                .and_then(|r| r.get(0))
        };
        Ok((missing, version))
    }

    /// Under the advisory lock, adds the parts still missing and records
    /// the version if none is; the names of what it added.
    async fn change(&self) -> Result<Vec<String>, Unchanged> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(classify)?;
        let timeout = SCHEMA_CHANGE_TIMEOUT.as_millis();
        tx.batch_execute(&format!(
            "SET LOCAL statement_timeout = {timeout}; SET LOCAL client_min_messages = warning"
        ))
        .await
        .map_err(classify)?;
        // Another node's change is waited for whole: it takes no lock
        // any statement but a change's waits for.
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
            .await
            .map_err(classify)?;
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = {}",
            SCHEMA_LOCK_WAIT.as_millis()
        ))
        .await
        .map_err(classify)?;
        let mut added = Vec::new();
        for i in missing(&tx).await? {
            let part = &PARTS[i];
            match tx.batch_execute(part.add).await {
                Ok(()) => added.push(name(part)),
                Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                    return Err(Unchanged::Locked {
                        table: part.locks.unwrap_or(part.relation),
                    });
                }
                Err(e) => return Err(classify(e).into()),
            }
        }
        let version: Option<i32> = tx
            .query_one("SELECT max(version) FROM weir_schema", &[])
            .await
            .map_err(classify)?
            .get(0);
        check_version(version)?;
        if version.is_none() {
            tx.execute(
                "INSERT INTO weir_schema (version) VALUES ($1)",
                &[&SCHEMA_VERSION],
            )
            .await
            .map_err(classify)?;
        }
        tx.commit().await.map_err(classify)?;
        Ok(added)
    }

    /// Who holds a lock on `table`, one line each.
    async fn holders(&self, table: &str) -> Result<Vec<String>, CoordError> {
        let client = self.client().await?;
        Ok(client
            .query(HOLDERS, &[&table])
            .await
            .map_err(classify)?
            .iter()
            .map(|r| {
                let (pid, who, state, since): (i32, String, String, String) =
                    (r.get(0), r.get(1), r.get(2), r.get(3));
                let mut line = format!("pid {pid} ({who}");
                if !state.is_empty() {
                    line.push_str(&format!(", {state}"));
                }
                if !since.is_empty() {
                    line.push_str(&format!(", in a transaction since {since}"));
                }
                line.push(')');
                line
            })
            .collect())
    }
}

/// What the database lacks of [`PARTS`], read from its catalog.
async fn missing(client: &impl deadpool_postgres::GenericClient) -> Result<Vec<usize>, CoordError> {
    let relations: Vec<&str> = PARTS.iter().map(|p| p.relation).collect();
    let columns: Vec<&str> = PARTS.iter().map(|p| p.column.unwrap_or("")).collect();
    Ok(client
        .query(MISSING, &[&relations, &columns])
        .await
        .map_err(classify)?
        .iter()
        .map(|r| r.get::<_, i32>(0) as usize)
        .collect())
}

fn check_version(version: Option<i32>) -> Result<(), CoordError> {
    match version {
        Some(v) if v > SCHEMA_VERSION => Err(CoordError::Refused(format!(
            "the cluster database has schema version {v}; this build knows {SCHEMA_VERSION}"
        ))),
        _ => Ok(()),
    }
}

fn name(part: &Part) -> String {
    match part.column {
        Some(column) => format!("{}.{column}", part.relation),
        None => part.relation.to_string(),
    }
}
