//! One guest statement, on any guest-facing connection (a named SQL
//! database's batch, an actor's turn): the one way such a statement runs.
//!
//! Invariants owned here, for every guest statement:
//! - it is prepared and run as the guest's, under the connection's
//!   confinement ([`crate::confinement`]), and a refusal names what was
//!   refused;
//! - what SQLite allocates for it is bounded from its preparing to its
//!   last row ([`crate::statement_memory`]), and a statement over the
//!   bound is told apart from the process running out of memory;
//! - what it hands back is counted against the caller's budget as it is
//!   read ([`crate::statement_bounds::ResultBudget`]).

use rusqlite::Connection;
use rusqlite::ToSql;
use rusqlite::types::{ToSqlOutput, Value as SqlValue, ValueRef};

use crate::confinement::Confinement;
use crate::statement_bounds::{self, ResultBudget};
use crate::statement_memory::{Armed, StatementOverMemory};

/// A parameter or column value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Value::Null => ToSqlOutput::Owned(SqlValue::Null),
            Value::Integer(i) => ToSqlOutput::Owned(SqlValue::Integer(*i)),
            Value::Real(r) => ToSqlOutput::Owned(SqlValue::Real(*r)),
            Value::Text(t) => ToSqlOutput::Borrowed(ValueRef::Text(t.as_bytes())),
            Value::Blob(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
        })
    }
}

impl From<ValueRef<'_>> for Value {
    fn from(v: ValueRef<'_>) -> Self {
        match v {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(i) => Value::Integer(i),
            ValueRef::Real(r) => Value::Real(r),
            ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
            ValueRef::Blob(b) => Value::Blob(b.to_vec()),
        }
    }
}

/// What one statement did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatementResult {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
    pub rows_read: u64,
    pub rows_written: u64,
    pub last_insert_id: i64,
}

/// Why a guest's statement failed: refused by the confinement, stopped by
/// its stop check, over the result bound or the memory bound, or SQLite's
/// own error.
pub(crate) enum GuestSqlError {
    Refused(String),
    Stopped,
    TooLarge(statement_bounds::ResultTooLarge),
    OverMemory(StatementOverMemory),
    Sqlite(rusqlite::Error),
}

/// Runs one guest statement on `conn` (as the guest's, under
/// `confinement`), reading its rows against `budget`.
pub(crate) fn run_guest_statement(
    conn: &Connection,
    confinement: &Confinement,
    sql: &str,
    params: &[Value],
    budget: &mut ResultBudget,
    cached: bool,
) -> Result<StatementResult, GuestSqlError> {
    // From its preparing to its last row, on this thread.
    let armed = Armed::arm();
    let classify = |e: rusqlite::Error| match confinement.refusal(&e) {
        Some(why) => GuestSqlError::Refused(why),
        None if matches!(&e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::OperationInterrupted) => {
            GuestSqlError::Stopped
        }
        None if matches!(&e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::OutOfMemory) => {
            match armed.blame() {
                Some(over) => GuestSqlError::OverMemory(over),
                None => GuestSqlError::Sqlite(e),
            }
        }
        None => GuestSqlError::Sqlite(e),
    };
    let mut run = |stmt: &mut rusqlite::Statement<'_>| {
        let columns: Vec<String> = stmt.column_names().iter().map(|c| c.to_string()).collect();
        let width = columns.len();
        let before = conn.total_changes();
        let mut rows = Vec::new();
        {
            let mut cursor = stmt
                .query(rusqlite::params_from_iter(params.iter()))
                .map_err(classify)?;
            while let Some(row) = cursor.next().map_err(classify)? {
                let mut values = Vec::with_capacity(width);
                for i in 0..width {
                    let value = row.get_ref(i).map_err(classify)?;
                    let bytes = match value {
                        ValueRef::Text(t) | ValueRef::Blob(t) => t.len(),
                        _ => 8,
                    };
                    budget.take(bytes).map_err(GuestSqlError::TooLarge)?;
                    values.push(Value::from(value));
                }
                rows.push(values);
            }
        }
        Ok(StatementResult {
            columns,
            rows_read: rows.len() as u64,
            rows,
            rows_written: conn.total_changes().saturating_sub(before),
            last_insert_id: conn.last_insert_rowid(),
        })
    };
    confinement.as_guest(|| {
        if cached {
            let mut stmt = conn.prepare_cached(sql).map_err(classify)?;
            run(&mut stmt)
        } else {
            let mut stmt = conn.prepare(sql).map_err(classify)?;
            run(&mut stmt)
        }
    })
}
