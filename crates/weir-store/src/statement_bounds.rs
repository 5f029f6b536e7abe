//! Statement bounds: how long a guest's statement may run and how much it
//! may make the host hold.
//!
//! Invariants owned here, for every connection a guest's SQL reaches:
//! - a statement stops when its [`StopCheck`] says so (the event's
//!   deadline, its abandonment): SQLite asks between every
//!   [`PROGRESS_OPS`] virtual-machine steps;
//! - what a statement hands back is counted as it is read
//!   ([`ResultBudget`]), so a result over its bound is refused before the
//!   host holds more than the bound;
//! - SQLite's own heap — page caches, and the sorts and temporary tables
//!   of running statements, which never spill to files
//!   ([`crate::confinement::harden`]) — is bounded for the whole process
//!   ([`bound_sqlite_heap`]), and what one statement makes it hold, per
//!   statement ([`crate::statement_memory`]).

use std::sync::Arc;

use rusqlite::{Connection, ffi};

/// Virtual-machine steps between two stop checks. A check costs a clock
/// read; at ~1,000 steps it is far below a microsecond of work apart, so a
/// runaway statement stops within microseconds of its deadline.
pub const PROGRESS_OPS: i32 = 1000;

/// Bytes a result value counts beyond its own length: what the host holds
/// per value besides its bytes, so many tiny values are bounded too.
pub const VALUE_OVERHEAD_BYTES: usize = 32;

/// When a running statement must stop: checked by SQLite's progress
/// handler; `true` interrupts the statement.
pub type StopCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// Bounds the memory SQLite itself may hold, for the whole process: past
/// the soft limit it frees cache before allocating, past the hard limit an
/// allocation fails (the statement gets `SQLITE_NOMEM`) instead of the
/// process growing. Idempotent; the last call wins. Bounds each guest
/// statement too ([`crate::statement_memory`]) when SQLite was not in use
/// before: true when it does.
pub fn bound_sqlite_heap(soft_bytes: u64, hard_bytes: u64, statement_bytes: u64) -> bool {
    let bounded = crate::statement_memory::install();
    crate::statement_memory::bound_statements(statement_bytes);
    let soft = i64::try_from(soft_bytes).unwrap_or(i64::MAX);
    let hard = i64::try_from(hard_bytes).unwrap_or(i64::MAX);
    // SAFETY: both functions only set process-wide limits inside SQLite
    // and are safe to call from any thread at any time.
    unsafe {
        ffi::sqlite3_soft_heap_limit64(soft);
        ffi::sqlite3_hard_heap_limit64(hard);
    }
    bounded
}

/// Installs (or, with `None`, removes) the stop check of the statements
/// run next on `conn`.
pub fn watch(conn: &Connection, stop: Option<StopCheck>) {
    match stop {
        Some(stop) => conn.progress_handler(PROGRESS_OPS, Some(move || stop())),
        None => conn.progress_handler(PROGRESS_OPS, None::<fn() -> bool>),
    }
}

/// Counts what one call hands back to a guest, against its bound.
pub struct ResultBudget {
    left: usize,
    limit: usize,
}

/// A result over its bound: the limit, named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the results are over max_sql_result_bytes ({limit} bytes)")]
pub struct ResultTooLarge {
    pub limit: usize,
}

impl ResultBudget {
    pub fn new(limit: usize) -> ResultBudget {
        ResultBudget { left: limit, limit }
    }

    /// Takes `bytes` of payload (plus [`VALUE_OVERHEAD_BYTES`]) from the
    /// budget.
    pub fn take(&mut self, bytes: usize) -> Result<(), ResultTooLarge> {
        let cost = bytes.saturating_add(VALUE_OVERHEAD_BYTES);
        match self.left.checked_sub(cost) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(ResultTooLarge { limit: self.limit }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_statement_stops_when_told() {
        let conn = Connection::open_in_memory().unwrap();
        watch(&conn, Some(Arc::new(|| true)));
        let err = conn
            .query_row(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap_err();
        assert!(err.to_string().contains("interrupt"), "{err}");
        watch(&conn, None);
        let n: i64 = conn.query_row("SELECT 1", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn result_budgets_count_values_and_their_overhead() {
        let mut b = ResultBudget::new(100);
        b.take(50).unwrap();
        assert_eq!(b.take(50), Err(ResultTooLarge { limit: 100 }));
        let mut tiny = ResultBudget::new(VALUE_OVERHEAD_BYTES * 3);
        for _ in 0..3 {
            tiny.take(0).unwrap();
        }
        assert!(tiny.take(0).is_err());
    }
}
