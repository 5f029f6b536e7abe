//! The turn gate: one actor's database and the state of its current turn,
//! which every one of the actor's effects passes through.
//!
//! Invariants owned here:
//! - an actor's storage calls, SQL and timer changes all run in the one
//!   transaction of the current turn; nothing commits until the turn ends
//!   or the guest calls `sync`. The transaction begins at the turn's first
//!   storage call, so a turn that touches no storage (an echo, a reply
//!   from memory) costs the database nothing; the actor is its database's
//!   only writer, so beginning later sees the same state;
//! - the output gate: before anything the turn produced leaves the actor —
//!   an outbound request, a call to another actor — the writes that came
//!   before it are made durable ([`TurnGate::flush`], the runtime's
//!   [`OutputGate`]). A flush or commit that fails poisons the turn: the
//!   turn resets the actor instead of answering, and the caller gets
//!   `storage_commit_failed`. So does a call that took the turn's
//!   transaction with it (SQLite rolled it back on its own): nothing of
//!   the turn runs outside its transaction;
//! - every statement of a turn stops at the turn's deadline or abandonment
//!   ([`TurnGate::begin`]), and Weir's own commit and rollback are never
//!   cut by it;
//! - on a replica (cluster mode), every commit — a turn's, a barrier's, a
//!   write outside any turn — is handed to the actor's [`Durable`] in
//!   order as soon as it is made, and what leaves waits for it to settle;
//! - on one machine, a commit of a turn that scheduled or cancelled a
//!   timer is preceded by lowering the actor's row in the timer ledger to
//!   the earliest deadline the commit leaves ([`crate::timer_ledger`]),
//!   so the ledger is never later than the database, whenever the process
//!   dies;
//! - every write is bounded by what the app's storage room leaves the
//!   actor before it runs, and every turn that wrote is counted in the
//!   room when it ends ([`crate::storage_room`]);
//! - what a turn does beyond its storage (its sockets' attachments,
//!   auto-responses and accepts) is an [`Effect`]: it takes place only
//!   once the writes before it are committed — at the next commit point,
//!   or at the turn's end for what belongs to its answer — where they
//!   must become durable first (cluster mode), once they have; and never
//!   if the turn rolls back first, however it ends.

use std::sync::{Arc, Mutex, MutexGuard};

use weir_runtime::extension::OutputGate;
use weir_store::actor::{ActorDb, ActorStoreError};
use weir_store::replica::Mirror;
use weir_store::statement_bounds::StopCheck;

use crate::error_code::TurnError;
use crate::placement::{BoxFuture, Durable};
use crate::storage_room::RoomShare;
use crate::timer_ledger::LedgerRow;

/// Why a storage call of the turn failed.
pub enum GateError {
    /// An earlier commit of the turn failed: nothing more of it may run.
    Poisoned(String),
    /// The store refused or failed the call.
    Store(ActorStoreError),
}

impl std::fmt::Display for GateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GateError::Poisoned(why) => f.write_str(why),
            GateError::Store(e) => e.fmt(f),
        }
    }
}

/// Something a turn did beyond its storage, held until the turn's writes
/// before it are committed: run with `true` then, or with `false` when the
/// turn rolls back first. Dropped unrun, it runs with `false`, so that no
/// way out of a turn (an actor reset, a gate closed) leaves it half done.
pub struct Effect {
    run: Option<Box<dyn FnOnce(bool) + Send>>,
    /// Waits for the turn's end (it belongs to the turn's answer), not for
    /// a commit point inside the turn.
    at_end: bool,
}

impl Effect {
    /// An effect that takes place at the next commit of the turn.
    pub fn at_commit(run: impl FnOnce(bool) + Send + 'static) -> Effect {
        Effect {
            run: Some(Box::new(run)),
            at_end: false,
        }
    }

    /// An effect that takes place only when the turn itself commits (a
    /// socket accepted in the turn exists only if the turn's answer, its
    /// 101, goes out).
    pub fn at_end(run: impl FnOnce(bool) + Send + 'static) -> Effect {
        Effect {
            run: Some(Box::new(run)),
            at_end: true,
        }
    }

    fn finish(mut self, committed: bool) {
        if let Some(run) = self.run.take() {
            run(committed);
        }
    }
}

