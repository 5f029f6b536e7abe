//! Handover (cluster mode): a resident process runs on the node that holds
//! its owner, and only while that node holds it; its launch journal row is
//! in the owner's storage, which the cluster keeps, so the node that holds
//! the owner next starts it again, by the rules a crash's restart follows
//! ([`crate::fenced_work`]).
//!
//! Invariants owned here:
//! - a process runs only while its node holds its owner under a lease it
//!   holds by its own clock: that is checked every
//!   [`HANDOVER_CHECK_INTERVAL`], and a process whose owner is no longer
//!   held is stopped with its journal row kept (receipt `stopped`), before
//!   any other node may claim the owner (the node's own end of its lease
//!   comes a safety margin before the cluster's);
//! - wherever an owner's storage opens, the rows of processes not running
//!   there are owed, and are re-driven (once, then lost) before any turn
//!   of the owner runs; the row of a process that ended by itself there,
//!   whose deletion is still on its way, is not owed;
//! - an owner whose processes this node stopped is taken over again as
//!   soon as this node holds it again (its lease came back), without
//!   waiting for a call; if another node holds it, that node does;
//! - an owner whose node died is claimed by a live node (its journal is
//!   mirrored in its cluster row) and opened there, which takes it over;
//! - a take-over that failed (the owner's storage could not be opened, or
//!   its journal not made durable) is tried again, later each time up to
//!   [`TAKE_OVER_RETRY_MAX`], for as long as this node holds the owner;
//! - a spawn that ended with its launch row written and its process not
//!   up (cut at the turn's deadline, or its row not confirmed by the
//!   cluster, which may hold it all the same) owes its owner a take-over,
//!   on one machine as in cluster mode: the row's launch is re-driven by
//!   the rules of a crash, and the owner told. No failure leaves a launch
//!   owed and running nowhere until a call, or a restart, happens to
//!   come.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_actors::gate::TurnGate;
use weir_actors::operators::AdminError;
use weir_actors::placement::BoxFuture;
use weir_actors::{ActorAddress, ActorHost, Handover, Location};
use weir_store::actor::JournalRow;

use crate::host::ProgramsHost;
use crate::process_table::Owner;
use crate::recovery::tell;

/// How often a node checks that it still holds the owners of its
/// processes: half the smallest safety margin between a node's own end of
/// its lease and the cluster's (50 ms), so a process is stopped before any
/// other node may claim its owner.
pub const HANDOVER_CHECK_INTERVAL: Duration = Duration::from_millis(25);

/// The wait before a failed take-over is tried again the first time:
/// long enough that a failure that ends at once (a refused connection)
/// is not retried in a tight loop, short enough that a blip costs its
/// processes little. It doubles with each failure.
pub const TAKE_OVER_RETRY_FIRST: Duration = Duration::from_millis(250);

/// The longest wait between tries of a take-over that keeps failing:
/// the cluster's call timeout, so an owner whose storage cannot be read
/// costs the database one attempt at a time, and its processes are back
/// within this much of the database answering again.
pub const TAKE_OVER_RETRY_MAX: Duration = Duration::from_secs(5);

/// Owners whose processes are owed a take-over on this node: stopped here
/// because it no longer held them, claimed without a call, or whose
/// take-over failed; each with when it is tried next.
#[derive(Default)]
pub struct Owed {
    owed: Mutex<HashMap<Owner, Attempt>>,
    /// The images of launches owed here, rooted until their take-over is
    /// done (its re-drives root what they start themselves), so that a
    /// sweep meanwhile spares what is about to start.
    roots: Mutex<HashMap<Owner, Vec<crate::image_store::Root>>>,
    /// Rung when an owner is owed a take-over at once: the check runs
    /// then rather than at its next tick.
    due_now: Arc<tokio::sync::Notify>,
    /// Take-overs an opening of an owner's storage runs now.
    openings: std::sync::atomic::AtomicUsize,
}

#[derive(Clone, Copy, Debug)]
struct Attempt {
    /// Not tried before this.
    at: Instant,
    /// The wait after this try, if it fails.
    wait: Duration,
    /// A take-over of it runs now.
    running: bool,
    /// Owed again while a take-over of it ran (that one may have read its
    /// journal before the new row): tried once more after it.
    again: bool,
}

