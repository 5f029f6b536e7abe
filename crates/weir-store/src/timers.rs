//! The named timers' rows in an actor's database (`_weir_timers`): one
//! deadline per reason, the earliest kept; an alarm turn consumes the due
//! timer it runs, and a failed one is left for a retry (when and how often
//! is `weir_actors::timers`'s).

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

    /// The earliest deadline, for the dispatcher's wake-up.
    pub fn next_deadline(&self) -> Result<Option<i64>, ActorStoreError> {
        // Cached: in cluster mode every commit asks it (its row carries
        // the alarm), and preparing it each time cost more than the query.
        Ok(self
            .conn
            .prepare_cached("SELECT min(at_ms) FROM _weir_timers")?
            .query_row([], |r| r.get(0))?)
    }

    /// Starts the alarm turn of a due reason: the turn consumes the timer,
    /// so a handler's re-arm is a new timer and a rolled-back turn restores it.
    pub fn begin_alarm(&mut self, reason: &str) -> Result<(), ActorStoreError> {
        self.begin_turn()?;
        self.cancel(reason)?;
        Ok(())
    }

    /// After a failed alarm turn (rolled back): retry at `at_ms`, counting
    /// the attempt.
    pub fn retry_alarm(
        &mut self,
        reason: &str,
        at_ms: i64,
        attempt: u32,
    ) -> Result<(), ActorStoreError> {
        self.conn
            .prepare_cached("UPDATE _weir_timers SET at_ms = ?2, attempt = ?3 WHERE reason = ?1")?
            .execute(params![reason, at_ms, attempt])?;
        Ok(())
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
        // consumed one, and not part of the snapshot already taken.
        db.begin_alarm("flush").unwrap();
        db.schedule("flush", 600).unwrap();
        db.commit_turn().unwrap();
        assert_eq!(db.due(600).unwrap()[0].at_ms, 600);

        // A failed alarm turn leaves its timer for a retry.
        db.begin_alarm("flush").unwrap();
        db.rollback_turn().unwrap();
        db.retry_alarm("flush", 2600, 1).unwrap();
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
}