impl Drop for Effect {
    fn drop(&mut self) {
        if let Some(run) = self.run.take() {
            run(false);
        }
    }
}

struct GateState {
    /// Declared before `room`: it closes first, so the room then counts
    /// the files it left.
    db: ActorDb,
    /// The actor's place in the app's storage room.
    room: RoomShare,
    /// The turn called a write since it began: its footprint is counted
    /// again when it ends.
    wrote: bool,
    /// The turn has writes not yet committed.
    dirty: bool,
    /// Why a commit of this turn failed; the turn must not answer.
    failed: Option<String>,
    /// The guest scheduled or cancelled a timer since this was last read.
    timers_changed: bool,
    /// The guest scheduled or cancelled a timer since the last commit: the
    /// ledger's row is lowered before the next one.
    timers_unledgered: bool,
    /// A turn is open and its transaction has not begun: the next storage
    /// call of the turn begins it.
    unbegun: bool,
    /// What the turn did beyond its storage, in order, until it commits.
    effects: Vec<Effect>,
}

impl GateState {
    /// Counts the database's files again, after writes.
    fn recount(&mut self) {
        self.room.recount(&self.db);
    }

    /// The turn ended (committed or rolled back): what it wrote is
    /// counted.
    fn ended(&mut self) {
        if std::mem::take(&mut self.wrote) {
            self.recount();
        }
    }

    /// Bounds the database at what the storage room leaves it, before a
    /// write.
    fn bounded(&mut self) -> Result<(), ActorStoreError> {
        self.room.bound(&mut self.db)
    }

    /// Begins the open turn's transaction if it has not begun yet. A
    /// begin that fails poisons the turn: no later call may run outside
    /// the turn's transaction, and the turn may not answer.
    fn begun(&mut self) -> Result<&mut ActorDb, ActorStoreError> {
        if self.unbegun {
            if let Err(e) = self.db.begin_turn() {
                self.failed = Some(e.to_string());
                return Err(e);
            }
            self.unbegun = false;
        }
        Ok(&mut self.db)
    }

    /// Before a commit: lowers the actor's row in the timer ledger to the
    /// earliest deadline the commit leaves, if the turn changed its
    /// timers since the last commit, so that the ledger is never later
    /// than the database, even if the process dies right after.
    fn ledger_before_commit(&mut self, ledger: Option<&LedgerRow>) {
        if !self.timers_unledgered {
            return;
        }
        let Some(row) = ledger else {
            self.timers_unledgered = false;
            return;
        };
        // A read stopped by the turn's deadline is tried again at the
        // turn's last commit, which no deadline cuts.
        if let Ok(next) = self.db.next_deadline() {
            self.timers_unledgered = false;
            if let Some(at) = next {
                row.lower(at);
            }
        }
    }

    /// Poisons the turn when the call that failed with `e` took the
    /// turn's transaction with it ([`ActorDb::transaction_lost`]): what the
    /// turn wrote before is gone, so it may neither go on writing nor
    /// answer.
    fn check_lost(&mut self, e: &ActorStoreError) {
        if self.db.transaction_lost() {
            self.failed = Some(format!(
                "the database rolled the turn's transaction back ({e}); nothing of the turn was kept"
            ));
        }
    }
}

/// One actor's database and the state of its current turn.
pub struct TurnGate {
    state: Mutex<GateState>,
    /// Where a replica's commits go (cluster mode).
    durable: Option<Arc<dyn Durable>>,
    /// The actor's row in the timer ledger (on one machine).
    ledger: Option<LedgerRow>,
}

