//! The share of the request workers that long guest computations may take.
//!
//! Every store yields to tokio at each epoch tick ([`crate::engine`]), but
//! a yield only puts the call at the back of the workers' queue: with a
//! few calls computing, every other request waits behind one slice of each
//! of them at every step of its way through the server (measured: 8
//! computing calls made another request take 204 ms at p50).
//!
//! Invariants owned here:
//! - a call that has been interrupted [`LONG_CALL_SLICES`] times is a long
//!   computation, and long computations together start at most
//!   `slices_per_tick` slices per epoch tick. With one fewer than there are
//!   workers, the calls that answer within their first slices — the usual
//!   request — always find a worker, however many long computations run;
//! - each slice goes to the app ([`ShareTenant`]) with long computations
//!   waiting that was served longest ago, and within an app to its
//!   computations first come, first served: an app with many long
//!   computations does not take a larger part of the share than an app
//!   with one. (Longest ago, not a queue of apps: a computation asks for
//!   its next slice just after the tick that ended its last one handed
//!   its slices out, and would otherwise always queue behind an app that
//!   never stops asking.)
//!
//! The share's ticker advances the epoch of the engines it serves and
//! then hands out the tick's slices, so a slice given at a tick lasts the
//! whole tick. A long computation waits for its next slice as a pending
//! future: its call's own deadline still ends it, and it holds no worker
//! while it waits. Between two slices it holds nothing, so one that then
//! waits on I/O takes nothing from the others.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::epoch_ticker::EpochTicker;

/// Interruptions after which a call is a long computation. The first
/// interruption of a call can come as it enters the guest (its store's
/// deadline passed while it was idle), the next at the first tick it
/// computes through; the third means it has computed through at least
/// one whole tick (5 ms), while a request that answers takes well under a
/// millisecond.
pub const LONG_CALL_SLICES: u32 = 3;

/// The slices long computations may start per tick on a runtime of
/// `workers` worker threads: `long_call_workers` as the operator set it,
/// or else every worker but one, so that one is always free for the calls
/// that answer (and at least one).
pub fn slices_per_tick(workers: usize, long_call_workers: usize) -> usize {
    match long_call_workers {
        0 => workers.saturating_sub(1),
        n => n,
    }
    .max(1)
}

/// The slices long computations may start per tick, shared by every
/// engine that serves requests.
pub struct ComputeShare {
    grants: Arc<Mutex<GrantState>>,
    slices_per_tick: usize,
    engines: Arc<Mutex<Vec<wasmtime::Engine>>>,
    _ticker: EpochTicker,
}

/// Who gets the next slices.
struct GrantState {
    /// Slices left in this tick.
    available: usize,
    /// Each app's waiting computations, by its seat number.
    seats: Vec<SeatQueue>,
    /// Slices handed out so far: the clock of `SeatQueue::served`.
    handed: u64,
}

struct SeatQueue {
    /// None once the app is gone (its number is then given to the next).
    counters: Option<Arc<SeatCounters>>,
    /// A waiter whose call ended meanwhile is skipped.
    waiters: VecDeque<oneshot::Sender<()>>,
    /// When the seat was last given a slice (`GrantState::handed`).
    served: u64,
}

impl SeatQueue {
    /// A seat with nobody waiting, never served; `None` is a free number.
    fn new(counters: Option<Arc<SeatCounters>>) -> Self {
        SeatQueue {
            counters,
            waiters: VecDeque::new(),
            served: 0,
        }
    }
}

/// What operators see of one app's part.
struct SeatCounters {
    app: Arc<str>,
    granted: AtomicU64,
    waiting: AtomicU64,
}

/// A moment's view of the share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareStatus {
    pub slices_per_tick: usize,
    /// Slices the apps being served were given, together.
    pub slices_granted: u64,
    /// Their long computations waiting now, together.
    pub waiting: u64,
    /// Per app: its name, the slices it was given, its computations
    /// waiting now.
    pub apps: Vec<(Arc<str>, u64, u64)>,
}

/// The share's ticker could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the compute share's epoch ticker: {cause}")]
pub struct ShareError {
    cause: std::io::Error,
}

