//! Actor storage: the SQLite database of one actor — its key-value entries
//! ([`crate::entries`]), its own SQL tables, its named timers
//! ([`crate::timers`]), its launch journal ([`crate::journal`]) and its
//! incarnation counter — the turn transaction that makes a turn's writes
//! all-or-nothing ([`crate::turn_transaction`]), and what it takes on
//! disk ([`crate::disk_use`]). This module opens the
//! database, keeps its schema, the incarnation and its checkpoints, and
//! runs the guest's SQL.
//!
//! Invariants owned here:
//! - one entry (key and value together) is at most [`MAX_ENTRY_BYTES`]; a
//!   larger one fails with the limit named and writes nothing, and a
//!   `put_many` with one oversized entry writes none of them;
//! - user SQL is confined (see [`crate::confinement`]): it cannot read,
//!   write, alter or drop Weir's reserved tables (names starting with
//!   [`RESERVED_PREFIX`]), directly or through a trigger or view, nor
//!   attach databases, vacuum, run pragmas that write or name files, or
//!   control the turn's transaction; a turn's statements stop when its
//!   stop check says so ([`ActorDb::watch`]), and what one call hands back
//!   is bounded by the result limit;
//! - timers keep the earliest deadline per reason; an alarm's turn takes
//!   its reason first, so a handler that re-arms the same reason creates a
//!   new timer, and a delivery that does not end well is retried, even
//!   when a commit inside its turn made the taking durable (see
//!   [`crate::timers`]);
//! - the incarnation counter is bumped and committed before it is returned,
//!   and a bump whose commit fails is an error: two instances of one actor
//!   never share a number.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension};

use crate::confinement::{self, Confinement};
pub use crate::replica::ReplicaStart;
use crate::replica::{Capture, Checksum, LogEntry, ReplicaError};
use crate::sql::{GuestSqlError, MAX_SQL_VALUE_BYTES, StatementResult, Value};
use crate::statement_bounds::{self, ResultBudget, ResultTooLarge, StopCheck};
use crate::statement_memory::StatementOverMemory;
use crate::{Durability, StoreError};

/// Largest entry, key and value together: large values belong in SQL tables
/// or blobs of their own, and a bound keeps one turn's memory predictable.
pub const MAX_ENTRY_BYTES: usize = 2 << 20;

/// Tables whose names start with this are Weir's; user SQL cannot touch them.
pub const RESERVED_PREFIX: &str = "_weir_";

/// Page size of actor databases. Every commit appends at least one page
/// to the WAL, and a turn usually changes a few small rows: 2 KiB pages
/// halve the bytes written (and later fsynced by checkpoints) per turn
/// against SQLite's 4 KiB, which took a hot actor's p99 from 5.1 to 4.2 ms,
/// while large values and tables keep a reasonable fan-out.
pub const PAGE_BYTES: u32 = 2048;

/// Commits in the WAL past which a hibernating actor is checkpointed, so
/// that its next wake does not replay a long log; below it, closing
/// without a checkpoint keeps hibernation free of fsyncs.
pub const CHECKPOINT_ON_CLOSE_COMMITS: u32 = 64;

/// Prepared statements kept per actor connection: Weir's own dozen, the
/// list variants and a few of the guest's.
const STATEMENT_CACHE: usize = 64;

/// Page cache of one actor connection, in KiB (SQLite's default is 2 MiB):
/// thousands of actors may be live at once, and an actor's working set is
/// usually a few pages; larger scans read through the OS cache.
pub const CACHE_KIB: i64 = 512;

/// What one storage call hands back to the guest, at most, unless the
/// runtime sets its own bound ([`ActorDb::set_max_result_bytes`]).
pub const DEFAULT_MAX_RESULT_BYTES: usize = 16 << 20;

/// Process ids of an incarnation start at incarnation × this stride.
pub const PID_STRIDE: u64 = 1_000_000;

pub use crate::entries::ListOptions;
pub use crate::journal::JournalRow;
pub use crate::timers::DueTimer;

