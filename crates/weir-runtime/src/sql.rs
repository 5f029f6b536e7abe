//! `weir:sql/batch` for guests: batches of statements in one transaction
//! against the app's declared databases.
//!
//! Invariants owned here:
//! - a batch is an operation of the event's scope, refused (`refused`)
//!   when the scope is full or closed, and checked against the batch limits
//!   before the database is touched;
//! - a batch runs on the SQL pool ([`crate::sql_pool`]), never on an async
//!   worker, holding its operation until it ends; its statements are
//!   confined to the database and stop at the event's deadline or at its
//!   abandonment (the scope's stop check), which rolls the batch back;
//! - an event that ends while a batch still runs (one that SQLite cannot
//!   interrupt, such as one waiting for a lock another process holds)
//!   waits for it within `cleanup_timeout_ms`; past that, the event reports
//!   `storage_cleanup_unconfirmed` (the batch's outcome is unknown to the
//!   client) and the lane stays quarantined until it ends. Nothing is
//!   retried by Weir.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker};
use weir_store::sql::{self as store, BatchError, SqlDatabases};

use crate::scope::EventScope;
use crate::sql_pool::SqlPool;

mod generated {
    wasmtime::component::bindgen!({
        path: "../../wit/weir-sql",
        world: "weir:sql/imports",
        imports: { default: async | trappable },
    });
}

use generated::weir::sql::batch;

/// What the SQL host functions see of a generation.
pub struct SqlView<'a> {
    pub databases: &'a Arc<SqlDatabases>,
    /// Where the databases are, in cluster mode.
    pub router: Option<&'a Arc<dyn crate::extension::StoreRouter>>,
    pub scope: Option<&'a Arc<EventScope>>,
    /// The generation's output gate (an actor's turn), passed before a
    /// batch (any batch may write).
    pub gate: Option<&'a Arc<dyn crate::extension::OutputGate>>,
    pub pool: &'a Arc<SqlPool>,
    pub max_result_bytes: usize,
}

fn to_store(v: batch::Value) -> store::Value {
    match v {
        batch::Value::Null => store::Value::Null,
        batch::Value::Integer(i) => store::Value::Integer(i),
        batch::Value::Real(r) => store::Value::Real(r),
        batch::Value::Text(t) => store::Value::Text(t),
        batch::Value::Blob(b) => store::Value::Blob(b),
    }
}

fn to_guest(v: store::Value) -> batch::Value {
    match v {
        store::Value::Null => batch::Value::Null,
        store::Value::Integer(i) => batch::Value::Integer(i),
        store::Value::Real(r) => batch::Value::Real(r),
        store::Value::Text(t) => batch::Value::Text(t),
        store::Value::Blob(b) => batch::Value::Blob(b),
    }
}

fn to_guest_error(e: BatchError) -> batch::Error {
    match e {
        BatchError::NoSuchDatabase(name) => batch::Error::NoSuchDatabase(name),
        BatchError::BatchSize(n) => batch::Error::BatchSize(n as u32),
        BatchError::TooManyParams { index, count } => {
            batch::Error::TooManyParams(batch::StatementError {
                index: index as u32,
                message: format!(
                    "{count} parameters; the limit is {}",
                    store::MAX_STATEMENT_PARAMS
                ),
            })
        }
        BatchError::Statement { index, message } => {
            batch::Error::StatementFailed(batch::StatementError {
                index: index as u32,
                message,
            })
        }
        BatchError::Refused { index, message } => {
            batch::Error::Refused(format!("statement {index}: {message}"))
        }
        BatchError::Stopped(m) => batch::Error::StatementFailed(batch::StatementError {
            index: 0,
            message: m,
        }),
        BatchError::OutcomeUnknown(m) => batch::Error::OutcomeUnknown(m),
        BatchError::NotRun(m) => batch::Error::Refused(m),
    }
}

impl batch::Host for SqlView<'_> {
    async fn run(
        &mut self,
        database: String,
        statements: Vec<batch::Statement>,
    ) -> wasmtime::Result<Result<Vec<batch::StatementResult>, batch::Error>> {
        let statements: Vec<store::Statement> = statements
            .into_iter()
            .map(|s| store::Statement {
                sql: s.sql,
                params: s.params.into_iter().map(to_store).collect(),
            })
            .collect();
        // Refused before anything touches the database.
        if let Err(e) = store::check(&statements) {
            return Ok(Err(to_guest_error(e)));
        }
        let db = match self.router {
            Some(router) if router.has_database(&database) => None,
            Some(_) => return Ok(Err(batch::Error::NoSuchDatabase(database))),
            None => match self.databases.get(&database) {
                Ok(db) => Some(db),
                Err(e) => return Ok(Err(to_guest_error(e))),
            },
        };
        let (op, stop, deadline) = match self.scope {
            Some(scope) => match scope.register() {
                Ok(op) => (op, scope.stop_check(), scope.deadline()),
                Err(e) => return Ok(Err(batch::Error::Refused(e.to_string()))),
            },
            None => return Ok(Err(batch::Error::Refused("event_scope_closed".into()))),
        };
        // A batch waits for the writes its actor's turn made before it.
        if let Err(why) = crate::extension::pass_gate(self.gate).await {
            return Ok(Err(batch::Error::Refused(format!(
                "output_gate_refused: {why}"
            ))));
        }
        let max_result_bytes = self.max_result_bytes;
        let ran = match (db, self.router) {
            (Some(db), _) => {
                self.pool
                    .run(move || {
                        // The operation ends when the batch has committed or
                        // rolled back, whatever happened to the event
                        // meanwhile.
                        let _op = op;
                        db.run(&statements, stop, max_result_bytes)
                    })
                    .await
            }
            (None, Some(router)) => {
                let call = crate::extension::StoreCall {
                    stop: Some(stop),
                    deadline,
                    max_result_bytes,
                };
                let ran = router.sql(database, statements, call).await;
                drop(op);
                Ok(ran)
            }
            (None, None) => return Ok(Err(batch::Error::NoSuchDatabase(database))),
        };
        Ok(match ran {
            Ok(Ok(results)) => Ok(results
                .into_iter()
                .map(|r| batch::StatementResult {
                    columns: r.columns,
                    rows: r
                        .rows
                        .into_iter()
                        .map(|row| row.into_iter().map(to_guest).collect())
                        .collect(),
                    rows_read: r.rows_read,
                    rows_written: r.rows_written,
                    last_insert_id: r.last_insert_id,
                })
                .collect()),
            Ok(Err(e)) => Err(to_guest_error(e)),
            Err(failed) => Err(batch::Error::OutcomeUnknown(format!(
                "the batch's thread failed: {failed}"
            ))),
        })
    }
}

struct HasSql;

impl HasData for HasSql {
    type Data<'a> = SqlView<'a>;
}

/// Adds `weir:sql/batch` to a linker.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> SqlView<'_>,
) -> wasmtime::Result<()> {
    batch::add_to_linker::<_, HasSql>(linker, view)
}