impl ComputeShare {
    /// A share of `slices_per_tick` slices per tick (at least one).
    pub fn new(slices_per_tick: usize) -> Result<Arc<Self>, ShareError> {
        let slices_per_tick = slices_per_tick.max(1);
        let grants = Arc::new(Mutex::new(GrantState {
            available: slices_per_tick,
            seats: Vec::new(),
            handed: 0,
        }));
        let engines: Arc<Mutex<Vec<wasmtime::Engine>>> = Arc::default();
        let ticker = {
            let grants = grants.clone();
            let engines = engines.clone();
            EpochTicker::start(move || {
                for engine in lock(&engines).iter() {
                    engine.increment_epoch();
                }
                // The slices not taken do not add up: at most a tick's
                // worth is ever there.
                let mut state = lock(&grants);
                state.available = slices_per_tick;
                state.hand_out();
            })
            .map_err(|cause| ShareError { cause })?
        };
        Ok(Arc::new(ComputeShare {
            grants,
            slices_per_tick,
            engines,
            _ticker: ticker,
        }))
    }

    /// From now on the share's ticker advances `engine`'s epoch.
    pub(crate) fn tick(&self, engine: wasmtime::Engine) {
        lock(&self.engines).push(engine);
    }

    /// The seat of the app called `app`: its long computations queue there.
    pub fn seat(&self, app: &str) -> ShareTenant {
        let counters = Arc::new(SeatCounters {
            app: app.into(),
            granted: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
        });
        let mut state = lock(&self.grants);
        let queue = SeatQueue::new(Some(counters.clone()));
        let number = match state.seats.iter().position(|s| s.counters.is_none()) {
            Some(free) => {
                state.seats[free] = queue;
                free
            }
            None => {
                state.seats.push(queue);
                state.seats.len() - 1
            }
        };
        ShareTenant(Arc::new(Seat {
            grants: self.grants.clone(),
            number,
            counters,
        }))
    }

    pub fn status(&self) -> ShareStatus {
        let apps: Vec<_> = lock(&self.grants)
            .seats
            .iter()
            .filter_map(|s| s.counters.as_ref())
            .map(|c| {
                (
                    c.app.clone(),
                    c.granted.load(Ordering::Relaxed),
                    c.waiting.load(Ordering::Relaxed),
                )
            })
            .collect();
        ShareStatus {
            slices_per_tick: self.slices_per_tick,
            slices_granted: apps.iter().map(|(_, granted, _)| granted).sum(),
            waiting: apps.iter().map(|(_, _, waiting)| waiting).sum(),
            apps,
        }
    }
}

impl GrantState {
    /// The seat with computations waiting that was served longest ago.
    fn next_seat(&self) -> Option<usize> {
        self.seats
            .iter()
            .enumerate()
            .filter(|(_, seat)| !seat.waiters.is_empty())
            .min_by_key(|(_, seat)| seat.served)
            .map(|(number, _)| number)
    }

    /// One slice to seat `number`.
    fn serve(&mut self, number: usize) {
        self.available -= 1;
        self.handed += 1;
        self.seats[number].served = self.handed;
    }

    /// Gives the tick's slices out, each to the seat served longest ago.
    fn hand_out(&mut self) {
        while self.available > 0 {
            let Some(number) = self.next_seat() else {
                return;
            };
            while let Some(waiter) = self.seats[number].waiters.pop_front() {
                if waiter.send(()).is_ok() {
                    self.serve(number);
                    break;
                }
            }
        }
    }

    /// A slice now, if one is left and nobody waits; else a place in the
    /// seat's queue.
    fn take_or_queue(&mut self, number: usize) -> Option<oneshot::Receiver<()>> {
        if self.available > 0 && self.next_seat().is_none() {
            self.serve(number);
            return None;
        }
        let (sender, receiver) = oneshot::channel();
        self.seats[number].waiters.push_back(sender);
        Some(receiver)
    }
}

/// One app's seat in the share, for the stores of its workers and actors.
#[derive(Clone)]
pub struct ShareTenant(Arc<Seat>);

struct Seat {
    grants: Arc<Mutex<GrantState>>,
    number: usize,
    counters: Arc<SeatCounters>,
}

impl ShareTenant {
    /// What a long computation does at an interruption: it takes its place
    /// in its app's queue now (a place taken only once the task is polled
    /// again could come after the next tick's slices were handed out),
    /// then waits for its slice; a slice had at once still yields to tokio
    /// first, so its call's timers run.
    pub(crate) fn next_slice(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let seat = self.0.clone();
        let turn = lock(&seat.grants).take_or_queue(seat.number);
        Box::pin(async move {
            match turn {
                None => tokio::task::yield_now().await,
                Some(turn) => {
                    let _waiting = Waiting::new(&seat.counters.waiting);
                    // The sender goes only with the share itself; the call
                    // goes on either way.
                    let _ = turn.await;
                }
            }
            seat.counters.granted.fetch_add(1, Ordering::Relaxed);
        })
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut state = lock(&self.grants);
        state.seats[self.number] = SeatQueue::new(None);
    }
}

