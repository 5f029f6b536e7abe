//! SQL batches: a list of statements run in one transaction against a named
//! database (the seed's D1-style binding).
//!
//! Invariants owned here:
//! - a batch is 1..=[`MAX_BATCH_STATEMENTS`] statements of at most
//!   [`MAX_STATEMENT_PARAMS`] parameters each, checked before the database is
//!   touched;
//! - every statement of a batch takes effect or none does: the batch runs
//!   in one `BEGIN IMMEDIATE` transaction, a failing statement rolls it back
//!   and is named by its index with SQLite's message;
//! - a batch that returned `Ok` is committed (WAL; see [`crate::Durability`]);
//! - every statement is the guest's and is confined (see
//!   [`crate::confinement`]): it touches only this database, stops when its
//!   stop check says so, and hands back at most `max_result_bytes` over the
//!   whole batch.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

use crate::confinement::{self, Confinement};
pub(crate) use crate::guest_statement::{GuestSqlError, run_guest_statement};
pub use crate::guest_statement::{StatementResult, Value};
use crate::statement_bounds::{self, ResultBudget, StopCheck};
use crate::{Durability, StoreError};

/// Largest string or blob a guest's SQL may build or store (SQLite's
/// `SQLITE_LIMIT_LENGTH`): the default bound on what a batch may return,
/// so one value always fits in a result, and a bound on what one
/// `zeroblob` or `printf` can make SQLite allocate.
pub const MAX_SQL_VALUE_BYTES: usize = 16 << 20;

/// Statements in one batch, at most: what D1 allows, and enough for any
/// one unit of work an event should do atomically.
pub const MAX_BATCH_STATEMENTS: usize = 128;

/// Parameters of one statement, at most (D1's bound).
pub const MAX_STATEMENT_PARAMS: usize = 100;

/// One statement of a batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Statement {
    pub sql: String,
    pub params: Vec<Value>,
}

/// Why a batch did not run, or did not commit.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("no database named `{0}` is declared")]
    NoSuchDatabase(String),
    #[error("a batch holds 1 to {MAX_BATCH_STATEMENTS} statements, not {0}")]
    BatchSize(usize),
    #[error("statement {index} has {count} parameters; the limit is {MAX_STATEMENT_PARAMS}")]
    TooManyParams { index: usize, count: usize },
    #[error("statement {index} failed: {message}")]
    Statement { index: usize, message: String },
    #[error("statement {index} refused: {message}")]
    Refused { index: usize, message: String },
    #[error("the batch was stopped: {0}")]
    Stopped(String),
    #[error("the batch's outcome is unknown: {0}")]
    OutcomeUnknown(String),
    /// The batch did not run (cluster mode: its database's owner could not
    /// take it); it may be sent again as it is.
    #[error("the batch did not run: {0}")]
    NotRun(String),
}

/// One named SQL database.
pub struct SqlDatabase {
    conn: Mutex<Connection>,
    confinement: Confinement,
    /// Read from the connection when it opened (guests cannot change it);
    /// kept so that `/status` never waits for a running batch.
    synchronous: &'static str,
    /// A replica's capture of its commits (cluster mode).
    capture: Option<crate::replica::SharedCapture>,
}

impl SqlDatabase {
    fn open(path: &Path, durability: Durability) -> Result<Self, StoreError> {
        SqlDatabase::open_with(path, durability, None)
    }

    /// Opens a database as a replica starting at `start`: every commit is
    /// captured for shipping ([`SqlDatabase::capture`]).
    pub fn open_replica(
        path: &Path,
        durability: Durability,
        start: crate::replica::ReplicaStart,
    ) -> Result<Self, StoreError> {
        SqlDatabase::open_with(path, durability, Some(start))
    }

    fn open_with(
        path: &Path,
        durability: Durability,
        start: Option<crate::replica::ReplicaStart>,
    ) -> Result<Self, StoreError> {
        let conn = crate::connect(path, durability)?;
        let capture = match start {
            Some(start) => Some(crate::replica::SharedCapture::new(crate::replica::attach(
                &conn, path, start,
            )?)),
            None => None,
        };
        confinement::harden(&conn, MAX_SQL_VALUE_BYTES)?;
        let confinement = Confinement::install(&conn, None);
        Ok(SqlDatabase {
            synchronous: crate::synchronous_mode(&conn)?,
            conn: Mutex::new(conn),
            confinement,
            capture,
        })
    }

