//! What a node of a cluster counts, for `/status`: how much it shipped and
//! how, what it claimed, rebuilt and handed on.
//!
//! Invariant owned here: each counter only grows, from the start of the
//! process; a reader sees each one as of its reading (no snapshot across
//! them).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// The counters of one node.
#[derive(Default)]
pub struct Counters {
    /// Commits the cluster database accepted from this node.
    pub commits: AtomicU64,
    /// Statements that carried them (several objects' batches each).
    pub statements: AtomicU64,
    /// Batches the fence refused: another node owned the object.
    pub fenced: AtomicU64,
    /// Batches that got no answer (the database was unavailable).
    pub unanswered: AtomicU64,
    /// Snapshots stored.
    pub snapshots: AtomicU64,
    /// Objects this node claimed (a call's, or an orphaned alarm's).
    pub claims: AtomicU64,
    /// Local copies found current when opened (nothing rebuilt).
    pub copies_kept: AtomicU64,
    /// Local copies rebuilt from the cluster's history.
    pub rebuilt: AtomicU64,
    /// Calls handed to another node.
    pub forwarded: AtomicU64,
    /// Calls handed here by another node and run.
    pub served: AtomicU64,
    /// Calls that did not run where they were sent (not the owner, or the
    /// owner unreachable before they left).
    pub not_run: AtomicU64,
    /// Calls sent to a node whose connection broke before an answer, the
    /// node having left the cluster: they did not run there, and were
    /// handed on.
    pub cut_not_run: AtomicU64,
    /// Calls handed to a node of the previous build, as the older version
    /// of the envelope it speaks (while a cluster is being upgraded).
    pub sent_older: AtomicU64,
    /// Actors' WebSockets this node relayed to their owners (an upgrade
    /// the owner's actor answered without a socket counts in `forwarded`).
    pub sockets_relayed: AtomicU64,
    /// Sockets other nodes relayed here, taken by the actors they named
    /// (an upgrade an actor answered without a socket counts in `served`).
    pub sockets_taken: AtomicU64,
}

/// The counters as `/status` shows them.
#[derive(Debug, Serialize)]
pub struct CounterValues {
    pub commits: u64,
    pub statements: u64,
    pub fenced: u64,
    pub unanswered: u64,
    pub snapshots: u64,
    pub claims: u64,
    pub copies_kept: u64,
    pub rebuilt: u64,
    pub forwarded: u64,
    pub served: u64,
    pub not_run: u64,
    pub cut_not_run: u64,
    pub sent_older: u64,
    pub sockets_relayed: u64,
    pub sockets_taken: u64,
}

/// Adds `n` to a counter.
pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    pub fn values(&self) -> CounterValues {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CounterValues {
            commits: v(&self.commits),
            statements: v(&self.statements),
            fenced: v(&self.fenced),
            unanswered: v(&self.unanswered),
            snapshots: v(&self.snapshots),
            claims: v(&self.claims),
            copies_kept: v(&self.copies_kept),
            rebuilt: v(&self.rebuilt),
            forwarded: v(&self.forwarded),
            served: v(&self.served),
            not_run: v(&self.not_run),
            cut_not_run: v(&self.cut_not_run),
            sent_older: v(&self.sent_older),
            sockets_relayed: v(&self.sockets_relayed),
            sockets_taken: v(&self.sockets_taken),
        }
    }
}