impl TurnGate {
    /// The gate of an actor whose database is `db`, counted in the app's
    /// storage room by `room`; on a replica, its commits go to `durable`;
    /// on one machine, its timers are ledgered in `ledger`.
    pub fn open(
        db: ActorDb,
        room: RoomShare,
        durable: Option<Arc<dyn Durable>>,
        ledger: Option<LedgerRow>,
    ) -> Arc<TurnGate> {
        Arc::new(TurnGate {
            state: Mutex::new(GateState {
                // A replica may have just come from another node, timers
                // and all: its first turn puts its next deadline into the
                // timer index.
                timers_changed: durable.is_some(),
                timers_unledgered: false,
                db,
                room,
                wrote: false,
                dirty: false,
                failed: None,
                unbegun: false,
                effects: Vec::new(),
            }),
            durable,
            ledger,
        })
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands what the database committed since the last call to the
    /// durable half, with what the actor's row mirrors after it.
    fn ship(&self, db: &mut ActorDb) -> Result<(), String> {
        let Some(durable) = &self.durable else {
            return Ok(());
        };
        let log = db.take_log().map_err(|e| e.to_string())?;
        if !log.is_empty() {
            let mirror = Mirror {
                alarm: db.next_deadline().map_err(|e| e.to_string())?,
                journaled: db.journaled().map_err(|e| e.to_string())?,
            };
            durable.ship(log, mirror);
        }
        Ok(())
    }

    /// Runs `f` on the database outside of any turn bookkeeping (reads,
    /// and the runner's own begin/commit).
    pub fn with_db<T>(&self, f: impl FnOnce(&mut ActorDb) -> T) -> T {
        f(&mut self.lock().db)
    }

    /// Runs `f`, which may write and commit outside any turn, and hands
    /// what it committed on; an error of `f` is its own, a shipping error
    /// says so.
    pub fn write_outside<T>(
        &self,
        f: impl FnOnce(&mut ActorDb) -> Result<T, ActorStoreError>,
    ) -> Result<T, String> {
        let mut s = self.lock();
        let value = s
            .bounded()
            .and_then(|()| f(&mut s.db))
            .map_err(|e| e.to_string());
        s.recount();
        self.ship(&mut s.db)?;
        value
    }

    /// What is left to wait for before the turn's effects may leave: the
    /// durable half settling everything shipped so far. `None` on one
    /// machine, where a local commit is the end of it.
    pub fn settled(&self) -> Option<BoxFuture<'static, Result<(), TurnError>>> {
        self.durable.as_ref().map(|d| d.settled())
    }

