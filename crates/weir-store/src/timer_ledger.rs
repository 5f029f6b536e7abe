//! The timer ledger: one small database beside the actors' databases
//! (`<actors>/.timer-ledger.sqlite3`) that keeps, for every actor with a
//! timer, a deadline no later than its earliest one. A start reads it
//! (a range of its key at a time) and so knows when every actor is next
//! due without opening a single actor's database.
//!
//! Invariants owned here:
//! - an actor's row is a lower bound of its earliest timer: it is lowered
//!   ([`TimerLedger::lower`]) before a commit that may bring the actor's
//!   earliest deadline forward, and set to the exact value
//!   ([`TimerLedger::set`]) only after the actor's commit, by the actor's
//!   holder. A crash between the two leaves a row that is too early, which
//!   costs one wake that finds nothing due, never a late timer;
//! - its rows are a derived copy: what a power loss takes from it the
//!   timer pass puts back from the actors' own databases, and a file that
//!   is not a database, or is corrupt, is made again;
//! - a write that would change nothing writes nothing: a row already low
//!   enough, or already exact, costs a lookup.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use crate::{Durability, StoreError, Tuning, connect_with};

/// The ledger's file name inside the actors' directory; the leading dot
/// keeps it apart from the class directories beside it.
pub const LEDGER_FILE: &str = ".timer-ledger.sqlite3";

/// Rows [`TimerLedger::read`] reads under one hold of the ledger's
/// connection. A start reads every row while turns already run, and a
/// turn that moves a timer writes its row through the same connection:
/// chunks keep its wait to one chunk's read (a few milliseconds), not the
/// whole ledger's (about a second for a million rows).
pub const READ_CHUNK_ROWS: usize = 4096;

/// How long exact values wait to be written together. Each is written
/// after its actor's commit (most often by an alarm's turn, moving the
/// row later or removing it); written one by one they cost a commit of
/// the ledger each, beside the actor's own. Gathered, one transaction
/// writes all that came in this long, and a crash meanwhile leaves rows
/// too early: a wake that finds nothing due, never a late timer.
pub const EXACT_WRITE_DELAY: Duration = Duration::from_millis(10);

/// Every actor's next deadline, or an earlier one.
pub struct TimerLedger {
    shared: Arc<Shared>,
}

/// An actor's row key: class and name.
type Key = (String, String);

struct Shared {
    conn: Mutex<Connection>,
    /// Exact values not yet written, newest per actor.
    exact: Mutex<HashMap<Key, Option<i64>>>,
    /// Rung when `exact` gets its first entry, or the ledger is dropped.
    wake: Condvar,
}

impl Shared {
    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn exact(&self) -> MutexGuard<'_, HashMap<Key, Option<i64>>> {
        self.exact.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes every exact value waiting, in one transaction. The caller
    /// holds the connection: a lowering cannot run between the take and
    /// the write.
    fn write_exact(&self, conn: &Connection) -> Result<(), StoreError> {
        let exact = std::mem::take(&mut *self.exact());
        if exact.is_empty() {
            return Ok(());
        }
        let tx = conn.unchecked_transaction()?;
        {
            let mut upsert = tx.prepare_cached(
                "INSERT INTO next_deadline (class, name, at_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (class, name) DO UPDATE SET at_ms = excluded.at_ms
                 WHERE excluded.at_ms <> at_ms",
            )?;
            let mut delete =
                tx.prepare_cached("DELETE FROM next_deadline WHERE class = ?1 AND name = ?2")?;
            for ((class, name), next) in &exact {
                match next {
                    Some(at_ms) => upsert.execute(params![class, name, at_ms])?,
                    None => delete.execute(params![class, name])?,
                };
            }
        }
        tx.commit()?;
        Ok(())
    }
}

/// Writes the exact values as they come, [`EXACT_WRITE_DELAY`] after the
/// first of each batch, until the ledger is dropped (then once more).
fn exact_writer(shared: Weak<Shared>) {
    loop {
        let Some(s) = shared.upgrade() else { return };
        {
            let waiting = s.exact();
            if waiting.is_empty() {
                // Woken by a new value or by the drop; the timeout only
                // lets a dropped ledger's thread end.
                let _ = s.wake.wait_timeout(waiting, Duration::from_secs(1));
            }
        }
        if s.exact().is_empty() {
            continue;
        }
        std::thread::sleep(EXACT_WRITE_DELAY);
        let conn = s.conn();
        if let Err(e) = s.write_exact(&conn) {
            tracing::warn!(error = %e, "cannot write exact deadlines to the timer ledger; their rows stay earlier than the timers");
        }
    }
}

