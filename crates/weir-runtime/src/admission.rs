//! Admission: a request reserves a lane, or a place in the wait queue,
//! before any byte of its body is read.
//!
//! Invariants owned here:
//! - a lane is held by exactly one owner: the idle set, one waiter, or one
//!   event. A lane handed to a waiter that has just left is never lost: the
//!   guard it travels in puts it back when dropped.
//! - the queue never holds more than `max_queued` live waiters, and a waiter
//!   whose client left is removed at once, so departed clients cannot crowd
//!   out live ones.
//! - a waiter whose client left, or whose deadline passed, never receives a
//!   lane and so never enters Wasm.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use tokio::sync::oneshot;

use crate::error_code::ErrorCode;
use crate::lane::Lane;
use crate::metrics::AppMetrics;

/// A lane reserved for one event. Dropping it returns the lane to its
/// admission (if the app is still served).
pub struct LaneGuard {
    admission: Weak<Admission>,
    lane: Option<Lane>,
}

impl LaneGuard {
    pub fn lane(&mut self) -> &mut Lane {
        self.lane
            .as_mut()
            .expect("a guard holds its lane until dropped")
    }
}

impl Drop for LaneGuard {
    fn drop(&mut self) {
        if let (Some(lane), Some(admission)) = (self.lane.take(), self.admission.upgrade()) {
            admission.release(lane);
        }
    }
}

struct Waiter {
    id: u64,
    tx: oneshot::Sender<LaneGuard>,
}

struct State {
    idle: Vec<Lane>,
    waiters: VecDeque<Waiter>,
    next_waiter: u64,
    /// The app is no longer offered new events (a newer version serves):
    /// a lane nobody waits for goes idle without its generation. A request
    /// routed here just before the newer version took over still gets a
    /// lane (and a fresh generation), so none is refused for the deploy.
    retired: bool,
}

/// The idle lanes and the wait queue of one app.
pub struct Admission {
    state: Mutex<State>,
    max_queued: usize,
    /// Where the queue depth is reported.
    metrics: AppMetrics,
}

/// Removes a waiter from the queue if its request goes away first.
struct WaiterEntry<'a> {
    admission: &'a Admission,
    id: u64,
}

impl Drop for WaiterEntry<'_> {
    fn drop(&mut self) {
        let mut state = self.admission.lock();
        state.waiters.retain(|w| w.id != self.id);
    }
}

impl Admission {
    pub fn new(max_queued: usize, metrics: AppMetrics) -> Arc<Self> {
        Arc::new(Admission {
            state: Mutex::new(State {
                idle: Vec::new(),
                waiters: VecDeque::new(),
                next_waiter: 0,
                retired: false,
            }),
            max_queued,
            metrics,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waiters in the queue now.
    pub fn queue_depth(&self) -> usize {
        self.lock().waiters.len()
    }

    /// Reserves a lane: at once if one is idle, else by waiting in the queue
    /// until `deadline`. A full queue refuses at once.
    pub async fn admit(self: &Arc<Self>, deadline: Instant) -> Result<LaneGuard, ErrorCode> {
        let (rx, id) = {
            let mut state = self.lock();
            if let Some(lane) = state.idle.pop() {
                return Ok(LaneGuard {
                    admission: Arc::downgrade(self),
                    lane: Some(lane),
                });
            }
            if state.waiters.len() >= self.max_queued {
                return Err(ErrorCode::EventCapacityExceeded);
            }
            let (tx, rx) = oneshot::channel();
            let id = state.next_waiter;
            state.next_waiter += 1;
            state.waiters.push_back(Waiter { id, tx });
            (rx, id)
        };
        self.metrics.set_queue_depth(self.queue_depth());
        let entry = WaiterEntry {
            admission: self,
            id,
        };
        let result = tokio::time::timeout_at(deadline.into(), rx).await;
        drop(entry);
        self.metrics.set_queue_depth(self.queue_depth());
        match result {
            Ok(Ok(guard)) => Ok(guard),
            // The sender is only dropped by `release` after a failed send,
            // which cannot happen to a live receiver; treat it as capacity.
            Ok(Err(_)) => Err(ErrorCode::EventCapacityExceeded),
            Err(_) => Err(ErrorCode::AdmissionDeadlineExceeded),
        }
    }

    /// Hands a lane to the first live waiter, or back to the idle set.
    pub fn release(self: &Arc<Self>, lane: Lane) {
        let mut lane = lane;
        let mut state = self.lock();
        while let Some(waiter) = state.waiters.pop_front() {
            let guard = LaneGuard {
                admission: Arc::downgrade(self),
                lane: Some(lane),
            };
            match waiter.tx.send(guard) {
                Ok(()) => return,
                Err(mut returned) => {
                    lane = returned
                        .lane
                        .take()
                        .expect("a returned guard still holds its lane");
                }
            }
        }
        let generation = if state.retired {
            lane.generation.take()
        } else {
            None
        };
        state.idle.push(lane);
        drop(state);
        drop(generation);
    }

    /// Stops keeping generations on idle lanes: those idle now drop
    /// theirs, and each busy one when its event ends and nobody queued
    /// waits for it. Events running or queued are served as before.
    pub fn retire(&self) {
        let generations: Vec<_> = {
            let mut state = self.lock();
            state.retired = true;
            state
                .idle
                .iter_mut()
                .filter_map(|lane| lane.generation.take())
                .collect()
        };
        drop(generations);
    }
}