/// Counted as waiting until the slice comes or the call ends.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicU64) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The share's state stays whole whatever panicked while holding it: every
/// change to it is one step.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epoch_ticker::EPOCH_TICK;

    #[test]
    fn a_share_leaves_one_worker_unless_the_operator_says_and_has_at_least_one_slice() {
        assert_eq!(slices_per_tick(1, 0), 1);
        assert_eq!(slices_per_tick(2, 0), 1);
        assert_eq!(slices_per_tick(8, 0), 7);
        assert_eq!(slices_per_tick(2, 2), 2);
        assert_eq!(slices_per_tick(2, 5), 5);
        assert_eq!(ComputeShare::new(0).unwrap().status().slices_per_tick, 1);
    }

    /// A state with `seats` seats and no ticker: the order of the grants.
    fn state(seats: usize) -> GrantState {
        GrantState {
            available: 0,
            seats: (0..seats)
                .map(|i| {
                    SeatQueue::new(Some(Arc::new(SeatCounters {
                        app: i.to_string().into(),
                        granted: AtomicU64::new(0),
                        waiting: AtomicU64::new(0),
                    })))
                })
                .collect(),
            handed: 0,
        }
    }

    #[test]
    fn each_slice_goes_to_the_app_served_longest_ago_not_to_the_first_call() {
        let mut s = state(2);
        // App 0 has five computations waiting, app 1 one.
        let mut zero: Vec<_> = (0..5).map(|_| s.take_or_queue(0).unwrap()).collect();
        let mut one = s.take_or_queue(1).unwrap();
        // Two slices: one each, the first come of app 0.
        s.available = 2;
        s.hand_out();
        assert!(zero[0].try_recv().is_ok());
        assert!(one.try_recv().is_ok());
        assert!(zero[1].try_recv().is_err());
        // App 1 queues again; the next two slices are again one each.
        let mut one = s.take_or_queue(1).unwrap();
        s.available = 2;
        s.hand_out();
        assert!(zero[1].try_recv().is_ok());
        assert!(one.try_recv().is_ok());
        // App 1 asks again only after app 0 was served: served longer ago,
        // it is still first.
        s.available = 1;
        s.hand_out();
        assert!(zero[2].try_recv().is_ok());
        let mut one = s.take_or_queue(1).unwrap();
        s.available = 1;
        s.hand_out();
        assert!(one.try_recv().is_ok(), "app 1 before app 0's fourth");
        // A waiter whose call ended is skipped without using a slice.
        drop(zero.remove(3));
        s.available = 1;
        s.hand_out();
        assert!(zero[3].try_recv().is_ok(), "the fifth of app 0");
        assert_eq!(s.available, 0);
    }

    #[test]
    fn a_slice_left_in_the_tick_is_taken_at_once_only_when_nobody_waits() {
        let mut s = state(2);
        s.available = 1;
        assert!(s.take_or_queue(0).is_none(), "taken at once");
        let mut waiting = s.take_or_queue(1).expect("none left: it waits");
        s.available = 1;
        assert!(s.take_or_queue(0).is_some(), "app 1 waits first");
        s.hand_out();
        assert!(waiting.try_recv().is_ok());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_ticker_hands_out_a_ticks_worth_and_no_more() {
        let share = ComputeShare::new(2).unwrap();
        let app = share.seat("app");
        // Two slices within a tick; five take at least two more ticks.
        for _ in 0..5 {
            tokio::time::timeout(EPOCH_TICK * 200, app.next_slice())
                .await
                .expect("the ticker hands out slices");
        }
        let status = share.status();
        assert_eq!(status.slices_granted, 5);
        assert_eq!(status.waiting, 0);
        assert_eq!(status.apps, vec![("app".into(), 5, 0)]);
        // Nothing taken for a while: a tick's worth there, never more.
        let available = || lock(&share.grants).available;
        tokio::time::timeout(EPOCH_TICK * 200, async {
            while available() < 2 {
                tokio::time::sleep(EPOCH_TICK).await;
            }
        })
        .await
        .expect("the ticker tops the slices up");
        tokio::time::sleep(EPOCH_TICK * 4).await;
        assert_eq!(available(), 2);
        // A seat that is gone is not shown, and its number is reused.
        drop(app);
        assert!(share.status().apps.is_empty());
        let again = share.seat("again");
        assert_eq!(again.0.number, 0);
    }
}