impl Owed {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, Attempt>> {
        self.owed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `owner` is owed a take-over, to be tried at once (kept as it is if
    /// it already was).
    fn owe(&self, owner: Owner) {
        self.insert(owner, Instant::now(), TAKE_OVER_RETRY_FIRST);
    }

    /// Owes `owner` a take-over from `at`, with `wait` after a failure,
    /// unless it is owed already (then, if a try of it runs, once more
    /// after that one).
    fn insert(&self, owner: Owner, at: Instant, wait: Duration) {
        match self.lock().entry(owner) {
            std::collections::hash_map::Entry::Vacant(owed) => {
                owed.insert(Attempt {
                    at,
                    wait,
                    running: false,
                    again: false,
                });
                self.due_now.notify_one();
            }
            std::collections::hash_map::Entry::Occupied(mut owed) => {
                let attempt = owed.get_mut();
                attempt.again |= attempt.running;
            }
        }
    }

    /// The owners whose next try is due and not running.
    fn due(&self, now: Instant) -> Vec<Owner> {
        self.lock()
            .iter()
            .filter(|(_, a)| !a.running && a.at <= now)
            .map(|(owner, _)| owner.clone())
            .collect()
    }

    /// Marks a try of `owner` running: false if it is no longer owed, or
    /// a try of it already runs.
    fn start(&self, owner: &Owner) -> bool {
        match self.lock().get_mut(owner) {
            Some(attempt) if !attempt.running => {
                attempt.running = true;
                true
            }
            _ => false,
        }
    }

    /// The try of `owner` (or an opening) took over everything it found:
    /// nothing more is owed here, unless it was owed again meanwhile.
    fn done(&self, owner: &Owner) {
        let mut owed = self.lock();
        match owed.get_mut(owner) {
            Some(attempt) if attempt.again => {
                *attempt = Attempt {
                    at: Instant::now(),
                    wait: TAKE_OVER_RETRY_FIRST,
                    running: false,
                    again: false,
                };
                self.due_now.notify_one();
            }
            _ => {
                owed.remove(owner);
                drop(owed);
                self.roots
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(owner);
            }
        }
    }

    /// The running take-over of `owner` failed: it is tried again after
    /// its wait, which doubles for the try after; that wait.
    fn retry(&self, owner: &Owner) -> Duration {
        let mut owed = self.lock();
        let attempt = owed.entry(owner.clone()).or_insert(Attempt {
            at: Instant::now(),
            wait: TAKE_OVER_RETRY_FIRST,
            running: true,
            again: false,
        });
        let wait = attempt.wait;
        *attempt = Attempt {
            at: Instant::now() + wait,
            wait: (wait * 2).min(TAKE_OVER_RETRY_MAX),
            running: false,
            again: false,
        };
        wait
    }

    /// A take-over of `owner` outside a try of this set (an opening a
    /// call brought) failed, or a spawn ended with its launch running
    /// nowhere: owed, tried after the first wait. An owner already owed
    /// keeps its own next try (and is tried once more after a try that
    /// runs now).
    pub(crate) fn owe_later(&self, owner: Owner, root: Option<crate::image_store::Root>) {
        if let Some(root) = root {
            self.roots
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(owner.clone())
                .or_default()
                .push(root);
        }
        self.insert(
            owner,
            Instant::now() + TAKE_OVER_RETRY_FIRST,
            TAKE_OVER_RETRY_FIRST * 2,
        );
    }

    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Take-overs owed here (waiting for their try, or running one) and
    /// those openings run now: 0 once every launch this node was owed is
    /// running or lost, which is when a count of re-drives is final until
    /// an owner moves again.
    pub(crate) fn pending(&self) -> usize {
        self.lock().len() + self.openings.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Counts an opening's take-over among [`Owed::pending`] while it runs.
struct Opening<'a>(&'a Owed);

impl<'a> Opening<'a> {
    fn new(owed: &'a Owed) -> Self {
        owed.openings
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Opening(owed)
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        self.0
            .openings
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn address(owner: &Owner) -> Option<ActorAddress> {
    ActorAddress::new(&owner.class, &owner.name).ok()
}

impl ProgramsHost {
    /// Binds this node's programs to its actor host: in cluster mode told
    /// of each opening of an owner's storage; in both modes checking every
    /// [`HANDOVER_CHECK_INTERVAL`] (and at once when an owner is newly
    /// owed) the owners owed a take-over here, and in cluster mode that
    /// this node still holds its processes' owners, until either is
    /// dropped.
    pub(crate) fn start_handover(self: &Arc<Self>, actors: &Arc<ActorHost>) {
        if actors.placement().is_some() {
            actors.bind_handover(self.clone());
        }
        let due_now = self.owed.due_now.clone();
        let (programs, actors) = (Arc::downgrade(self), Arc::downgrade(actors));
        tokio::spawn(async move {
            loop {
                // On one machine with nothing owed there is nothing to
                // check until an owner is owed.
                let tick = {
                    let (Some(programs), Some(actors)) = (programs.upgrade(), actors.upgrade())
                    else {
                        return;
                    };
                    actors.placement().is_some() || !programs.owed.is_empty()
                };
                tokio::select! {
                    _ = tokio::time::sleep(HANDOVER_CHECK_INTERVAL), if tick => {}
                    _ = due_now.notified() => {}
                }
                let (Some(programs), Some(actors)) = (programs.upgrade(), actors.upgrade()) else {
                    return;
                };
                programs.check_holds(&actors).await;
            }
        });
    }

    /// Stops the processes whose owner this node no longer holds, and
    /// takes over the owners owed a take-over here whose try is due.
    async fn check_holds(self: &Arc<Self>, actors: &Arc<ActorHost>) {
        let placement = actors.placement();
        if let Some(placement) = placement {
            for process in self.table.all() {
                if process.stop_asked() || process.ended().is_some() {
                    continue;
                }
                let Some(actor) = address(&process.owner) else {
                    continue;
                };
                if placement.owns(&actor) {
                    continue;
                }
                tracing::warn!(owner = %process.owner, pid = process.pid, "this node no longer holds the owner of a resident process; stopping it, its launch kept for the owner's next node");
                self.owed.owe(process.owner.clone());
                tokio::spawn(async move { process.stop_for_handover().await });
            }
        }
        for owner in self.owed.due(Instant::now()) {
            let Some(actor) = address(&owner) else {
                self.owed.done(&owner);
                continue;
            };
            // On one machine every owner is here. In cluster mode an owner
            // is kept while the lease is not held: the answer may yet be
            // here.
            let here = match placement {
                None => Ok(Location::Here),
                Some(placement) => placement.locate(&actor, false, true).await,
            };
            match here {
                Ok(Location::Here) => {
                    if self.owed.start(&owner) {
                        let (programs, actors) = (self.clone(), actors.clone());
                        tokio::spawn(async move { programs.take_over(&actors, &owner).await });
                    }
                }
                // The node that holds it takes it over as it opens it.
                Ok(Location::Elsewhere(_)) => self.owed.done(&owner),
                Err(_) => {}
            }
        }
    }

    /// Takes over `owner`, which this node holds and which is owed a
    /// take-over here: held and opened (which takes it over if its storage
    /// was closed), then its owed rows re-driven (none if the opening
    /// did). A failure that may pass is tried again later
    /// ([`Owed::retry`]).
    async fn take_over(&self, actors: &Arc<ActorHost>, owner: &Owner) {
        // A node that is stopping starts nothing: the next holder will.
        if self.stopping() {
            self.owed.done(owner);
            return;
        }
        let taken = async {
            let mut held =
                actors
                    .hold_open(&owner.class, &owner.name)
                    .await
                    .map_err(|e| match e {
                        // Nothing of it here to take over, now or later.
                        AdminError::NotFound(_)
                        | AdminError::UnknownClass(_)
                        | AdminError::Address(_) => None,
                        e => Some(e.to_string()),
                    })?;
            let told = self
                .redrive(&mut held, owner, |row| self.owed(owner, row))
                .await
                .map_err(Some)?;
            tell(actors, &mut held, told).await;
            Ok::<(), Option<String>>(())
        };
        match taken.await {
            Ok(()) | Err(None) => self.owed.done(owner),
            Err(Some(e)) => {
                let wait = self.owed.retry(owner);
                tracing::warn!(%owner, error = %e, retry_in_ms = wait.as_millis() as u64, "cannot take over the resident processes of an owner this node holds; trying again");
            }
        }
    }

    /// A row is owed here unless its process runs here, or ended here by
    /// itself (its row's deletion on its way).
    fn owed(&self, owner: &Owner, row: &JournalRow) -> bool {
        self.table.get(owner, row.pid).is_none()
            && self
                .table
                .recent(owner, row.pid)
                .is_none_or(|ended| ended.launch_kept())
    }

    /// Takes over what `owner`'s journal says is owed, its storage just
    /// opened here (`gate`) and the owner held. What fails is owed a
    /// take-over later.
    async fn opened_here(&self, owner: Owner, gate: &Arc<TurnGate>) {
        if self.stopping() {
            return;
        }
        let _opening = Opening::new(&self.owed);
        let rows = match gate.with_db(|db| db.journal()) {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(%owner, error = %e, "cannot read the launch journal of an owner opened here");
                self.owed.owe_later(owner, None);
                return;
            }
        };
        let owed: Vec<JournalRow> = rows
            .into_iter()
            .filter(|row| self.owed(&owner, row))
            .collect();
        if owed.is_empty() {
            return;
        }
        tracing::info!(%owner, processes = owed.len(), "taking over the resident processes of an owner opened here");
        let _roots = self.root_images(&owed);
        let mut journal = gate.clone();
        let told = match self
            .redrive(&mut journal, &owner, |row| self.owed(&owner, row))
            .await
        {
            Ok(told) => {
                self.owed.done(&owner);
                told
            }
            Err(e) => {
                tracing::warn!(%owner, error = %e, "cannot take over the resident processes of an owner opened here; trying again");
                self.owed.owe_later(owner, None);
                return;
            }
        };
        // The owner hears of it in turns of its own, once this opening's
        // turn is over.
        let (Some(actors), false) = (self.fence.actors(), told.is_empty()) else {
            return;
        };
        tokio::spawn(async move {
            if let Ok(mut held) = actors.exclusive(&owner.class, &owner.name).await {
                tell(&actors, &mut held, told).await;
            }
        });
    }
}

impl ProgramsHost {
    /// Take-overs of resident processes owed or running on this node
    /// (owed, waiting for their try or running one, and openings running
    /// one): what `/status` shows as `take_overs.pending`.
    pub fn take_overs_pending(&self) -> usize {
        self.owed.pending()
    }
}

impl Handover for ProgramsHost {
    fn opened<'a>(&'a self, actor: &'a ActorAddress, gate: &'a Arc<TurnGate>) -> BoxFuture<'a, ()> {
        Box::pin(self.opened_here(Owner::from(actor), gate))
    }

    fn claimed(&self, actor: ActorAddress) {
        self.owed.owe(Owner::from(&actor));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process_table::owner;

    #[test]
    fn an_owed_owner_is_tried_once_at_a_time_and_later_after_each_failure() {
        let owed = Owed::default();
        let a = owner("a");
        owed.owe(a.clone());
        assert_eq!(owed.due(Instant::now()), std::slice::from_ref(&a));
        assert!(owed.start(&a));
        assert!(!owed.start(&a), "one try at a time");
        assert!(owed.due(Instant::now()).is_empty());
        // Each failure waits longer, up to the most.
        let mut waits = Vec::new();
        for _ in 0..7 {
            waits.push(owed.retry(&a).as_millis());
            assert!(owed.due(Instant::now()).is_empty(), "not before its wait");
            assert!(owed.start(&a));
        }
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 5000, 5000]);
        owed.done(&a);
        assert!(owed.is_empty());
    }

    #[test]
    fn an_owner_owed_again_during_its_try_is_tried_once_more() {
        let owed = Owed::default();
        let a = owner("a");
        owed.owe(a.clone());
        assert!(owed.start(&a));
        // A spawn of it ended running nowhere while the try ran: the try
        // may have read the journal before that row.
        owed.owe_later(a.clone(), None);
        owed.done(&a);
        assert_eq!(owed.due(Instant::now()), std::slice::from_ref(&a));
        assert!(owed.start(&a));
        owed.done(&a);
        assert!(owed.is_empty());
        // Owed again while not running: it keeps its own next try.
        owed.owe_later(a.clone(), None);
        owed.owe(a.clone());
        assert!(
            owed.due(Instant::now()).is_empty(),
            "still after its first wait"
        );
    }
}
