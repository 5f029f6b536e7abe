//! The turn transaction of an actor's database: everything a turn writes
//! is one transaction, begun at its first storage call, committed when the
//! turn ends well (or at an explicit [`ActorDb::sync`], the durability
//! barrier) and rolled back otherwise.
//!
//! Invariants owned here:
//! - a turn is at most one open transaction at a time, and nothing of it
//!   is visible after a rollback or a process that dies before the commit;
//! - a commit that fails (a deferred constraint, a full disk) rolls the
//!   whole turn back before the error is returned, so the connection never
//!   stays inside a half-committed turn;
//! - a turn whose transaction SQLite rolled back on its own (an
//!   interrupted write, a full database whose statement could not be
//!   undone alone, out of memory, an I/O error) is told so
//!   ([`ActorDb::transaction_lost`]) and never goes on outside it, where
//!   each later statement would commit by itself;
//! - every commit is counted toward the next checkpoint.

use crate::actor::{ActorDb, ActorStoreError};

impl ActorDb {
    /// Runs a transaction-control statement, prepared once per connection:
    /// every turn runs two of them, and parsing them each time was a
    /// measurable share of a small turn.
    fn control(&self, sql: &str) -> Result<(), rusqlite::Error> {
        self.conn.prepare_cached(sql)?.execute([]).map(drop)
    }

    /// Runs `f` as one transaction of its own, committed before this
    /// returns (for work outside any turn: the launch journal's).
    pub fn transaction<T>(
        &mut self,
        f: impl FnOnce(&mut ActorDb) -> Result<T, ActorStoreError>,
    ) -> Result<T, ActorStoreError> {
        self.begin_turn()?;
        match f(self) {
            Ok(value) => {
                self.commit_turn()?;
                Ok(value)
            }
            Err(e) => {
                let _ = self.rollback_turn();
                Err(e)
            }
        }
    }

    /// Starts a turn: everything until [`ActorDb::commit_turn`] or
    /// [`ActorDb::rollback_turn`] is one transaction.
    pub fn begin_turn(&mut self) -> Result<(), ActorStoreError> {
        if !self.in_turn {
            self.control("BEGIN IMMEDIATE")?;
            self.in_turn = true;
        }
        Ok(())
    }

    /// Makes the turn's writes so far durable and goes on in a new
    /// transaction (the durability barrier).
    pub fn sync(&mut self) -> Result<(), ActorStoreError> {
        if self.in_turn {
            self.control("COMMIT")?;
            self.commits += 1;
            self.control("BEGIN IMMEDIATE")?;
        }
        Ok(())
    }

    /// Commits the turn. A commit that fails (a deferred constraint, a
    /// full disk) rolls the whole turn back before returning the error.
    pub fn commit_turn(&mut self) -> Result<(), ActorStoreError> {
        if self.in_turn {
            self.in_turn = false;
            if let Err(e) = self.control("COMMIT") {
                if !self.conn.is_autocommit() {
                    let _ = self.control("ROLLBACK");
                }
                return Err(e.into());
            }
            self.commits += 1;
        }
        Ok(())
    }

    /// True (once) when the turn's transaction has ended without Weir
    /// ending it: SQLite rolls a whole transaction back when a write is
    /// interrupted, or fails for a full database, memory or I/O where its
    /// statement cannot be undone alone. Everything the turn wrote before
    /// is gone, and the connection is back in autocommit.
    pub fn transaction_lost(&mut self) -> bool {
        if self.in_turn && self.conn.is_autocommit() {
            self.in_turn = false;
            return true;
        }
        false
    }

    /// Drops the turn's writes.
    pub fn rollback_turn(&mut self) -> Result<(), ActorStoreError> {
        if self.in_turn {
            self.in_turn = false;
            self.control("ROLLBACK")?;
        }
        Ok(())
    }
}