    /// Bounds the database's file at `max_bytes` (`bound_size`).
    pub fn set_max_bytes(&self, max_bytes: u64) -> Result<(), StoreError> {
        crate::bound_size(
            &self.conn.lock().unwrap_or_else(|p| p.into_inner()),
            max_bytes,
        )
    }

    /// A replica's capture (cluster mode): what ships its commits and
    /// takes its snapshots.
    pub fn capture(&self) -> Option<&crate::replica::SharedCapture> {
        self.capture.as_ref()
    }

    /// Checkpoints a replica's WAL into its file (its caller knows it is
    /// all shipped); false when commits were not yet taken.
    pub fn checkpoint(&self) -> Result<bool, crate::replica::ReplicaError> {
        match &self.capture {
            Some(capture) => {
                capture.checkpoint(&self.conn.lock().unwrap_or_else(|p| p.into_inner()))
            }
            None => Ok(false),
        }
    }

    /// A replica's snapshot at its last taken commit; `None` outside a
    /// replica or while commits are not yet taken.
    pub fn snapshot(&self) -> Result<Option<(u64, Vec<u8>)>, crate::replica::ReplicaError> {
        match &self.capture {
            Some(capture) => capture.snapshot(&self.conn.lock().unwrap_or_else(|p| p.into_inner())),
            None => Ok(None),
        }
    }

    /// Runs a batch in one transaction, stopping it when `stop` says so and
    /// refusing results over `max_result_bytes` in all. Blocks: call it
    /// off the async threads.
    pub fn run(
        &self,
        statements: &[Statement],
        stop: StopCheck,
        max_result_bytes: usize,
    ) -> Result<Vec<StatementResult>, BatchError> {
        check(statements)?;
        // A batch whose event is already over never starts.
        if stop() {
            return Err(BatchError::Stopped(
                "the event ended before the batch began".into(),
            ));
        }
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        statement_bounds::watch(&conn, Some(stop.clone()));
        let ran = self.run_in_transaction(&mut conn, statements, &stop, max_result_bytes);
        statement_bounds::watch(&conn, None);
        ran
    }

    fn run_in_transaction(
        &self,
        conn: &mut Connection,
        statements: &[Statement],
        stop: &StopCheck,
        max_result_bytes: usize,
    ) -> Result<Vec<StatementResult>, BatchError> {
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| BatchError::Statement {
                index: 0,
                message: format!("cannot begin: {e}"),
            })?;
        let mut budget = ResultBudget::new(max_result_bytes);
        let mut results = Vec::with_capacity(statements.len());
        for (index, statement) in statements.iter().enumerate() {
            // A short statement never reaches the progress handler: the
            // batch also checks between statements (and before its
            // commit), so one that waited out its event rolls back.
            if stop() {
                return Err(BatchError::Stopped(format!(
                    "the event ended before statement {index}"
                )));
            }
            let result = run_guest_statement(
                &tx,
                &self.confinement,
                &statement.sql,
                &statement.params,
                &mut budget,
                true,
            )
            .map_err(|e| match e {
                GuestSqlError::Refused(message) => BatchError::Refused { index, message },
                GuestSqlError::TooLarge(e) => BatchError::Refused {
                    index,
                    message: e.to_string(),
                },
                GuestSqlError::OverMemory(e) => BatchError::Refused {
                    index,
                    message: e.to_string(),
                },
                GuestSqlError::Stopped => BatchError::Stopped(format!(
                    "statement {index} was interrupted at the event's deadline"
                )),
                GuestSqlError::Sqlite(e) => BatchError::Statement {
                    index,
                    message: crate::sqlite_message(&e),
                },
            })?;
            results.push(result);
        }
        // A failed commit leaves SQLite's state certain (rolled back) for
        // ordinary errors; an I/O error at commit may not.
        if stop() {
            return Err(BatchError::Stopped(
                "the event ended before the commit".into(),
            ));
        }
        tx.commit().map_err(|e| match e {
            rusqlite::Error::SqliteFailure(f, _)
                if f.code == rusqlite::ErrorCode::SystemIoFailure =>
            {
                BatchError::OutcomeUnknown(e.to_string())
            }
            other => BatchError::Statement {
                index: statements.len() - 1,
                message: format!("commit failed: {}", crate::sqlite_message(&other)),
            },
        })?;
        Ok(results)
    }
}

