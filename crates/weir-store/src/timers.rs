//! The named timers' rows in an actor's database (`_weir_timers`): one
//! deadline per reason, the earliest kept; and the deliveries running now
//! (`_weir_deliveries`). When and how often a failed delivery is retried
//! is `weir_actors::timers`'s.
//!
//! Invariants owned here:
//! - an alarm turn takes its timer in the turn's own transaction, so a
//!   handler that re-arms its reason makes a new timer, and a turn that
//!   rolls back leaves the timer as it was;
//! - a turn can also commit before it ends (an outbound call, a socket
//!   send, a `sync` are commit points): the taking is then durable while
//!   the delivery is not over. So the taking writes a delivery row in the
//!   same transaction, holding the timer's deadline and attempt, and only
//!   the turn that ends well deletes it. A failed delivery becomes its
//!   retry whether the taking was committed or not, and a delivery row
//!   left by a process that died is a timer again, due when it was, the
//!   next time the actor's alarms are dispatched
//!   ([`ActorDb::recover_deliveries`]); until then it counts toward the
//!   actor's next deadline, so the actor is woken for it.

use rusqlite::params;

use crate::actor::{ActorDb, ActorStoreError};

/// A timer that is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueTimer {
    pub reason: String,
    pub at_ms: i64,
    pub attempt: u32,
}