    /// Waits until everything committed so far is durable (in cluster
    /// mode, accepted by the cluster's database; on one machine a commit
    /// already is), saying why not.
    pub fn durable(&self) -> impl Future<Output = Result<(), String>> + Send + 'static {
        let settled = self.settled();
        async move {
            match settled {
                None => Ok(()),
                Some(settled) => settled.await.map_err(|e| {
                    format!(
                        "the actor's commits did not become durable: {}",
                        weir_runtime::WeirError::as_str(e)
                    )
                }),
            }
        }
    }

    /// Calls `done` once what the turn produced may leave (at once on one
    /// machine).
    pub fn on_settled(&self, done: Box<dyn FnOnce(Result<(), TurnError>) + Send>) {
        match &self.durable {
            Some(durable) => durable.on_settled(done),
            None => done(Ok(())),
        }
    }

    /// True when answers wait for a durable half (cluster mode).
    pub fn replicated(&self) -> bool {
        self.durable.is_some()
    }

    /// Why the actor's state here can no longer be trusted, if it cannot.
    pub fn broken(&self) -> Option<TurnError> {
        self.durable.as_ref().and_then(|d| d.broken())
    }

    /// Takes a snapshot when the durable half wants one (between turns,
    /// once everything shipped has settled).
    pub fn snapshot_if_wanted(&self) -> Result<(), String> {
        let Some(durable) = &self.durable else {
            return Ok(());
        };
        if !durable.wants_snapshot() {
            return Ok(());
        }
        let mut s = self.lock();
        self.ship(&mut s.db)?;
        if let Some((head, ltx)) = s.db.snapshot().map_err(|e| e.to_string())? {
            durable.snapshot(head, ltx);
        }
        Ok(())
    }

    /// True when a replica's WAL has grown enough to be checkpointed (see
    /// [`TurnGate::checkpoint_shipped`]).
    pub fn checkpoint_due(&self) -> bool {
        self.durable.is_some()
            && self.lock().db.wal_frames() > weir_store::replica::CHECKPOINT_WAL_FRAMES
    }

    /// Checkpoints a replica's WAL into its file: called between turns,
    /// once everything shipped has settled, so only shipped commits leave
    /// the WAL.
    pub fn checkpoint_shipped(&self) -> Result<(), String> {
        let mut s = self.lock();
        self.ship(&mut s.db)?;
        s.db.checkpoint_live().map_err(|e| e.to_string())
    }

    /// True when a snapshot would compact the log now.
    pub fn wants_snapshot(&self) -> bool {
        self.durable.as_ref().is_some_and(|d| d.wants_snapshot())
    }

    /// Starts a turn whose statements stop when `stop` says so. Its
    /// transaction begins with its first storage call.
    pub fn begin(&self, stop: StopCheck) {
        let mut s = self.lock();
        s.dirty = false;
        s.wrote = false;
        s.failed = None;
        s.timers_unledgered = false;
        s.db.watch(Some(stop));
        s.unbegun = true;
        let left = std::mem::take(&mut s.effects);
        drop(s);
        drop(left);
    }

    /// Holds `effect` until the turn's writes before it are committed (see
    /// [`Effect`]).
    pub fn defer(&self, effect: Effect) {
        self.lock().effects.push(effect);
    }

    /// Runs `effects`, whose writes are committed here: at once on one
    /// machine, once they are durable where the actor's placement keeps
    /// them otherwise (and not at all if they never are).
    fn release(&self, effects: Vec<Effect>) {
        if effects.is_empty() {
            return;
        }
        match &self.durable {
            None => effects.into_iter().for_each(|e| e.finish(true)),
            Some(durable) => durable.on_settled(Box::new(move |settled| {
                let ok = settled.is_ok();
                effects.into_iter().for_each(|e| e.finish(ok));
            })),
        }
    }

    /// Ends the turn: commits its writes, or says why they were not.
    pub fn commit(&self) -> Result<(), String> {
        let mut s = self.lock();
        // Weir's own commit is never cut by the turn's deadline.
        s.db.watch(None);
        s.unbegun = false;
        if let Some(why) = s.failed.take() {
            let _ = s.db.rollback_turn();
            s.ended();
            let effects = std::mem::take(&mut s.effects);
            drop(s);
            drop(effects);
            return Err(why);
        }
        s.dirty = false;
        s.ledger_before_commit(self.ledger.as_ref());
        let committed = s.db.commit_turn().map_err(|e| e.to_string());
        s.ended();
        let effects = std::mem::take(&mut s.effects);
        committed?;
        self.ship(&mut s.db)?;
        drop(s);
        self.release(effects);
        Ok(())
    }

    /// Drops the turn's writes.
    pub fn rollback(&self) {
        let mut s = self.lock();
        s.db.watch(None);
        s.dirty = false;
        s.unbegun = false;
        let _ = s.db.rollback_turn();
        s.ended();
        let effects = std::mem::take(&mut s.effects);
        drop(s);
        drop(effects);
    }

    /// The output gate: makes the turn's writes so far durable before
    /// anything leaves. A failure poisons the turn.
    pub fn flush(&self) -> Result<(), String> {
        let mut s = self.lock();
        if let Some(why) = &s.failed {
            return Err(why.clone());
        }
        // What came before this commit point takes place with it, but
        // what belongs to the turn's answer waits for the turn's end.
        let (now, later): (Vec<Effect>, Vec<Effect>) = std::mem::take(&mut s.effects)
            .into_iter()
            .partition(|e| !e.at_end);
        s.effects = later;
        if !s.dirty {
            drop(s);
            self.release(now);
            return Ok(());
        }
        s.ledger_before_commit(self.ledger.as_ref());
        match s
            .db
            .sync()
            .map_err(|e| e.to_string())
            .and_then(|()| self.ship(&mut s.db))
        {
            Ok(()) => {
                s.dirty = false;
                drop(s);
                self.release(now);
                Ok(())
            }
            Err(why) => {
                s.failed = Some(why.clone());
                drop(s);
                drop(now);
                Err(why)
            }
        }
    }

    /// True (once) when the guest changed its timers since the last call:
    /// the timer index then needs the actor's new earliest deadline.
    pub fn take_timers_changed(&self) -> bool {
        std::mem::take(&mut self.lock().timers_changed)
    }

    /// Why this turn may not answer, if it may not.
    pub fn failure(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    /// A read of the turn, unless the turn is poisoned.
    pub(crate) fn read<T>(
        &self,
        f: impl FnOnce(&ActorDb) -> Result<T, ActorStoreError>,
    ) -> Result<T, GateError> {
        let mut s = self.lock();
        if let Some(why) = &s.failed {
            return Err(GateError::Poisoned(why.clone()));
        }
        let db = s.begun().map_err(GateError::Store)?;
        let result = f(db);
        if let Err(e) = &result {
            s.check_lost(e);
        }
        result.map_err(GateError::Store)
    }

    /// A write that changes the actor's timers.
    pub(crate) fn write_timers<T>(
        &self,
        f: impl FnOnce(&mut ActorDb) -> Result<T, ActorStoreError>,
    ) -> Result<T, GateError> {
        let mut s = self.lock();
        s.timers_changed = true;
        s.timers_unledgered = true;
        drop(s);
        self.write(f)
    }

    /// A write of the turn, unless the turn is poisoned; the turn is dirty
    /// from then on, so the next flush commits it. (Also how a layer above
    /// writes its own rows in the turn: the launch journal.)
    pub fn write<T>(
        &self,
        f: impl FnOnce(&mut ActorDb) -> Result<T, ActorStoreError>,
    ) -> Result<T, GateError> {
        let mut s = self.lock();
        if let Some(why) = &s.failed {
            return Err(GateError::Poisoned(why.clone()));
        }
        let result = s.bounded().and_then(|_| s.begun()).and_then(f);
        if let Err(e) = &result {
            s.check_lost(e);
        }
        s.dirty = true;
        s.wrote = true;
        result.map_err(GateError::Store)
    }
}