/// Version of [`SCHEMA`], kept in the database's `user_version`: a database of an
/// older version gets the tables it lacks at its next open (version 2 added
/// `_weir_journal`, version 3 `_weir_deliveries`, version 4
/// `_weir_sockets`). A build that knows an
/// older version opens a newer database all the same: it only adds what it
/// lacks, so nodes of two builds share one history.
const SCHEMA_VERSION: i64 = 4;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS _weir_kv (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS _weir_timers (reason TEXT PRIMARY KEY, at_ms INTEGER NOT NULL, attempt INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS _weir_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS _weir_journal (pid INTEGER PRIMARY KEY, spec TEXT NOT NULL, attempt INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS _weir_deliveries (reason TEXT PRIMARY KEY, at_ms INTEGER NOT NULL, attempt INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS _weir_sockets (id INTEGER PRIMARY KEY);
";

/// Why an actor storage call failed.
#[derive(Debug, thiserror::Error)]
pub enum ActorStoreError {
    #[error("entry `{key}` is {size} bytes with its key; the limit is {MAX_ENTRY_BYTES} bytes")]
    EntryTooLarge { key: String, size: usize },
    #[error("statement refused: {0}")]
    Refused(String),
    /// Says its cause in its own words (so it hands on no source).
    #[error("refused: {0}")]
    TooLarge(ResultTooLarge),
    #[error("refused: {0}")]
    OverMemory(StatementOverMemory),
    #[error("interrupted: the turn's deadline passed")]
    Stopped,
    #[error(transparent)]
    Replica(#[from] ReplicaError),
    #[error("the replica has commits not yet taken for shipping; it cannot be checkpointed")]
    Untaken,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<ResultTooLarge> for ActorStoreError {
    fn from(e: ResultTooLarge) -> Self {
        ActorStoreError::TooLarge(e)
    }
}

impl From<rusqlite::Error> for ActorStoreError {
    fn from(e: rusqlite::Error) -> Self {
        ActorStoreError::Store(StoreError::from(e))
    }
}

/// The open database of one actor.
pub struct ActorDb {
    pub(crate) conn: Connection,
    /// The authorizer: Weir's statements, or the guest's under its rules.
    confinement: Confinement,
    pub(crate) in_turn: bool,
    /// Commits since the WAL was last checkpointed.
    pub(crate) commits: u32,
    pub(crate) max_result_bytes: usize,
    /// A replica's capture of its commits (cluster mode): SQLite never
    /// checkpoints it on its own.
    capture: Option<Capture>,
    /// The database's page size, in bytes.
    pub(crate) page_bytes: u64,
    /// Whether the launch journal has rows, as last learned (none: ask
    /// the table): a replica mirrors it after every commit it ships.
    pub(crate) journaled: Option<bool>,
}

fn guest_error(e: GuestSqlError) -> ActorStoreError {
    match e {
        GuestSqlError::Refused(why) => ActorStoreError::Refused(why),
        GuestSqlError::Stopped => ActorStoreError::Stopped,
        GuestSqlError::TooLarge(e) => ActorStoreError::TooLarge(e),
        GuestSqlError::OverMemory(e) => ActorStoreError::OverMemory(e),
        GuestSqlError::Sqlite(e) => e.into(),
    }
}

impl ActorDb {
    /// Opens (creating if needed) an actor's database.
    ///
    /// The connection holds the database exclusively until it is dropped:
    /// an actor has one running turn and one connection, and taking and
    /// releasing SQLite's file locks on every turn was a tenth of a hot
    /// actor's cost. Operators read an actor through its open connection
    /// (between turns), or open it themselves while it is hibernated.
    pub fn open(path: &Path, durability: Durability) -> Result<ActorDb, ActorStoreError> {
        ActorDb::open_with(path, durability, None)
    }

    /// Opens an actor's database as a replica: every commit is captured
    /// for shipping ([`ActorDb::take_log`]), and the WAL is checkpointed
    /// only when asked, after everything in it was taken.
    pub fn open_replica(
        path: &Path,
        durability: Durability,
        start: ReplicaStart,
    ) -> Result<ActorDb, ActorStoreError> {
        ActorDb::open_with(path, durability, Some(start))
    }

    fn open_with(
        path: &Path,
        durability: Durability,
        replica: Option<ReplicaStart>,
    ) -> Result<ActorDb, ActorStoreError> {
        let conn = crate::connect_with(
            path,
            durability,
            crate::Tuning {
                exclusive: true,
                page_size: Some(PAGE_BYTES),
            },
        )?;
        // Closing (hibernation) does not checkpoint: the WAL stays, so the
        // close neither fsyncs nor deletes it, and the next wake neither
        // creates it again nor pays for the first write into a new file.
        // Committed frames are as durable in the WAL as after a checkpoint.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )?;
        let capture = match replica {
            None => None,
            Some(start) => Some(crate::replica::attach(&conn, path, start)?),
        };
        // The schema is created once; a wake only checks its version.
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version != SCHEMA_VERSION {
            // One transaction: one commit (one log entry for a replica).
            conn.execute_batch(&format!(
                "BEGIN; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            ))?;
        }
        // Foreign keys are enforced, as users of a relational store expect
        // (user SQL cannot change pragmas). A deferred key still violated
        // at the turn's end makes its commit fail, and the turn with it.
        conn.execute_batch("PRAGMA foreign_keys = ON")?;
        // Weir's own statements plus the list variants stay prepared.
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        conn.pragma_update(None, "cache_size", -CACHE_KIB)?;
        confinement::harden(&conn, MAX_SQL_VALUE_BYTES)?;
        // SQLite checkpoints the WAL itself every 1,000 pages (its default,
        // kept: a longer WAL makes each checkpoint's fsync longer); the file
        // is cut back to `WAL_KEEP_BYTES` afterwards (`crate::connect_with`).
        let confinement = Confinement::install(&conn, Some(RESERVED_PREFIX));
        // A database made before `PAGE_BYTES` keeps its own page size.
        let page_bytes: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
        Ok(ActorDb {
            page_bytes: page_bytes.max(1) as u64,
            conn,
            confinement,
            in_turn: false,
            commits: 0,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            capture,
            journaled: None,
        })
    }

    /// True when the database is a replica.
    pub fn is_replica(&self) -> bool {
        self.capture.is_some()
    }

    /// A replica's commits since the last call, as log entries in order
    /// (none for a database that is not a replica).
    pub fn take_log(&mut self) -> Result<Vec<LogEntry>, ActorStoreError> {
        match &mut self.capture {
            Some(capture) => Ok(capture.take()?),
            None => Ok(Vec::new()),
        }
    }

    /// A replica's last captured commit and the checksum after it.
    pub fn replica_head(&self) -> Option<(u64, Checksum)> {
        self.capture.as_ref().map(|c| (c.head(), c.checksum()))
    }

    /// A snapshot of the replica at its last captured commit (its WAL is
    /// checkpointed into the file first): `(head, LTX)`. Refused while
    /// commits are not yet taken, or outside a replica.
    pub fn snapshot(&mut self) -> Result<Option<(u64, Vec<u8>)>, ActorStoreError> {
        if self.in_turn {
            return Ok(None);
        }
        let Some(capture) = &mut self.capture else {
            return Ok(None);
        };
        match crate::replica::snapshot(&self.conn, capture)? {
            Some(snapshot) => Ok(Some(snapshot)),
            None => Err(ActorStoreError::Untaken),
        }
    }

    /// Frames a replica's WAL has grown to since its last checkpoint.
    pub fn wal_frames(&self) -> u64 {
        self.capture.as_ref().map_or(0, |c| c.wal_frames())
    }

    /// Bounds the actor's database file at `max_bytes`
    /// (`max_database_bytes`, `bound_size`).
    pub fn set_max_bytes(&mut self, max_bytes: u64) -> Result<(), ActorStoreError> {
        Ok(crate::bound_size(&self.conn, max_bytes)?)
    }

    /// Bounds what one call hands back to the guest (`max_sql_result_bytes`).
    pub fn set_max_result_bytes(&mut self, bytes: usize) {
        self.max_result_bytes = bytes;
    }

    /// Stops every statement run from now on when `stop` says so (the
    /// turn's deadline or abandonment); `None` removes the check, before
    /// the turn's own commit or rollback.
    pub fn watch(&self, stop: Option<StopCheck>) {
        statement_bounds::watch(&self.conn, stop);
    }

    /// The persisted incarnation counter (0 before the first instance).
    pub fn incarnation(&self) -> Result<u64, ActorStoreError> {
        let n: Option<i64> = self
            .conn
            .prepare_cached("SELECT value FROM _weir_meta WHERE name = 'incarnation'")?
            .query_row([], |r| r.get(0))
            .optional()?;
        Ok(n.unwrap_or(0).max(0) as u64)
    }

    /// Key-value entries stored.
    pub fn entry_count(&self) -> Result<u64, ActorStoreError> {
        let n: i64 = self
            .conn
            .query_row("SELECT count(*) FROM _weir_kv", [], |r| r.get(0))?;
        Ok(n.max(0) as u64)
    }

    /// Adopts the persisted incarnation counter, bumps it and makes the bump
    /// durable before returning the new number.
    ///
    /// Every fresh generation of an actor runs this (every
    /// `retirement_admission_limit` turns, and at every wake), so both
    /// statements are prepared once per connection. The bump is its own
    /// statement, run to its end, because that end is where SQLite commits
    /// it: a `RETURNING` read stops before it, and a commit that then fails
    /// (a full disk, an I/O error) would roll the bump back unseen while
    /// the caller ran with the new number.
    pub fn adopt_incarnation(&mut self) -> Result<u64, ActorStoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO _weir_meta (name, value) VALUES ('incarnation', 1)
                 ON CONFLICT(name) DO UPDATE SET value = value + 1",
            )?
            .execute([])?;
        self.commits += 1;
        self.incarnation()
    }

    /// Commits since this connection last checkpointed by hand (SQLite's
    /// automatic checkpoints are not counted: this over-counts, which only
    /// makes a checkpoint at hibernation more likely).
    pub fn commits_since_checkpoint(&self) -> u32 {
        self.commits
    }

    /// Copies the WAL into the database file (between turns). The actor
    /// holds its database alone, so the checkpoint completes and the WAL
    /// starts over.
    ///
    /// A replica's WAL is checkpointed only when every commit in it was
    /// taken, so that its capture starts over from a file that holds the
    /// whole state; here (as the actor closes) its WAL is also truncated.
    pub fn checkpoint(&mut self) -> Result<(), ActorStoreError> {
        self.checkpoint_with(crate::replica::Fold::Closing)
    }

    /// [`ActorDb::checkpoint`] of a replica in use: its WAL starts over in
    /// the same file.
    pub fn checkpoint_live(&mut self) -> Result<(), ActorStoreError> {
        self.checkpoint_with(crate::replica::Fold::Live)
    }

    fn checkpoint_with(&mut self, fold: crate::replica::Fold) -> Result<(), ActorStoreError> {
        if self.in_turn {
            return Ok(());
        }
        match &mut self.capture {
            None => {
                self.conn
                    .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
            }
            Some(capture) => {
                if !crate::replica::checkpoint(&self.conn, capture, fold)? {
                    return Err(ActorStoreError::Untaken);
                }
            }
        }
        self.commits = 0;
        Ok(())
    }

    /// Runs one user statement inside the turn.
    pub fn exec(
        &mut self,
        sql: &str,
        params: &[Value],
    ) -> Result<StatementResult, ActorStoreError> {
        let mut budget = ResultBudget::new(self.max_result_bytes);
        crate::sql::run_guest_statement(
            &self.conn,
            &self.confinement,
            sql,
            params,
            &mut budget,
            false,
        )
        .map_err(guest_error)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh actor database under this test run's scratch tree.
    pub(crate) fn open(name: &str) -> (ActorDb, std::path::PathBuf) {
        let dir = weir_scratch::dir(&format!("actor-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("actor.sqlite3");
        (ActorDb::open(&path, Durability::Process).unwrap(), path)
    }

    #[test]
    fn user_sql_cannot_touch_reserved_tables() {
        let (mut db, _) = open("reserved");
        db.exec(
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)",
            &[],
        )
        .unwrap();
        let r = db
            .exec(
                "INSERT INTO users (name) VALUES (?1)",
                &[Value::Text("ada".into())],
            )
            .unwrap();
        assert_eq!(r.rows_written, 1);
        for sql in [
            "SELECT * FROM _weir_kv",
            "DELETE FROM _weir_timers",
            "DROP TABLE _weir_meta",
            "UPDATE _WEIR_KV SET value = x''",
            "CREATE TABLE _weir_mine (x)",
            "PRAGMA writable_schema = 1",
            "ATTACH DATABASE ':memory:' AS other",
        ] {
            assert!(
                matches!(db.exec(sql, &[]), Err(ActorStoreError::Refused(_))),
                "{sql}"
            );
        }
        // Nor indirectly, through a view or a trigger of the user's own:
        // SQLite lets both be created (it does not ask about their bodies
        // then), and refuses every statement that would run them.
        db.exec("CREATE VIEW peek AS SELECT * FROM _weir_kv", &[])
            .expect("creating the view is allowed");
        match db.exec("SELECT * FROM peek", &[]) {
            Err(ActorStoreError::Refused(why)) => assert!(why.contains("_weir_kv"), "{why}"),
            other => panic!("reading through the view: {other:?}"),
        }
        db.exec(
            "CREATE TRIGGER wipe AFTER INSERT ON users BEGIN DELETE FROM _weir_kv; END",
            &[],
        )
        .expect("creating the trigger is allowed");
        db.put("kept", b"1").unwrap();
        match db.exec("INSERT INTO users (name) VALUES ('x')", &[]) {
            Err(ActorStoreError::Refused(why)) => assert!(why.contains("_weir_kv"), "{why}"),
            other => panic!("firing the trigger: {other:?}"),
        }
        assert_eq!(db.get("kept").unwrap(), Some(b"1".to_vec()));
        db.exec("DROP TRIGGER wipe", &[]).unwrap();
        // A temporary trigger would run inside Weir's own statements: none
        // may be created, on any table.
        for sql in [
            "CREATE TEMP TRIGGER t1 AFTER INSERT ON _weir_kv BEGIN SELECT 1; END",
            "CREATE TEMP TRIGGER t2 AFTER INSERT ON users BEGIN SELECT 1; END",
            "CREATE TEMP VIEW v AS SELECT 1",
            "COMMIT",
            "ROLLBACK",
            "SAVEPOINT s",
            "RELEASE s",
        ] {
            match db.exec(sql, &[]) {
                Err(ActorStoreError::Refused(_)) => {}
                other => panic!("{sql}: {other:?}"),
            }
        }
        // Weir's own calls still work after a refusal.
        db.put("k", b"v").unwrap();
        assert_eq!(db.get("k").unwrap(), Some(b"v".to_vec()));
    }

    #[test]
    fn vacuum_into_writes_no_file_and_the_turn_stays_one_transaction() {
        let (mut db, path) = open("vacuum");
        let target = path.with_file_name("stolen.sqlite3");
        db.begin_turn().unwrap();
        db.put("a", b"1").unwrap();
        for sql in [
            format!("VACUUM INTO '{}'", target.display()),
            "VACUUM".to_string(),
        ] {
            match db.exec(&sql, &[]) {
                Err(ActorStoreError::Refused(why)) => {
                    assert!(why.contains("VACUUM") || why.contains("ATTACH"), "{why}")
                }
                other => panic!("{sql}: {other:?}"),
            }
        }
        assert!(!target.exists());
        db.rollback_turn().unwrap();
        assert_eq!(db.get("a").unwrap(), None, "still one transaction");
    }

    #[test]
    fn results_are_bounded_and_watched_statements_stop() {
        let (mut db, _) = open("bounds");
        db.set_max_result_bytes(4096);
        for i in 0..10 {
            db.put(&format!("k{i}"), &[0u8; 1000]).unwrap();
        }
        assert!(matches!(
            db.list(&ListOptions::default()),
            Err(ActorStoreError::TooLarge(_))
        ));
        let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
        assert!(matches!(
            db.get_many(&keys),
            Err(ActorStoreError::TooLarge(_))
        ));
        assert!(matches!(
            db.exec("SELECT zeroblob(5000)", &[]),
            Err(ActorStoreError::TooLarge(_))
        ));
        db.watch(Some(std::sync::Arc::new(|| true)));
        assert!(matches!(
            db.exec(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c",
                &[]
            ),
            Err(ActorStoreError::Stopped)
        ));
        db.watch(None);
        assert_eq!(
            db.list(&ListOptions {
                limit: Some(2),
                ..Default::default()
            })
            .unwrap()
            .len(),
            2
        );
    }

    #[test]
    fn incarnations_are_bumped_durably_and_never_shared() {
        let (mut db, path) = open("incarnation");
        assert_eq!(db.adopt_incarnation().unwrap(), 1);
        assert_eq!(db.adopt_incarnation().unwrap(), 2);
        drop(db);
        let mut db = ActorDb::open(&path, Durability::Process).unwrap();
        let n = db.adopt_incarnation().unwrap();
        assert_eq!(n, 3);
        assert_eq!(n * PID_STRIDE, 3_000_000);
    }

    #[test]
    fn a_replica_ships_every_commit_and_resumes_from_its_history() {
        let (_, path) = open("replica-src");
        std::fs::remove_file(&path).unwrap();
        let mut db =
            ActorDb::open_replica(&path, Durability::Process, ReplicaStart::Fresh).unwrap();
        assert_eq!(db.adopt_incarnation().unwrap(), 1);
        db.begin_turn().unwrap();
        db.put("a", b"1").unwrap();
        db.schedule("tick", 42).unwrap();
        db.commit_turn().unwrap();
        // The schema, the incarnation and the turn: three commits.
        let log = db.take_log().unwrap();
        assert_eq!(log.iter().map(|e| e.head).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(db.take_log().unwrap().is_empty());
        // Autocommit writes outside a turn are commits too.
        db.cancel("tick").unwrap();
        let more = db.take_log().unwrap();
        assert_eq!(more.len(), 1);
        assert_eq!(db.replica_head().unwrap().0, 4);

        let copy = path.with_file_name("replica-copy.sqlite3");
        let restored = crate::replica::restore::restore(
            &copy,
            PAGE_BYTES,
            None,
            log.iter()
                .chain(&more)
                .map(|e| e.ltx().unwrap())
                .collect::<Vec<_>>()
                .iter()
                .map(Vec::as_slice),
        )
        .unwrap();
        assert_eq!(
            (restored.head, restored.checksum),
            db.replica_head().unwrap()
        );
        let mut resumed = ActorDb::open_replica(
            &copy,
            Durability::Process,
            ReplicaStart::Resume {
                head: restored.head,
                checksum: restored.checksum,
            },
        )
        .unwrap();
        assert_eq!(resumed.get("a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(resumed.next_deadline().unwrap(), None);
        assert_eq!(resumed.adopt_incarnation().unwrap(), 2);
        let next = resumed.take_log().unwrap();
        assert_eq!(next[0].head, 5);

        // A snapshot checkpoints first and carries the running checksum;
        // a commit not yet taken refuses it.
        db.put("b", b"2").unwrap();
        assert!(matches!(db.snapshot(), Err(ActorStoreError::Untaken)));
        db.take_log().unwrap();
        let (head, snapshot) = db.snapshot().unwrap().unwrap();
        assert_eq!(head, 5);
        let from_snapshot = path.with_file_name("replica-snap.sqlite3");
        let restored = crate::replica::restore::restore(
            &from_snapshot,
            PAGE_BYTES,
            Some(&snapshot),
            std::iter::empty(),
        )
        .unwrap();
        assert_eq!(
            (restored.head, restored.checksum),
            db.replica_head().unwrap()
        );
    }
}
