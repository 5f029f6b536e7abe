//! `weir:sql/batch` for guests: batches of statements in one transaction
//! against the app's declared databases.
//!
//! Invariants owned here:
//! - a batch is an operation of the event's scope, refused (`refused`)
//!   when the scope is full or closed, and checked against the batch limits
//!   before the database is touched;
//! - once started a batch is not abortable: it runs to commit or rollback
//!   on a blocking thread, holding its operation until it ends. An event
//!   that ends meanwhile waits for it within `cleanup_timeout_ms`; if it has
//!   not ended by then, the event reports `storage_cleanup_unconfirmed`
//!   (the batch's outcome is unknown to the client) and the lane stays
//!   quarantined until it ends. Nothing is retried or rolled back by Weir.

use std::sync::Arc;

use wasmtime::component::{HasData, Linker};
use weir_store::sql::{self as store, BatchError, SqlDatabases};

use crate::scope::EventScope;

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
    pub scope: Option<&'a Arc<EventScope>>,
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
        BatchError::OutcomeUnknown(m) => batch::Error::OutcomeUnknown(m),
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
        let db = match self.databases.get(&database) {
            Ok(db) => db,
            Err(e) => return Ok(Err(to_guest_error(e))),
        };
        let op = match self.scope.map(|s| s.register()) {
            Some(Ok(op)) => op,
            Some(Err(e)) => return Ok(Err(batch::Error::Refused(e.to_string()))),
            None => return Ok(Err(batch::Error::Refused("event_scope_closed".into()))),
        };
        let ran = tokio::task::spawn_blocking(move || {
            // The operation ends when the batch has committed or rolled
            // back, whatever happened to the event meanwhile.
            let _op = op;
            db.run(&statements)
        })
        .await;
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
            Err(join) => Err(batch::Error::OutcomeUnknown(format!(
                "the batch's thread failed: {join}"
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