impl OutputGate for TurnGate {
    fn flush(&self) -> Result<(), String> {
        TurnGate::flush(self)
    }

    fn settle(&self) -> Option<BoxFuture<'static, Result<(), String>>> {
        let settled = self.settled()?;
        Some(Box::pin(async move {
            settled.await.map_err(|e| {
                use weir_runtime::WeirError;
                e.as_str().to_string()
            })
        }))
    }
}

#[cfg(test)]
mod tests {
    use weir_store::Durability;
    use weir_store::timer_ledger::{LEDGER_FILE, TimerLedger};

    use super::*;
    use crate::address::ActorAddress;
    use crate::storage_room::StorageRoom;

    #[test]
    fn a_commit_that_brings_a_timer_forward_lowers_the_ledger_first() {
        let dir = weir_scratch::dir("gate-ledger");
        std::fs::create_dir_all(&dir).unwrap();
        let ledger =
            Arc::new(TimerLedger::open(&dir.join(LEDGER_FILE), Durability::Process).unwrap());
        let actor = ActorAddress::new("probe", "a").unwrap();
        let path = dir.join("a.sqlite3");
        let mut db = ActorDb::open(&path, Durability::Process).unwrap();
        let room =
            RoomShare::open(Arc::new(StorageRoom::default()), path, &mut db, 0, 1 << 30).unwrap();
        let gate = TurnGate::open(db, room, None, Some(LedgerRow::new(ledger.clone(), actor)));
        let row = || ledger.get("probe", "a").unwrap();
        let turn = |f: &dyn Fn(&mut ActorDb) -> Result<(), ActorStoreError>, commit: bool| {
            gate.begin(Arc::new(|| false));
            gate.write_timers(|db| f(db)).ok().unwrap();
            if commit {
                gate.commit().unwrap();
            } else {
                gate.rollback();
            }
        };

        turn(&|db| db.schedule("x", 500), true);
        assert_eq!(row(), Some(500), "the commit alone left the row");
        // A rolled-back turn lowers nothing.
        turn(&|db| db.schedule("y", 100), false);
        assert_eq!(row(), Some(500));
        // An earlier timer lowers it; a later one never raises it (the
        // holder sets the exact value after the commit).
        turn(&|db| db.schedule("y", 300), true);
        assert_eq!(row(), Some(300));
        turn(&|db| db.cancel("y").map(drop), true);
        assert_eq!(row(), Some(300));
        // A mid-turn sync is a commit too.
        gate.begin(Arc::new(|| false));
        gate.write_timers(|db| db.schedule("z", 200)).ok().unwrap();
        gate.flush().unwrap();
        assert_eq!(row(), Some(200), "lowered at the sync");
        gate.commit().unwrap();
        // A turn that only writes data leaves the row alone.
        gate.begin(Arc::new(|| false));
        gate.write(|db| db.put("k", b"v")).ok().unwrap();
        gate.commit().unwrap();
        assert_eq!(row(), Some(200));
    }
}
