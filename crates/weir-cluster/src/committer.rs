//! The committer: every object's batch of commits on this node goes to the
//! coordinator through here, several objects' batches in one statement.
//! One hot object already ships many turns per statement (its shipper
//! batches them); many objects busy at once ship together too, so the
//! coordinator's cost per commit falls as the load rises.
//!
//! Invariants owned here:
//! - each object's batch keeps its own fence and its own answer: one
//!   object fenced out does not fail another in the same statement;
//! - an object never has two batches in flight (its shipper waits for one
//!   before sending the next), so statements in flight at once never
//!   touch the same object and never wait for each other;
//! - a statement whose answer is lost is reported to every batch in it as
//!   unavailable (each may or may not have been kept).

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::coordinator::{CoordError, Coordinator, Entry, Fence, Mirror, ShipBatch};
use crate::counters::{Counters, add};

/// Statements in flight at once, at most: enough that a light load never
/// waits for another object's statement, few enough that under a heavy
/// one the batches waiting meanwhile go together and the coordinator's
/// connections are left for claims and leases (with 1,000 actors over
/// three nodes, 4 measured 2,360 req/s and 2 measured 1,690).
pub const MAX_STATEMENTS_IN_FLIGHT: usize = 4;

/// Objects' batches in one statement, at most.
pub const MAX_OBJECTS_PER_STATEMENT: usize = 256;

/// Bytes of LTX in one statement, at most (one batch always fits alone).
pub const MAX_STATEMENT_BYTES: usize = 16 << 20;

struct Submission {
    batch: ShipBatch,
    done: oneshot::Sender<Result<bool, CoordError>>,
}

/// The node's way to commit.
pub struct Committer {
    submit: mpsc::UnboundedSender<Submission>,
}

impl Committer {
    /// A committer on `coordinator`, its loop running until it is dropped.
    pub fn start(coordinator: Arc<dyn Coordinator>, counters: Arc<Counters>) -> Committer {
        let (submit, waiting) = mpsc::unbounded_channel();
        tokio::spawn(run(coordinator, waiting, counters));
        Committer { submit }
    }

    /// Commits one object's entries (see [`Coordinator::commit_many`]):
    /// `Ok(false)` when its fence no longer holds.
    pub async fn commit(
        &self,
        fence: Fence,
        previous: u64,
        entries: Vec<Entry>,
        mirror: Mirror,
    ) -> Result<bool, CoordError> {
        let (done, answer) = oneshot::channel();
        let batch = ShipBatch {
            fence,
            previous,
            entries,
            mirror,
        };
        if self.submit.send(Submission { batch, done }).is_err() {
            return Err(CoordError::Unavailable("the committer stopped".into()));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(CoordError::Unavailable("the committer stopped".into())))
    }
}

async fn run(
    coordinator: Arc<dyn Coordinator>,
    mut waiting: mpsc::UnboundedReceiver<Submission>,
    counters: Arc<Counters>,
) {
    let slots = Arc::new(Semaphore::new(MAX_STATEMENTS_IN_FLIGHT));
    while let Some(first) = waiting.recv().await {
        // While every slot is busy, more batches arrive and go together.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut bytes: usize = first.batch.entries.iter().map(|e| e.ltx.len()).sum();
        let mut group = vec![first];
        while group.len() < MAX_OBJECTS_PER_STATEMENT && bytes < MAX_STATEMENT_BYTES {
            match waiting.try_recv() {
                Ok(more) => {
                    bytes += more
                        .batch
                        .entries
                        .iter()
                        .map(|e| e.ltx.len())
                        .sum::<usize>();
                    group.push(more);
                }
                Err(_) => break,
            }
        }
        let coordinator = coordinator.clone();
        let counters = counters.clone();
        tokio::spawn(async move {
            let (batches, answers): (Vec<ShipBatch>, Vec<_>) =
                group.into_iter().map(|s| (s.batch, s.done)).unzip();
            add(&counters.statements, 1);
            match coordinator.commit_many(&batches).await {
                Ok(kept) => {
                    for ((answer, kept), batch) in answers.into_iter().zip(kept).zip(&batches) {
                        if kept {
                            add(&counters.commits, batch.commits());
                        } else {
                            add(&counters.fenced, 1);
                        }
                        let _ = answer.send(Ok(kept));
                    }
                }
                Err(e) => {
                    add(&counters.unanswered, answers.len() as u64);
                    for answer in answers {
                        let _ = answer.send(Err(e.clone()));
                    }
                }
            }
            drop(slot);
        });
    }
}
