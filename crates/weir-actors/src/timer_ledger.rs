//! The timer ledger as the actor host keeps it, on one machine: a start
//! indexes every actor's next deadline from it (one range read per
//! 4,096 rows) before the timer pass has opened a single database, so a
//! timer due at a restart fires on time however many actors are on disk.
//! (In cluster mode each actor's row in the cluster's database carries
//! its alarm instead.)
//!
//! Invariants owned here (the ledger's own rules are
//! [`weir_store::timer_ledger`]'s):
//! - a turn that changed its timers lowers its actor's row to its new
//!   earliest deadline before its writes commit ([`LedgerRow`], called by
//!   the turn gate), and whoever holds the actor sets the exact value
//!   after (`ActorHost::ledger_exact`): after its turns and after the
//!   timer pass's read. A deleted actor's row, or one a delivery finds
//!   gone, is removed at once (`ActorHost::ledger_remove`);
//! - the ledger never decides alone: a row armed at start is checked
//!   against the actor's database when it falls due (a delivery that
//!   finds nothing due sets the row exact), and the timer pass still reads
//!   every database, so a row a power loss took is put back;
//! - a ledger file that is not a database or is corrupt is made again (it
//!   is derived); one that cannot be opened otherwise (busy, unreadable)
//!   is left alone and the host runs without a ledger, as before it:
//!   timers are then found by the pass alone. Neither stops the server; a
//!   write that fails is a warning, never a failed turn.

use std::path::Path;
use std::sync::Arc;

use weir_store::Durability;
use weir_store::timer_ledger::{LEDGER_FILE, TimerLedger};

use crate::address::ActorAddress;
use crate::host::ActorHost;

/// What the ledger's commits survive: a process crash, whatever the actors'
/// databases are kept with. A lowered row is written before the actor's
/// commit, so a crash of the process never finds the row later than the
/// database; with `Durability::Fsync` a power loss may take a row the
/// actor's database kept, and the timer pass puts it back (late, never
/// lost). Fsyncing the ledger too would add two fsyncs to every turn that
/// moves a timer.
const LEDGER_DURABILITY: Durability = Durability::Process;

/// Opens the ledger of the actors under `root`, made again if the file
/// there is not a database or is corrupt; `None` when no ledger can be had.
pub(crate) fn open(root: &Path) -> Option<Arc<TimerLedger>> {
    let path = root.join(LEDGER_FILE);
    let opened = std::fs::create_dir_all(root)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            TimerLedger::open_or_remake(&path, LEDGER_DURABILITY).map_err(|e| e.to_string())
        });
    match opened {
        Ok((ledger, remade)) => {
            if let Some(error) = remade {
                tracing::warn!(path = %path.display(), %error, "the timer ledger could not be used and was made again; the timer pass fills it from the actors' databases");
            }
            Some(Arc::new(ledger))
        }
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "no timer ledger; timers are found by the timer pass alone");
            None
        }
    }
}

/// One actor's row, as its turn gate lowers it before a commit.
pub struct LedgerRow {
    ledger: Arc<TimerLedger>,
    actor: ActorAddress,
}

impl LedgerRow {
    pub(crate) fn new(ledger: Arc<TimerLedger>, actor: ActorAddress) -> LedgerRow {
        LedgerRow { ledger, actor }
    }

    /// Brings the row down to `at_ms`, the earliest deadline the commit
    /// about to be made leaves.
    pub(crate) fn lower(&self, at_ms: i64) {
        if let Err(e) = self
            .ledger
            .lower(&self.actor.class, &self.actor.name, at_ms)
        {
            tracing::warn!(actor = %self.actor, error = %e, "cannot lower the actor's row in the timer ledger; after a crash its timer is found by the timer pass");
        }
    }
}

impl ActorHost {
    /// Indexes every actor the ledger names (of a declared class) at its
    /// row's deadline; how many. The rows of a class no longer declared
    /// are removed: classes change only at a start, and if the class comes
    /// back the timer pass writes its rows again.
    pub(crate) fn arm_from_ledger(&self) -> usize {
        let Some(ledger) = &self.ledger else {
            return 0;
        };
        let began = std::time::Instant::now();
        let mut armed = 0;
        let mut undeclared = std::collections::BTreeSet::new();
        let read = ledger.read(|class, name, at_ms| {
            if !self.classes.contains_key(class) {
                if !undeclared.contains(class) {
                    undeclared.insert(class.to_string());
                }
                return;
            }
            if let Ok(actor) = ActorAddress::new(class, name) {
                // Lowered, never raised: a turn may have set its exact
                // deadline already, which the row is no later than.
                self.timers.lower(&actor, at_ms);
                armed += 1;
            }
        });
        for class in &undeclared {
            match ledger.remove_class(class) {
                Ok(rows) => {
                    tracing::info!(%class, rows, "removed the timer ledger's rows of a class no longer declared")
                }
                Err(e) => {
                    tracing::warn!(%class, error = %e, "cannot remove the timer ledger's rows of a class no longer declared")
                }
            }
        }
        match read {
            Ok(_) => tracing::info!(
                actors = armed,
                took_ms = began.elapsed().as_millis() as u64,
                "indexed the timers the timer ledger holds"
            ),
            Err(e) => {
                tracing::warn!(error = %e, armed, "the timer ledger could not be read to its end; the timer pass finds the rest")
            }
        }
        armed
    }

    /// Writes the ledger's exact rows still waiting, at the server's
    /// clean stop.
    pub fn stop_with_server(&self) {
        if let Some(ledger) = &self.ledger
            && let Err(e) = ledger.flush()
        {
            tracing::warn!(error = %e, "cannot write the timer ledger's exact rows at the stop; the next start wakes their actors early");
        }
    }

    /// Removes an actor's row at once: it was deleted, or found gone.
    pub(crate) fn ledger_remove(&self, actor: &ActorAddress) {
        let Some(ledger) = &self.ledger else {
            return;
        };
        if let Err(e) = ledger.remove(&actor.class, &actor.name) {
            tracing::warn!(actor = %actor, error = %e, "cannot remove the actor's row from the timer ledger; its delivery finds it gone");
        }
    }

    /// Sets an actor's row to its exact next deadline (written within
    /// `EXACT_WRITE_DELAY`, with others): only under the actor's hold,
    /// with nothing of it left to commit.
    pub(crate) fn ledger_exact(&self, actor: &ActorAddress, next: Option<i64>) {
        let Some(ledger) = &self.ledger else {
            return;
        };
        ledger.set(&actor.class, &actor.name, next);
    }
}