/// Checks a batch's shape before anything touches the database.
pub fn check(statements: &[Statement]) -> Result<(), BatchError> {
    if statements.is_empty() || statements.len() > MAX_BATCH_STATEMENTS {
        return Err(BatchError::BatchSize(statements.len()));
    }
    for (index, s) in statements.iter().enumerate() {
        if s.params.len() > MAX_STATEMENT_PARAMS {
            return Err(BatchError::TooManyParams {
                index,
                count: s.params.len(),
            });
        }
    }
    Ok(())
}

/// The declared SQL databases of one app.
#[derive(Default)]
pub struct SqlDatabases {
    databases: HashMap<String, Arc<SqlDatabase>>,
}

impl SqlDatabases {
    /// Opens (creating if needed) each declared database under `data_dir/sql`.
    pub fn open(
        data_dir: &Path,
        names: &[String],
        durability: Durability,
    ) -> Result<Self, StoreError> {
        let databases = crate::open_named(data_dir, "sql", names, |path, _| {
            SqlDatabase::open(path, durability)
        })?;
        Ok(SqlDatabases { databases })
    }

    /// Bounds every database's file at `max_bytes` (`bound_size`).
    pub fn set_max_bytes(&self, max_bytes: u64) -> Result<(), StoreError> {
        self.databases
            .values()
            .try_for_each(|d| d.set_max_bytes(max_bytes))
    }

