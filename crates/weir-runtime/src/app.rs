//! An app: its code, its lanes and its counters.
//!
//! Invariant owned here: one generation is instantiated before the app is
//! offered to clients, so an app that cannot start is refused at once; the
//! other lanes make their first generation when they are first admitted
//! (an idle app costs one instance, not `max_concurrent`). Generation
//! numbers are the app's own and never reused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::admission::Admission;
use crate::code::{AppCode, LoadError};
use crate::extension::Extras;
use crate::generation::{Generation, InstantiateError};
use crate::lane::{Lane, LaneBoard};
use crate::metrics::AppMetrics;
use crate::receipt::ReceiptBook;
use crate::retirement::Retirement;

/// A served app: its code, its lanes and its counters.
pub struct App {
    pub name: Arc<str>,
    pub code: AppCode,
    pub admission: Arc<Admission>,
    pub board: LaneBoard,
    pub metrics: AppMetrics,
    pub receipts: Arc<ReceiptBook>,
    /// How many events a generation serves.
    pub retirement: Retirement,
    next_generation: AtomicU64,
    next_admission: AtomicU64,
}

impl App {
    /// Loads the app and instantiates the first generation of lane 0; the
    /// other lanes wait, without one, until they are needed.
    pub async fn start(
        name: String,
        code: AppCode,
        receipts: Arc<ReceiptBook>,
        shown: &str,
    ) -> Result<Arc<App>, LoadError> {
        let lanes = code.limits.max_concurrent;
        let metrics = receipts.metrics().clone();
        let app = Arc::new(App {
            receipts,
            name: name.into(),
            admission: Admission::new(code.limits.max_queued, metrics.clone()),
            board: LaneBoard::new(lanes),
            metrics,
            retirement: Retirement::new(code.limits.retirement_admission_limit),
            next_generation: AtomicU64::new(1),
            next_admission: AtomicU64::new(1),
            code,
        });
        let first = app
            .instantiate()
            .await
            .map_err(|source| LoadError::Instantiate {
                path: shown.to_string(),
                cause: source,
            })?;
        // Idle lanes are taken last-in first-out: lane 0, released last, is
        // admitted first, and a lane without a generation only when every
        // lane with one is busy.
        for id in (1..lanes).rev() {
            app.board.set_idle(id, 0);
            app.admission.release(Lane {
                id,
                generation: None,
            });
        }
        app.board.set_idle(0, first.number);
        app.admission.release(Lane {
            id: 0,
            generation: Some(first),
        });
        Ok(app)
    }

    /// Creates a fresh generation with the next number.
    pub async fn instantiate(&self) -> Result<Generation, InstantiateError> {
        let number = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let result =
            Generation::instantiate(&self.code, &self.metrics, number, Extras::default()).await;
        match &result {
            Ok(_) => self.metrics.generation_created(),
            Err(e) => {
                self.metrics.instantiation_failed();
                tracing::error!(app = %self.name, generation = number, error = %e.reason, "instantiation failed");
            }
        }
        result
    }

    pub fn next_admission_index(&self) -> u64 {
        self.next_admission.fetch_add(1, Ordering::Relaxed)
    }

    /// Retires the app when a newer version takes its place: what runs or
    /// waits on it finishes here, and its generations are dropped as their
    /// lanes fall idle (see [`Admission::retire`]).
    pub fn retire(&self) {
        self.admission.retire();
    }

    /// True while every lane can admit.
    pub fn healthy(&self) -> bool {
        self.board.all_available()
    }
}
