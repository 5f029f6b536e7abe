//! The node's lease: a session at the coordinator, renewed every third of
//! its length, and this node's own judgement of whether it still holds it.
//!
//! Invariants owned here:
//! - the node considers its lease valid only until `sent + ttl - margin`,
//!   where `sent` is when its last successful renewal (or registration) was
//!   sent, read from its monotonic clock: the coordinator's expiry is at
//!   least `ttl` after it received that request, so the node stops
//!   committing and answering before the coordinator could let anyone
//!   else take over;
//! - a renewal refused because the lease had expired ends the session:
//!   the generation moves on (everything owned under the old one is
//!   dropped by its holders) and a new session is registered;
//! - so does the node's own end of its lease, reached before a renewal
//!   answered: a renewal answered after that may have committed after the
//!   coordinator's expiry, when another node could already have claimed
//!   what this one owned (its answer proves nothing about the time
//!   between). Only a renewal answered before the node's own end proves
//!   that no claim could slip in (it committed before the expiry, and
//!   every claim after it sees the renewed lease), so only such a renewal
//!   keeps the session: a node never answers for an object after another
//!   could have claimed it, and everything that lives by its tenure (its
//!   sockets, its processes) ends at its own end of the lease;
//! - a node whose name has a live session elsewhere (its previous run,
//!   killed) waits for that lease to expire before registering, so two
//!   runs of one node never hold leases at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::coordinator::{CoordError, Coordinator, NodeInfo, Registration, Renewal, SessionId};

/// The shortest safety margin between the node's own end of its lease and
/// the coordinator's: room for the two clocks to run at slightly different
/// rates over one lease.
pub const MIN_MARGIN: Duration = Duration::from_millis(50);

/// The margin as a fraction of the lease (1/10).
pub const MARGIN_DIVISOR: u32 = 10;

/// How often a failed renewal is retried, as a fraction of the lease
/// (1/10): several tries fit before the node's own end of the lease.
pub const RETRY_DIVISOR: u32 = 10;

/// Resolves once `stop` turns true (or its sender is gone).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// A held session: its id and the generation it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub session: SessionId,
    /// Moves on with every new session: what was owned under an older one
    /// is not owned any more.
    pub generation: u64,
}

#[derive(Debug)]
struct State {
    held: Option<Held>,
    valid_until: Option<Instant>,
    nodes: Vec<NodeInfo>,
    /// When the renewal (or registration) that listed `nodes` was sent.
    nodes_sent: Option<Instant>,
    generation: u64,
}

/// The node's lease, as every part of the node reads it.
pub struct Lease {
    name: String,
    address: String,
    ttl: Duration,
    state: Mutex<State>,
    /// Bumped with every change of session.
    changed: watch::Sender<u64>,
}