impl ActorDb {
    /// Schedules `reason` at `at_ms`, keeping the earlier deadline if one is
    /// already set.
    pub fn schedule(&mut self, reason: &str, at_ms: i64) -> Result<(), ActorStoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO _weir_timers (reason, at_ms) VALUES (?1, ?2)
                 ON CONFLICT(reason) DO UPDATE SET at_ms = min(at_ms, excluded.at_ms), attempt = 0",
            )?
            .execute(params![reason, at_ms])?;
        Ok(())
    }

    /// Cancels a reason's timer; true if there was one.
    pub fn cancel(&mut self, reason: &str) -> Result<bool, ActorStoreError> {
        Ok(self
            .conn
            .prepare_cached("DELETE FROM _weir_timers WHERE reason = ?1")?
            .execute(params![reason])?
            > 0)
    }

    /// Every timer, earliest first.
    pub fn timers(&self) -> Result<Vec<DueTimer>, ActorStoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT reason, at_ms, attempt FROM _weir_timers ORDER BY at_ms, reason",
        )?;
        let rows = stmt
            .query_map([], |r| {
                Ok(DueTimer {
                    reason: r.get(0)?,
                    at_ms: r.get(1)?,
                    attempt: r.get(2)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// The snapshot of timers due at `now_ms`, taken before any handler
    /// runs: a reason re-armed for "now" by a handler is not in it.
    pub fn due(&self, now_ms: i64) -> Result<Vec<DueTimer>, ActorStoreError> {
        Ok(self
            .timers()?
            .into_iter()
            .filter(|t| t.at_ms <= now_ms)
            .collect())
    }

    /// The timer of `reason` now, if it has one.
    pub fn timer(&self, reason: &str) -> Result<Option<DueTimer>, ActorStoreError> {
        use rusqlite::OptionalExtension;
        Ok(self
            .conn
            .prepare_cached("SELECT reason, at_ms, attempt FROM _weir_timers WHERE reason = ?1")?
            .query_row(params![reason], |r| {
                Ok(DueTimer {
                    reason: r.get(0)?,
                    at_ms: r.get(1)?,
                    attempt: r.get(2)?,
                })
            })
            .optional()?)
    }

    /// The earliest deadline, for the dispatcher's wake-up: of the timers,
    /// and of deliveries a dead process left (see the module's doc).
    pub fn next_deadline(&self) -> Result<Option<i64>, ActorStoreError> {
        // Cached: in cluster mode every commit asks it (its row carries
        // the alarm), and preparing it each time cost more than the query.
        Ok(self
            .conn
            .prepare_cached(
                "SELECT min(at_ms) FROM (SELECT min(at_ms) AS at_ms FROM _weir_timers
                 UNION ALL SELECT min(at_ms) FROM _weir_deliveries)",
            )?
            .query_row([], |r| r.get(0))?)
    }

    /// Takes a due timer for its alarm turn, in the turn's transaction:
    /// its row goes (a re-arm by the handler is a new timer), and a
    /// delivery row keeps what it was until the turn ends.
    pub fn begin_delivery(&mut self, timer: &DueTimer) -> Result<(), ActorStoreError> {
        self.cancel(&timer.reason)?;
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO _weir_deliveries (reason, at_ms, attempt) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![timer.reason, timer.at_ms, timer.attempt])?;
        Ok(())
    }

    /// The delivery of `reason` ended well: its row goes, in the turn's
    /// transaction.
    pub fn delivered(&mut self, reason: &str) -> Result<(), ActorStoreError> {
        self.conn
            .prepare_cached("DELETE FROM _weir_deliveries WHERE reason = ?1")?
            .execute(params![reason])?;
        Ok(())
    }

    /// After a failed delivery of `timer` (its turn rolled back): retried
    /// at `at_ms` as attempt `attempt`, in one transaction of its own.
    /// The reason's one deadline is the retry's, or an earlier one its
    /// handler set and committed before it failed.
    pub fn redeliver(
        &mut self,
        timer: &DueTimer,
        at_ms: i64,
        attempt: u32,
    ) -> Result<(), ActorStoreError> {
        self.transaction(|db| {
            db.delivered(&timer.reason)?;
            db.conn
                .prepare_cached(
                    "INSERT INTO _weir_timers (reason, at_ms, attempt) VALUES (?1, ?2, ?3)
                     ON CONFLICT(reason) DO UPDATE SET
                       at_ms = CASE WHEN at_ms = ?4 AND attempt = ?5 THEN excluded.at_ms
                                    ELSE min(at_ms, excluded.at_ms) END,
                       attempt = excluded.attempt",
                )?
                .execute(params![
                    timer.reason,
                    at_ms,
                    attempt,
                    timer.at_ms,
                    timer.attempt
                ])?;
            Ok(())
        })
    }

    /// After the last failed delivery of `timer`: its timer goes, unless
    /// its handler set a new one and committed it before it failed.
    pub fn drop_delivery(&mut self, timer: &DueTimer) -> Result<(), ActorStoreError> {
        self.transaction(|db| {
            db.delivered(&timer.reason)?;
            db.conn
                .prepare_cached(
                    "DELETE FROM _weir_timers WHERE reason = ?1 AND at_ms = ?2 AND attempt = ?3",
                )?
                .execute(params![timer.reason, timer.at_ms, timer.attempt])?;
            Ok(())
        })
    }

    /// Makes every delivery row a dead process left a timer again, due
    /// when it was and at its attempt (the earlier deadline kept where its
    /// handler had set a new one), in one transaction; how many there were.
    pub fn recover_deliveries(&mut self) -> Result<usize, ActorStoreError> {
        let left: bool = self
            .conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM _weir_deliveries)")?
            .query_row([], |r| r.get(0))?;
        if !left {
            return Ok(0);
        }
        self.transaction(|db| {
            let n = db
                .conn
                .prepare_cached(
                    "INSERT INTO _weir_timers (reason, at_ms, attempt)
                     SELECT reason, at_ms, attempt FROM _weir_deliveries WHERE true
                     ON CONFLICT(reason) DO UPDATE SET
                       at_ms = min(at_ms, excluded.at_ms), attempt = excluded.attempt",
                )?
                .execute([])?;
            db.conn
                .prepare_cached("DELETE FROM _weir_deliveries")?
                .execute([])?;
            Ok(n)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Durability;

    fn open(name: &str) -> ActorDb {
        let dir = weir_scratch::dir(&format!("timers-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        ActorDb::open(&dir.join("actor.sqlite3"), Durability::Process).unwrap()
    }

    #[test]
    fn timers_keep_the_earliest_and_alarm_turns_consume_them() {
        let mut db = open("timers");
        db.schedule("flush", 500).unwrap();
        db.schedule("flush", 300).unwrap();
        db.schedule("flush", 900).unwrap();
        db.schedule("gc", 1000).unwrap();
        assert_eq!(db.next_deadline().unwrap(), Some(300));
        let due = db.due(600).unwrap();
        assert_eq!(
            due,
            vec![DueTimer {
                reason: "flush".into(),
                at_ms: 300,
                attempt: 0
            }]
        );

        // The handler re-arms its own reason for "now": a new timer, not the
        // taken one, and not part of the snapshot already taken.
        db.begin_turn().unwrap();
        db.begin_delivery(&due[0]).unwrap();
        db.schedule("flush", 600).unwrap();
        db.delivered("flush").unwrap();
        db.commit_turn().unwrap();
        assert_eq!(db.due(600).unwrap()[0].at_ms, 600);

        // A failed alarm turn leaves its timer for a retry.
        let flush = db.timer("flush").unwrap().unwrap();
        db.begin_turn().unwrap();
        db.begin_delivery(&flush).unwrap();
        db.rollback_turn().unwrap();
        db.redeliver(&flush, 2600, 1).unwrap();
        let timers = db.timers().unwrap();
        assert_eq!(
            timers[0],
            DueTimer {
                reason: "gc".into(),
                at_ms: 1000,
                attempt: 0
            }
        );
        assert_eq!(
            timers[1],
            DueTimer {
                reason: "flush".into(),
                at_ms: 2600,
                attempt: 1
            }
        );
        assert!(db.cancel("gc").unwrap());
        assert!(!db.cancel("gc").unwrap());
    }

    #[test]
    fn a_delivery_committed_mid_turn_is_retried_or_recovered_never_lost() {
        let mut db = open("deliveries");
        db.schedule("a", 100).unwrap();
        db.schedule("b", 5000).unwrap();
        let a = db.timer("a").unwrap().unwrap();

        // Taken, then a commit point inside the turn (a call-out): the
        // taking is durable, and the actor's next deadline is still a's.
        db.begin_turn().unwrap();
        db.begin_delivery(&a).unwrap();
        db.sync().unwrap();
        assert_eq!(db.timer("a").unwrap(), None);
        assert_eq!(db.next_deadline().unwrap(), Some(100));
        // The handler fails: the rollback cannot bring the row back, and
        // the retry writes it anew.
        db.rollback_turn().unwrap();
        db.redeliver(&a, 2100, 1).unwrap();
        assert_eq!(
            db.timer("a").unwrap(),
            Some(DueTimer {
                reason: "a".into(),
                at_ms: 2100,
                attempt: 1
            })
        );
        assert_eq!(db.next_deadline().unwrap(), Some(2100));

        // Taken and committed, then the process dies: the next dispatch
        // finds it due when it was, at its attempt.
        let a = db.timer("a").unwrap().unwrap();
        db.begin_turn().unwrap();
        db.begin_delivery(&a).unwrap();
        db.sync().unwrap();
        db.rollback_turn().unwrap();
        assert_eq!(db.recover_deliveries().unwrap(), 1);
        assert_eq!(db.timer("a").unwrap(), Some(a.clone()));
        assert_eq!(db.recover_deliveries().unwrap(), 0);

        // A handler that re-armed and committed before failing keeps the
        // earlier of its deadline and the retry's.
        db.begin_turn().unwrap();
        db.begin_delivery(&a).unwrap();
        db.schedule("a", 1500).unwrap();
        db.sync().unwrap();
        db.rollback_turn().unwrap();
        db.redeliver(&a, 4100, 2).unwrap();
        assert_eq!(db.timer("a").unwrap().unwrap().at_ms, 1500);
        assert_eq!(db.timer("a").unwrap().unwrap().attempt, 2);

        // The last failure drops the taken timer, not one set since.
        let a = db.timer("a").unwrap().unwrap();
        db.begin_turn().unwrap();
        db.begin_delivery(&a).unwrap();
        db.rollback_turn().unwrap();
        db.drop_delivery(&a).unwrap();
        assert_eq!(db.timer("a").unwrap(), None);
        let b = db.timer("b").unwrap().unwrap();
        db.begin_turn().unwrap();
        db.begin_delivery(&b).unwrap();
        db.schedule("b", 9000).unwrap();
        db.sync().unwrap();
        db.rollback_turn().unwrap();
        db.drop_delivery(&DueTimer {
            reason: "b".into(),
            at_ms: 5000,
            attempt: 0,
        })
        .unwrap();
        assert_eq!(db.timer("b").unwrap().unwrap().at_ms, 9000);
        assert_eq!(db.next_deadline().unwrap(), Some(9000));
    }
}
