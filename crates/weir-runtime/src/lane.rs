//! Lanes: each runs one event at a time on its own generation.
//!
//! Invariant owned here: a lane holds at most one live generation, and the
//! board always tells the truth about every lane — idle, busy, renewing or
//! unavailable — so `/healthz` and `/status` can answer without touching the
//! lanes themselves.

use std::sync::Mutex;

use serde::Serialize;

use crate::generation::Generation;

/// One lane, as it moves between the admission queue and the event that
/// holds it. Exactly one owner has it at a time.
pub struct Lane {
    pub id: usize,
    pub generation: Option<Generation>,
}

/// What a lane is doing, as shown by `/status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LaneState {
    /// Has a live generation and waits for an event.
    Idle,
    /// Runs an event.
    Busy,
    /// Between generations: the old one is gone, the fresh one is being made.
    Renewing,
    /// A fresh generation could not be instantiated; retried with backoff.
    Unavailable,
    /// Its last event's host operations outlived the cleanup budget; it
    /// admits nothing until they end.
    Quarantined,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct LaneStatus {
    pub lane: usize,
    pub state: LaneState,
    /// The lane's current (or last) generation number; 0 before the first.
    pub generation: u64,
}

/// The live state of every lane of one app.
pub struct LaneBoard {
    lanes: Vec<Mutex<LaneStatus>>,
}

impl LaneBoard {
    pub fn new(lanes: usize) -> Self {
        LaneBoard {
            lanes: (0..lanes)
                .map(|lane| {
                    Mutex::new(LaneStatus {
                        lane,
                        state: LaneState::Renewing,
                        generation: 0,
                    })
                })
                .collect(),
        }
    }

    fn update(&self, lane: usize, f: impl FnOnce(&mut LaneStatus)) {
        if let Some(slot) = self.lanes.get(lane) {
            let mut status = slot.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut status);
        }
    }

    pub fn set_idle(&self, lane: usize, generation: u64) {
        self.update(lane, |s| {
            s.state = LaneState::Idle;
            s.generation = generation;
        });
    }

    /// The lane runs an event on `generation`.
    pub fn set_busy(&self, lane: usize, generation: u64) {
        self.update(lane, |s| {
            s.state = LaneState::Busy;
            s.generation = generation;
        });
    }

    pub fn set_renewing(&self, lane: usize) {
        self.update(lane, |s| s.state = LaneState::Renewing);
    }

    pub fn set_unavailable(&self, lane: usize) {
        self.update(lane, |s| s.state = LaneState::Unavailable);
    }

    pub fn set_quarantined(&self, lane: usize) {
        self.update(lane, |s| s.state = LaneState::Quarantined);
    }

    pub fn snapshot(&self) -> Vec<LaneStatus> {
        self.lanes
            .iter()
            .map(|s| *s.lock().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }

    /// True when no lane is unavailable or quarantined.
    pub fn all_available(&self) -> bool {
        self.snapshot()
            .iter()
            .all(|s| !matches!(s.state, LaneState::Unavailable | LaneState::Quarantined))
    }
}