    /// Every declared database, by name.
    pub fn describe(&self) -> Vec<crate::StoreInfo> {
        let mut out: Vec<crate::StoreInfo> = self
            .databases
            .iter()
            .map(|(name, db)| crate::StoreInfo {
                name: name.clone(),
                synchronous: db.synchronous.to_string(),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    pub fn get(&self, name: &str) -> Result<Arc<SqlDatabase>, BatchError> {
        self.databases
            .get(name)
            .cloned()
            .ok_or_else(|| BatchError::NoSuchDatabase(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a batch that nothing stops, with a 1 MiB result bound.
    trait RunTest {
        fn run_test(&self, s: &[Statement]) -> Result<Vec<StatementResult>, BatchError>;
    }

    impl RunTest for SqlDatabase {
        fn run_test(&self, s: &[Statement]) -> Result<Vec<StatementResult>, BatchError> {
            self.run(s, Arc::new(|| false), 1 << 20)
        }
    }

    fn st(sql: &str, params: Vec<Value>) -> Statement {
        Statement {
            sql: sql.into(),
            params,
        }
    }

    fn db(name: &str) -> Arc<SqlDatabase> {
        let dir = weir_scratch::dir(&format!("sql-{name}"));
        SqlDatabases::open(&dir, &["d".into()], Durability::Process)
            .unwrap()
            .get("d")
            .unwrap()
    }

    #[test]
    fn a_batch_that_would_grow_past_the_bound_is_refused_by_name_and_keeps_nothing() {
        let d = db("bound");
        d.set_max_bytes(256 << 10).unwrap();
        let err = d
            .run_test(&[
                st("CREATE TABLE t (b)", vec![]),
                st("INSERT INTO t VALUES (1)", vec![]),
                st("INSERT INTO t SELECT randomblob(20000) FROM \
                    (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100) SELECT x FROM c)", vec![]),
            ])
            .unwrap_err();
        match &err {
            BatchError::Statement { index: 2, message } => {
                assert_eq!(message, crate::DATABASE_FULL)
            }
            other => panic!("{other}"),
        }
        let r = d
            .run_test(&[st(
                "SELECT count(*) FROM sqlite_master WHERE name = 't'",
                vec![],
            )])
            .unwrap();
        assert_eq!(r[0].rows, vec![vec![Value::Integer(0)]]);
    }

    #[test]
    fn a_failing_statement_rolls_back_the_batch() {
        let d = db("rollback");
        d.run_test(&[st(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)",
            vec![],
        )])
        .unwrap();
        let err = d
            .run_test(&[
                st(
                    "INSERT INTO t (v) VALUES (?1)",
                    vec![Value::Text("a".into())],
                ),
                st("INSERT INTO t (v) VALUES (?1)", vec![Value::Null]),
            ])
            .unwrap_err();
        assert!(
            matches!(err, BatchError::Statement { index: 1, .. }),
            "{err}"
        );
        let r = d.run_test(&[st("SELECT count(*) FROM t", vec![])]).unwrap();
        assert_eq!(r[0].rows, vec![vec![Value::Integer(0)]]);
    }

    #[test]
    fn escapes_are_refused_by_index_and_results_are_bounded() {
        let d = db("confined");
        let err = d
            .run_test(&[
                st("CREATE TABLE t (a)", vec![]),
                st("ATTACH DATABASE ':memory:' AS x", vec![]),
            ])
            .unwrap_err();
        assert!(
            matches!(&err, BatchError::Refused { index: 1, message } if message.contains("ATTACH")),
            "{err}"
        );
        let r = d.run_test(&[st(
            "SELECT count(*) FROM sqlite_master WHERE name = 't'",
            vec![],
        )]);
        assert_eq!(
            r.unwrap()[0].rows,
            vec![vec![Value::Integer(0)]],
            "rolled back"
        );
        let err = d
            .run(
                &[st(
                    "SELECT zeroblob(1000) FROM (VALUES (1), (2), (3))",
                    vec![],
                )],
                Arc::new(|| false),
                2500,
            )
            .unwrap_err();
        assert!(
            matches!(&err, BatchError::Refused { index: 0, message } if message.contains("max_sql_result_bytes (2500")),
            "{err}"
        );
        let err = d
            .run(
                &[st(
                    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c",
                    vec![],
                )],
                Arc::new(|| true),
                2500,
            )
            .unwrap_err();
        assert!(matches!(err, BatchError::Stopped(_)), "{err}");
        let stop_later = {
            let at = std::time::Instant::now() + std::time::Duration::from_millis(50);
            Arc::new(move || std::time::Instant::now() >= at)
        };
        let err = d
            .run(
                &[st(
                    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c",
                    vec![],
                )],
                stop_later,
                2500,
            )
            .unwrap_err();
        assert!(
            matches!(&err, BatchError::Stopped(m) if m.contains("statement 0")),
            "{err}"
        );
        // The connection serves the next batch.
        assert_eq!(
            d.run_test(&[st("SELECT 1", vec![])]).unwrap()[0].rows_read,
            1
        );
    }

    #[test]
    fn shape_is_checked_first() {
        assert!(matches!(check(&[]), Err(BatchError::BatchSize(0))));
        let many = vec![st("SELECT 1", vec![]); 129];
        assert!(matches!(check(&many), Err(BatchError::BatchSize(129))));
        let params = vec![st("SELECT 1", vec![Value::Null; 101])];
        assert!(matches!(
            check(&params),
            Err(BatchError::TooManyParams {
                index: 0,
                count: 101
            })
        ));
    }

    #[test]
    fn types_round_trip_and_counts_are_reported() {
        let d = db("types");
        let every_type = vec![
            Value::Null,
            Value::Integer(i64::MIN),
            Value::Real(1.5),
            Value::Text("ü".into()),
            Value::Blob(vec![0, 255]),
        ];
        let r = d
            .run_test(&[
                st("CREATE TABLE t (a, b, c, d, e)", vec![]),
                st(
                    "INSERT INTO t VALUES (?1, ?2, ?3, ?4, ?5)",
                    every_type.clone(),
                ),
                st("SELECT * FROM t", vec![]),
            ])
            .unwrap();
        assert_eq!(r[1].rows_written, 1);
        assert_eq!(r[1].last_insert_id, 1);
        assert_eq!(r[2].columns, ["a", "b", "c", "d", "e"]);
        assert_eq!(r[2].rows_read, 1);
        assert_eq!(r[2].rows[0], every_type);
    }
}
