//! The launch journal's rows in an actor's database (`_weir_journal`):
//! one per resident process of the actor that was started and has not
//! ended. This module only keeps them; what they mean, and when they are
//! written and read, is `weir_programs::fenced_work`'s.
//!
//! Invariant owned here: a database with journal rows has its **launch
//! mark** beside it (`NAME.sqlite3-launches`, empty), made durably before
//! the first row is written; so a start finds every owner with rows from a
//! directory listing, without opening every actor's database. A mark may
//! outlive its rows (whoever finds the journal empty under the owner's
//! hold removes it); a row never outlives its mark.

use std::path::{Path, PathBuf};

use crate::actor::{ActorDb, ActorStoreError};

/// What a database's launch mark adds to its path.
pub const LAUNCH_MARK_SUFFIX: &str = "-launches";

/// The launch mark of the database at `db`.
pub fn launch_mark(db: &Path) -> PathBuf {
    let mut mark = db.as_os_str().to_owned();
    mark.push(LAUNCH_MARK_SUFFIX);
    PathBuf::from(mark)
}

/// Makes the launch mark of the database at `db`, durably (the file and
/// its directory entry synced), unless it is there.
pub fn make_launch_mark(db: &Path) -> std::io::Result<()> {
    let mark = launch_mark(db);
    if mark.exists() {
        return Ok(());
    }
    std::fs::File::create(&mark)?.sync_all()?;
    if let Some(dir) = mark.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A launch journal row: a resident process of this actor that was
/// started and has not ended (see `weir_programs::fenced_work`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalRow {
    pub pid: u64,
    /// The launch spec, as the layer that wrote it encoded it.
    pub spec: String,
    /// Re-drives spent on it.
    pub attempt: u32,
}

impl ActorDb {
    /// Writes (or replaces) the journal row of `pid`.
    pub fn journal_put(
        &mut self,
        pid: u64,
        spec: &str,
        attempt: u32,
    ) -> Result<(), ActorStoreError> {
        if let Some(path) = self.conn.path().filter(|p| !p.is_empty()) {
            let db = Path::new(path);
            make_launch_mark(db).map_err(|cause| crate::StoreError::Dir {
                path: launch_mark(db),
                cause,
            })?;
        }
        self.conn
            .prepare_cached(
                "INSERT INTO _weir_journal (pid, spec, attempt) VALUES (?1, ?2, ?3)
                 ON CONFLICT (pid) DO UPDATE SET spec = excluded.spec, attempt = excluded.attempt",
            )?
            .execute(rusqlite::params![pid as i64, spec, attempt])?;
        self.journaled = Some(true);
        Ok(())
    }

    /// Deletes the journal row of `pid`; true if there was one.
    pub fn journal_delete(&mut self, pid: u64) -> Result<bool, ActorStoreError> {
        self.journaled = None;
        Ok(self
            .conn
            .prepare_cached("DELETE FROM _weir_journal WHERE pid = ?1")?
            .execute([pid as i64])?
            > 0)
    }

    /// True when the journal has a row: what cluster mode mirrors in the
    /// owner's row, so that live nodes take over an owner whose node died.
    /// Asked after every commit a replica ships, so the answer is kept
    /// until a row is deleted or a turn rolled back (a row written says
    /// yes by itself).
    pub fn journaled(&mut self) -> Result<bool, ActorStoreError> {
        if let Some(known) = self.journaled {
            return Ok(known);
        }
        let journaled = self
            .conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM _weir_journal)")?
            .query_row([], |r| r.get(0))?;
        self.journaled = Some(journaled);
        Ok(journaled)
    }

    /// Every journal row, by pid.
    pub fn journal(&self) -> Result<Vec<JournalRow>, ActorStoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT pid, spec, attempt FROM _weir_journal ORDER BY pid")?;
        let rows = stmt
            .query_map([], |r| {
                Ok(JournalRow {
                    pid: r.get::<_, i64>(0)? as u64,
                    spec: r.get(1)?,
                    attempt: r.get(2)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use crate::actor::tests::open;

    #[test]
    fn journaled_follows_rows_written_deleted_and_rolled_back() {
        let (mut db, path) = open("journaled");
        assert!(!db.journaled().unwrap());
        db.journal_put(7, "{}", 0).unwrap();
        assert!(db.journaled().unwrap());
        db.journal_delete(7).unwrap();
        assert!(!db.journaled().unwrap());
        // A row a turn wrote and then rolled back is not there.
        db.begin_turn().unwrap();
        db.journal_put(8, "{}", 0).unwrap();
        assert!(db.journaled().unwrap());
        db.rollback_turn().unwrap();
        assert!(!db.journaled().unwrap());
        assert!(db.journal().unwrap().is_empty());
        // One of two deleted: still journaled.
        db.journal_put(9, "{}", 0).unwrap();
        db.journal_put(10, "{}", 0).unwrap();
        db.journal_delete(9).unwrap();
        assert!(db.journaled().unwrap());
        drop(db);
        let _ = std::fs::remove_file(super::launch_mark(&path));
        let _ = std::fs::remove_file(&path);
    }
}
