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
            // A row the turn wrote is gone again.
            self.journaled = None;
            self.control("ROLLBACK")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::Durability;
    use crate::actor::ActorDb;
    use crate::actor::tests::open;

    #[test]
    fn a_turn_is_all_or_nothing() {
        let (mut db, path) = open("turn");
        db.begin_turn().unwrap();
        db.put("a", b"1").unwrap();
        db.put("b", b"2").unwrap();
        db.rollback_turn().unwrap();
        assert_eq!(db.get("a").unwrap(), None);
        db.begin_turn().unwrap();
        db.put("a", b"1").unwrap();
        db.put("b", b"2").unwrap();
        db.commit_turn().unwrap();
        // A turn left open when the process dies leaves nothing.
        db.begin_turn().unwrap();
        db.put("c", b"3").unwrap();
        drop(db);
        let db = ActorDb::open(&path, Durability::Process).unwrap();
        assert_eq!(db.get("a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(db.get("b").unwrap(), Some(b"2".to_vec()));
        assert_eq!(db.get("c").unwrap(), None);
    }

    /// The logical size of the database: what its bound limits.
    fn database_bytes(db: &ActorDb) -> u64 {
        let pages: u64 = db
            .conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .unwrap();
        let page: u64 = db
            .conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .unwrap();
        pages * page
    }

    #[test]
    fn a_write_past_the_bound_is_refused_by_name_and_a_lost_turn_is_told() {
        const BOUND: u64 = 256 << 10;
        let (mut db, _) = open("bound");
        db.set_max_bytes(BOUND).unwrap();
        db.begin_turn().unwrap();
        db.put("mark", b"a").unwrap();
        assert!(!db.transaction_lost());
        let mut refused = None;
        for n in 0..100 {
            if let Err(e) = db.put(&format!("big{n}"), &[7u8; 20_000]) {
                refused = Some(e);
                break;
            }
        }
        let refused = refused.expect("the bound refused no write");
        assert_eq!(refused.to_string(), crate::DATABASE_FULL);
        // SQLite took the turn's transaction with the write: the turn is
        // told once, and nothing it wrote is there.
        assert!(db.transaction_lost());
        assert!(!db.transaction_lost());
        assert_eq!(db.get("mark").unwrap(), None);
        assert_eq!(db.get("big0").unwrap(), None);
        assert!(database_bytes(&db) <= BOUND);
        // A turn that fits commits.
        db.begin_turn().unwrap();
        db.put("small", b"1").unwrap();
        db.commit_turn().unwrap();
        assert_eq!(db.get("small").unwrap(), Some(b"1".to_vec()));
    }

    #[test]
    fn a_statement_undone_alone_at_the_bound_keeps_its_turn() {
        const BOUND: u64 = 256 << 10;
        let (mut db, _) = open("bound-statement");
        db.set_max_bytes(BOUND).unwrap();
        db.begin_turn().unwrap();
        db.exec("CREATE TABLE t (b)", &[]).unwrap();
        db.exec("INSERT INTO t VALUES (1)", &[]).unwrap();
        let e = db
            .exec(
                "INSERT INTO t SELECT randomblob(20000) FROM \
                 (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100) SELECT x FROM c)",
                &[],
            )
            .expect_err("the bound refused nothing");
        assert_eq!(e.to_string(), crate::DATABASE_FULL);
        assert!(!db.transaction_lost());
        db.exec("INSERT INTO t VALUES (2)", &[]).unwrap();
        db.commit_turn().unwrap();
        let n: i64 = db
            .conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
        assert!(database_bytes(&db) <= BOUND);
    }

    #[test]
    fn sync_is_a_durability_barrier_inside_a_turn() {
        let (mut db, path) = open("sync");
        db.begin_turn().unwrap();
        db.put("before", b"1").unwrap();
        db.sync().unwrap();
        db.put("after", b"2").unwrap();
        drop(db);
        let db = ActorDb::open(&path, Durability::Process).unwrap();
        assert_eq!(db.get("before").unwrap(), Some(b"1".to_vec()));
        assert_eq!(db.get("after").unwrap(), None);
    }

    #[test]
    fn a_commit_that_fails_rolls_the_turn_back() {
        let (mut db, _) = open("commit-fails");
        db.exec("CREATE TABLE parent (id INTEGER PRIMARY KEY)", &[])
            .unwrap();
        db.exec(
            "CREATE TABLE child (p INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)",
            &[],
        )
        .unwrap();
        db.begin_turn().unwrap();
        db.put("k", b"v").unwrap();
        db.exec("INSERT INTO child (p) VALUES (42)", &[]).unwrap();
        assert!(
            db.commit_turn().is_err(),
            "the deferred key fails the commit"
        );
        assert_eq!(db.get("k").unwrap(), None, "nothing of the turn is left");
        db.begin_turn().unwrap();
        db.put("k", b"v2").unwrap();
        db.commit_turn().unwrap();
        assert_eq!(db.get("k").unwrap(), Some(b"v2".to_vec()));
    }
}
