//! The launch journal's rows in an actor's database (`_weir_journal`):
//! one per resident process of the actor that was started and has not
//! ended. This module only keeps them; what they mean, and when they are
//! written and read, is `weir_programs::fenced_work`'s.

use crate::actor::{ActorDb, ActorStoreError};

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
        self.conn
            .prepare_cached(
                "INSERT INTO _weir_journal (pid, spec, attempt) VALUES (?1, ?2, ?3)
                 ON CONFLICT (pid) DO UPDATE SET spec = excluded.spec, attempt = excluded.attempt",
            )?
            .execute(rusqlite::params![pid as i64, spec, attempt])?;
        Ok(())
    }

    /// Deletes the journal row of `pid`; true if there was one.
    pub fn journal_delete(&mut self, pid: u64) -> Result<bool, ActorStoreError> {
        Ok(self
            .conn
            .prepare_cached("DELETE FROM _weir_journal WHERE pid = ?1")?
            .execute([pid as i64])?
            > 0)
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