impl Lease {
    pub fn new(name: &str, address: &str, ttl: Duration) -> Arc<Lease> {
        Arc::new(Lease {
            name: name.to_string(),
            address: address.to_string(),
            ttl,
            state: Mutex::new(State {
                held: None,
                valid_until: None,
                nodes: Vec::new(),
                nodes_sent: None,
                generation: 0,
            }),
            changed: watch::channel(0).0,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where this node's internal listener is reached.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The lease's length.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn margin(&self) -> Duration {
        (self.ttl / MARGIN_DIVISOR).max(MIN_MARGIN)
    }

    /// The session, if the node holds its lease now (by its own clock).
    pub fn held(&self) -> Option<Held> {
        let s = self.lock();
        match (s.held, s.valid_until) {
            (Some(held), Some(until)) if Instant::now() < until => Some(held),
            _ => None,
        }
    }

    /// True while the node holds the lease of `generation`.
    pub fn holds(&self, generation: u64) -> bool {
        self.held().is_some_and(|h| h.generation == generation)
    }

    /// The session's generation now, held or not: what was owned under an
    /// older one is not owned any more.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// The live nodes, as of the last renewal.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.lock().nodes.clone()
    }

    /// True when this node holds its lease and a renewal sent after
    /// `since` listed the live nodes without one reached at `address`:
    /// that node had no lease then. False when the list is older than
    /// `since` (a node that registered after it is not yet on it) or this
    /// node cannot tell (it holds no lease).
    pub fn lacks_address_since(&self, address: &str, since: Instant) -> bool {
        let s = self.lock();
        let current = matches!(s.valid_until, Some(until) if Instant::now() < until);
        current
            && s.nodes_sent.is_some_and(|sent| sent > since)
            && !s.nodes.iter().any(|n| n.address == address)
    }

    /// Waits for the generation to move past `generation`.
    pub async fn changed_since(&self, generation: u64) {
        let mut rx = self.changed.subscribe();
        let _ = rx.wait_for(|g| *g > generation).await;
    }

    fn started(&self, session: SessionId, nodes: Vec<NodeInfo>, sent: Instant) -> Held {
        let mut s = self.lock();
        s.generation += 1;
        let held = Held {
            session,
            generation: s.generation,
        };
        s.held = Some(held);
        s.valid_until = Some(sent + self.ttl - self.margin());
        s.nodes = nodes;
        s.nodes_sent = Some(sent);
        let generation = s.generation;
        drop(s);
        self.changed.send_replace(generation);
        held
    }

    fn renewed(&self, nodes: Vec<NodeInfo>, sent: Instant) {
        let mut s = self.lock();
        s.valid_until = Some(sent + self.ttl - self.margin());
        s.nodes = nodes;
        s.nodes_sent = Some(sent);
    }

    /// The session is over (expired at the coordinator, or released).
    fn ended(&self) {
        let mut s = self.lock();
        s.held = None;
        s.valid_until = None;
        s.generation += 1;
        let generation = s.generation;
        drop(s);
        self.changed.send_replace(generation);
    }

    /// The node's own end of its lease came before a renewal answered:
    /// everything owned under the session is dropped at once (the
    /// generation moves on), and the session is released if the
    /// coordinator can be reached, so that its objects need not wait for
    /// its expiry (a new session is registered next).
    async fn lapsed(&self, coordinator: &dyn Coordinator, held: Held) {
        tracing::warn!(node = %self.name, session = held.session, "the cluster lease was not renewed within this node's own end of it; everything this node owned is dropped");
        self.ended();
        let released = tokio::time::timeout(self.ttl, coordinator.release(held.session)).await;
        if !matches!(released, Ok(Ok(()))) {
            tracing::warn!(node = %self.name, session = held.session, "cannot release the lapsed session; its objects wait for it to expire");
        }
    }

    /// Registers a session, waiting while the name's previous one lives.
    /// Gives up with the coordinator's error only when `give_up` says so.
    pub async fn register(
        &self,
        coordinator: &dyn Coordinator,
        mut give_up: impl FnMut(&CoordError) -> bool,
    ) -> Result<Held, CoordError> {
        let ttl_ms = self.ttl.as_millis() as u64;
        let mut announced = false;
        loop {
            let sent = Instant::now();
            match coordinator
                .register(&self.name, &self.address, ttl_ms)
                .await
            {
                Ok(Registration::Registered { session, nodes }) => {
                    tracing::info!(node = %self.name, session, "holding the cluster lease");
                    return Ok(self.started(session, nodes, sent));
                }
                Ok(Registration::NameInUse) => {
                    if !announced {
                        tracing::warn!(node = %self.name, "an earlier run of this node still holds a lease; waiting for it to expire");
                        announced = true;
                    }
                    tokio::time::sleep(self.ttl / 3).await;
                }
                Err(e) => {
                    if give_up(&e) {
                        return Err(e);
                    }
                    tracing::warn!(node = %self.name, error = %e, "cannot register with the cluster database; retrying");
                    tokio::time::sleep(self.ttl / RETRY_DIVISOR).await;
                }
            }
        }
    }

    /// Keeps the lease: renews it every third of its length, and when it
    /// is lost, registers a new session. Runs until `stop` turns true; the
    /// session is then released (its objects free for others at once).
    pub async fn keep(
        self: Arc<Self>,
        coordinator: Arc<dyn Coordinator>,
        mut stop: watch::Receiver<bool>,
    ) {
        let ttl_ms = self.ttl.as_millis() as u64;
        let mut next = Instant::now() + self.ttl / 3;
        loop {
            let current = self.lock().held;
            let held = match current {
                Some(held) => held,
                None => {
                    let registering = self.register(coordinator.as_ref(), |_| false);
                    tokio::select! {
                        held = registering => match held {
                            Ok(held) => {
                                next = Instant::now() + self.ttl / 3;
                                held
                            }
                            Err(_) => continue,
                        },
                        _ = stopped(&mut stop) => return,
                    }
                }
            };
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = stopped(&mut stop) => {
                    self.ended();
                    if let Err(e) = coordinator.release(held.session).await {
                        tracing::warn!(error = %e, "cannot release the cluster lease; its objects wait for it to expire");
                    }
                    return;
                }
            }
            // The node's own end of its lease: a renewal not answered by
            // then proves nothing (see the module's invariants).
            let Some(until) = self.lock().valid_until else {
                continue;
            };
            if Instant::now() >= until {
                self.lapsed(coordinator.as_ref(), held).await;
                continue;
            }
            let sent = Instant::now();
            let answered = tokio::select! {
                answered = coordinator.renew(held.session, ttl_ms) => Some(answered),
                _ = tokio::time::sleep_until(until) => None,
                _ = stopped(&mut stop) => {
                    self.ended();
                    if let Err(e) = coordinator.release(held.session).await {
                        tracing::warn!(error = %e, "cannot release the cluster lease; its objects wait for it to expire");
                    }
                    return;
                }
            };
            match answered {
                Some(Ok(Renewal::Renewed(nodes))) if Instant::now() < until => {
                    self.renewed(nodes, sent);
                    next = sent + self.ttl / 3;
                }
                // Answered too late, or not at all by the node's own end.
                None | Some(Ok(Renewal::Renewed(_))) => {
                    self.lapsed(coordinator.as_ref(), held).await;
                }
                Some(Ok(Renewal::Expired)) => {
                    tracing::warn!(node = %self.name, session = held.session, "the cluster lease expired; everything this node owned is dropped");
                    self.ended();
                }
                Some(Err(e)) => {
                    tracing::warn!(node = %self.name, error = %e, "cannot renew the cluster lease; retrying");
                    // Sooner than a third of the lease: several tries fit
                    // before the node's own end of it.
                    next = Instant::now() + self.ttl / RETRY_DIVISOR;
                }
            }
        }
    }
}