impl TimerLedger {
    /// Opens (or makes) the ledger at `path`. Only the server's process
    /// uses it, so its connection holds the file's lock for good.
    pub fn open(path: &Path, durability: Durability) -> Result<TimerLedger, StoreError> {
        let conn = connect_with(
            path,
            durability,
            Tuning {
                exclusive: true,
                page_size: None,
            },
        )?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS next_deadline (
                 class TEXT NOT NULL,
                 name TEXT NOT NULL,
                 at_ms INTEGER NOT NULL,
                 PRIMARY KEY (class, name)
             ) WITHOUT ROWID",
        )?;
        let shared = Arc::new(Shared {
            conn: Mutex::new(conn),
            exact: Mutex::new(HashMap::new()),
            wake: Condvar::new(),
        });
        let writer = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("weir-timer-ledger".into())
            .spawn(move || exact_writer(writer))
            .map_err(|e| StoreError::Dir {
                path: path.to_path_buf(),
                cause: e,
            })?;
        Ok(TimerLedger { shared })
    }

    /// [`TimerLedger::open`], but a file that is not a database, or is
    /// corrupt, is removed (with its WAL) and made again: its rows are a
    /// derived copy. Returns the error that made it be made again.
    pub fn open_or_remake(
        path: &Path,
        durability: Durability,
    ) -> Result<(TimerLedger, Option<StoreError>), StoreError> {
        let unusable = match TimerLedger::open(path, durability) {
            Ok(ledger) => return Ok((ledger, None)),
            Err(e) if is_unusable(&e) => e,
            Err(e) => return Err(e),
        };
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.as_os_str().to_owned();
            file.push(suffix);
            match std::fs::remove_file(&file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(StoreError::Dir {
                        path: file.into(),
                        cause: e,
                    });
                }
                _ => {}
            }
        }
        Ok((TimerLedger::open(path, durability)?, Some(unusable)))
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.shared.conn()
    }

    /// The connection, with the actor's exact value still waiting dropped
    /// under it: what a write made at once (a lowering, a removal) does
    /// first, so the writer cannot put the older value back after it.
    fn lock_dropping_waiting(&self, class: &str, name: &str) -> MutexGuard<'_, Connection> {
        let conn = self.lock();
        self.shared
            .exact()
            .remove(&(class.to_string(), name.to_string()));
        conn
    }

    /// Brings an actor's row down to `at_ms` if it is later or missing:
    /// before a commit that may make `at_ms` its earliest deadline.
    /// Written at once; an exact value of the actor still waiting is
    /// dropped (it came before this commit; its holder sets the next one
    /// after).
    pub fn lower(&self, class: &str, name: &str, at_ms: i64) -> Result<(), StoreError> {
        let conn = self.lock_dropping_waiting(class, name);
        conn.prepare_cached(
            "INSERT INTO next_deadline (class, name, at_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (class, name) DO UPDATE SET at_ms = excluded.at_ms
                 WHERE excluded.at_ms < at_ms",
        )?
        .execute(params![class, name, at_ms])?;
        Ok(())
    }

    /// Sets an actor's row to its earliest deadline (`None`: it has no
    /// timer). Only its holder may call this, after its commit: a later
    /// value replaces an earlier one. Written with the others that come
    /// within [`EXACT_WRITE_DELAY`], in one transaction.
    pub fn set(&self, class: &str, name: &str, next: Option<i64>) {
        let mut exact = self.shared.exact();
        if exact.is_empty() {
            self.shared.wake.notify_one();
        }
        exact.insert((class.to_string(), name.to_string()), next);
    }

    /// Removes an actor's row at once (and an exact value of it still
    /// waiting): the actor is gone.
    pub fn remove(&self, class: &str, name: &str) -> Result<(), StoreError> {
        let conn = self.lock_dropping_waiting(class, name);
        conn.prepare_cached("DELETE FROM next_deadline WHERE class = ?1 AND name = ?2")?
            .execute(params![class, name])?;
        Ok(())
    }

    /// Removes every row of `class` at once, and its exact values still
    /// waiting: a class no longer declared, whose rows no start would
    /// read. How many rows went.
    pub fn remove_class(&self, class: &str) -> Result<usize, StoreError> {
        let conn = self.lock();
        self.shared.exact().retain(|(c, _), _| c != class);
        Ok(conn
            .prepare_cached("DELETE FROM next_deadline WHERE class = ?1")?
            .execute(params![class])?)
    }

    /// Writes the exact values still waiting, now.
    pub fn flush(&self) -> Result<(), StoreError> {
        let conn = self.lock();
        self.shared.write_exact(&conn)
    }

    /// An actor's row, if it has one (what is written: see
    /// [`TimerLedger::flush`]).
    pub fn get(&self, class: &str, name: &str) -> Result<Option<i64>, StoreError> {
        Ok(self
            .lock()
            .prepare_cached("SELECT at_ms FROM next_deadline WHERE class = ?1 AND name = ?2")?
            .query_row(params![class, name], |r| r.get(0))
            .optional()?)
    }

    /// Calls `each(class, name, at_ms)` for every row, in key order, a
    /// chunk of [`READ_CHUNK_ROWS`] at a time; returns how many there
    /// were. Rows written meanwhile may or may not be seen.
    pub fn read(&self, mut each: impl FnMut(&str, &str, i64)) -> Result<usize, StoreError> {
        let mut count = 0;
        let mut after: Option<(String, String)> = None;
        loop {
            let conn = self.lock();
            // Each chunk a range of the key from where the last one ended.
            let (mut stmt, mut rows);
            match after.take() {
                None => {
                    stmt = conn.prepare_cached(
                        "SELECT class, name, at_ms FROM next_deadline
                         ORDER BY class, name LIMIT ?1",
                    )?;
                    rows = stmt.query(params![READ_CHUNK_ROWS as i64])?;
                }
                Some((class, name)) => {
                    stmt = conn.prepare_cached(
                        "SELECT class, name, at_ms FROM next_deadline
                         WHERE (class, name) > (?1, ?2) ORDER BY class, name LIMIT ?3",
                    )?;
                    rows = stmt.query(params![class, name, READ_CHUNK_ROWS as i64])?;
                }
            }
            let mut read = 0;
            while let Some(row) = rows.next()? {
                let class = row.get_ref(0)?.as_str().map_err(rusqlite::Error::from)?;
                let name = row.get_ref(1)?.as_str().map_err(rusqlite::Error::from)?;
                each(class, name, row.get(2)?);
                read += 1;
                if read == READ_CHUNK_ROWS {
                    after = Some((class.to_string(), name.to_string()));
                }
            }
            count += read;
            if read < READ_CHUNK_ROWS {
                return Ok(count);
            }
        }
    }
}

impl Drop for TimerLedger {
    /// Writes what waits (a clean stop leaves exact rows), and lets the
    /// writer thread end.
    fn drop(&mut self) {
        if let Err(e) = self.flush() {
            tracing::warn!(error = %e, "cannot write exact deadlines to the timer ledger at its close");
        }
        self.shared.wake.notify_one();
    }
}

/// True for a file SQLite cannot use as a database at all: not one, or
/// corrupt (not busy, not unreadable: those are left alone).
fn is_unusable(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Sqlite(rusqlite::Error::SqliteFailure(f, _))
            if matches!(f.code, rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(dir: &Path) -> TimerLedger {
        TimerLedger::open(&dir.join(LEDGER_FILE), Durability::Process).unwrap()
    }

    #[test]
    fn lowering_never_raises_and_setting_is_exact() {
        let dir = weir_scratch::dir("ledger-rules");
        std::fs::create_dir_all(&dir).unwrap();
        let l = ledger(&dir);
        l.lower("c", "a", 500).unwrap();
        l.lower("c", "a", 900).unwrap();
        assert_eq!(
            l.get("c", "a").unwrap(),
            Some(500),
            "a later value does not raise it"
        );
        l.lower("c", "a", 300).unwrap();
        assert_eq!(l.get("c", "a").unwrap(), Some(300));
        l.set("c", "a", Some(800));
        l.flush().unwrap();
        assert_eq!(
            l.get("c", "a").unwrap(),
            Some(800),
            "the holder's exact value"
        );
        // A lowering drops an exact value still waiting (it came before
        // the commit the lowering precedes): here the writer has not run
        // before the lowering, or wrote None before it; the row is 700
        // either way.
        l.set("c", "a", None);
        l.lower("c", "a", 700).unwrap();
        l.flush().unwrap();
        assert_eq!(l.get("c", "a").unwrap(), Some(700));
        l.set("c", "a", None);
        l.flush().unwrap();
        assert_eq!(l.get("c", "a").unwrap(), None);
        assert_eq!(l.get("c", "b").unwrap(), None);
        // Removal is at once, and drops what waits.
        l.lower("c", "b", 5).unwrap();
        l.set("c", "b", Some(9));
        l.remove("c", "b").unwrap();
        assert_eq!(l.get("c", "b").unwrap(), None);
        l.flush().unwrap();
        assert_eq!(l.get("c", "b").unwrap(), None);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_made_again_empty() {
        let dir = weir_scratch::dir("ledger-remake");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(LEDGER_FILE);
        std::fs::write(&path, b"not a database at all, but long enough to be read").unwrap();
        let (l, why) = TimerLedger::open_or_remake(&path, Durability::Process).unwrap();
        assert!(why.unwrap().to_string().contains("not a database"));
        assert_eq!(l.read(|_, _, _| {}).unwrap(), 0);
        l.lower("c", "a", 1).unwrap();
        drop(l);
        let (l, why) = TimerLedger::open_or_remake(&path, Durability::Process).unwrap();
        assert!(why.is_none(), "a good ledger is kept");
        assert_eq!(l.get("c", "a").unwrap(), Some(1));
    }

    #[test]
    fn a_read_goes_through_every_chunk_once_in_key_order() {
        let dir = weir_scratch::dir("ledger-chunks");
        std::fs::create_dir_all(&dir).unwrap();
        let l = ledger(&dir);
        let n = READ_CHUNK_ROWS * 2 + 7;
        for i in 0..n {
            l.lower(
                if i % 2 == 0 { "a" } else { "b" },
                &format!("n{i:06}"),
                i as i64,
            )
            .unwrap();
        }
        let mut seen = Vec::new();
        assert_eq!(
            l.read(|c, n, at| seen.push((c.to_string(), n.to_string(), at)))
                .unwrap(),
            n
        );
        let mut sorted = seen.clone();
        sorted.sort();
        assert_eq!(seen, sorted, "in key order");
        sorted.dedup();
        assert_eq!(sorted.len(), n, "each row once");
        // Exactly a whole number of chunks: the last, empty read ends it.
        let dir = weir_scratch::dir("ledger-chunks-even");
        std::fs::create_dir_all(&dir).unwrap();
        let l = ledger(&dir);
        for i in 0..READ_CHUNK_ROWS {
            l.lower("a", &format!("n{i:06}"), 1).unwrap();
        }
        assert_eq!(l.read(|_, _, _| {}).unwrap(), READ_CHUNK_ROWS);
    }

    #[test]
    fn exact_values_are_written_by_the_writer_on_its_own() {
        let dir = weir_scratch::dir("ledger-writer");
        std::fs::create_dir_all(&dir).unwrap();
        let l = ledger(&dir);
        for i in 0..100 {
            l.set("c", &format!("a{i}"), Some(i));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while l.get("c", "a99").unwrap().is_none() {
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(l.read(|_, _, _| {}).unwrap(), 100, "in one batch");
    }

    #[test]
    fn a_class_is_removed_whole_and_its_waiting_values_with_it() {
        let dir = weir_scratch::dir("ledger-class");
        std::fs::create_dir_all(&dir).unwrap();
        let ledger = ledger(&dir);
        for name in ["a", "b"] {
            ledger.lower("gone", name, 10).unwrap();
            ledger.lower("kept", name, 20).unwrap();
        }
        // An exact value of the class, still waiting, goes with it.
        ledger.set("gone", "c", Some(30));
        assert_eq!(ledger.remove_class("gone").unwrap(), 2);
        ledger.flush().unwrap();
        let mut rows = Vec::new();
        ledger
            .read(|class, name, at| rows.push(format!("{class}/{name}@{at}")))
            .unwrap();
        assert_eq!(rows, ["kept/a@20", "kept/b@20"]);
        assert_eq!(ledger.remove_class("nothing").unwrap(), 0);
    }

    #[test]
    fn rows_are_read_back_after_a_reopen() {
        let dir = weir_scratch::dir("ledger-reopen");
        std::fs::create_dir_all(&dir).unwrap();
        {
            let l = ledger(&dir);
            l.lower("room", "x", 10).unwrap();
            l.lower("room", "y", 20).unwrap();
            l.set("probe", "x", Some(30));
        }
        let mut rows = Vec::new();
        let n = ledger(&dir)
            .read(|c, n, at| rows.push((c.to_string(), n.to_string(), at)))
            .unwrap();
        assert_eq!(n, 3);
        assert_eq!(
            rows,
            [
                ("probe".into(), "x".into(), 30),
                ("room".into(), "x".into(), 10),
                ("room".into(), "y".into(), 20)
            ]
        );
    }
}
