//! Ownership: which objects (actors, key-value stores, SQL databases) this
//! node owns, and where the others are run.
//!
//! Invariants owned here:
//! - the coordinator's row is the authority: this node treats an object
//!   as its own only after the coordinator said so (a claim, or a lookup
//!   naming this session), and only while the lease of the session that
//!   claimed it is held; a new session owns nothing until it claims again;
//! - placement prefers the node a rendezvous hash of the object's key
//!   picks among the live nodes, so that nodes agree where an unowned
//!   object should go without asking each other; but a call forwarded once
//!   claims the object where it lands, so a call never travels twice for
//!   want of an owner;
//! - what is remembered of other nodes' objects is a hint: a call sent on
//!   a stale hint is answered "not owner" without running, and the next
//!   attempt asks the coordinator.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::committer::Committer;
use crate::coordinator::{
    Claimed, CoordError, Coordinator, Deleted, Fence, NodeInfo, ObjectState, Owner,
};
use crate::counters::{Counters, add};
use crate::error_code::ClusterErrorCode;
use crate::lease::{Held, Lease};

/// Other nodes' objects remembered at most; past it the hints start over
/// (each costs a lookup again, nothing more).
pub const MAX_REMEMBERED_OWNERS: usize = 65_536;

/// An object this node owns, as of its claim and its last accepted commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owned {
    pub state: ObjectState,
    /// The session that claimed it.
    pub held: Held,
}

impl Owned {
    /// What this node's commits to it are fenced by.
    pub fn fence(&self) -> Fence {
        Fence {
            object: self.state.id,
            epoch: self.state.epoch,
            session: self.held.session,
        }
    }
}

/// Where an object is run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Located {
    Here(Owned),
    /// On the node at this internal address.
    Elsewhere(Arc<str>),
}

/// What this node knows of who owns what.
pub struct Ownership {
    coordinator: Arc<dyn Coordinator>,
    committer: Committer,
    counters: Arc<Counters>,
    lease: Arc<Lease>,
    owned: Mutex<HashMap<String, Owned>>,
    /// Where objects owned elsewhere were last found, and when.
    elsewhere: Mutex<HashMap<String, (Arc<str>, Instant)>>,
    /// Bumped whenever an object is lost or deleted here, so that what
    /// lives only as long as an object's ownership ([`Ownership::tenure`])
    /// looks again.
    losses: watch::Sender<u64>,
}

/// The node that rendezvous hashing picks for `key` among `nodes`.
pub fn preferred<'a>(nodes: &'a [NodeInfo], key: &str) -> Option<&'a NodeInfo> {
    nodes.iter().max_by_key(|node| {
        let mut hash = Sha256::new();
        hash.update(node.name.as_bytes());
        hash.update([0]);
        hash.update(key.as_bytes());
        let digest = hash.finalize();
        (
            u64::from_be_bytes(digest[..8].try_into().expect("8 bytes")),
            node.name.clone(),
        )
    })
}

/// A coordinator that did not answer, as the error callers are given.
pub(crate) fn unavailable(e: CoordError) -> ClusterErrorCode {
    tracing::warn!(error = %e, "the cluster database did not answer");
    ClusterErrorCode::StorageUnavailable
}

impl Ownership {
    /// The node's ownership, with its committer (started on the runtime
    /// this is called in).
    pub fn new(coordinator: Arc<dyn Coordinator>, lease: Arc<Lease>) -> Ownership {
        let counters = Arc::new(Counters::default());
        Ownership {
            committer: Committer::start(coordinator.clone(), counters.clone()),
            counters,
            coordinator,
            lease,
            owned: Mutex::new(HashMap::new()),
            elsewhere: Mutex::new(HashMap::new()),
            losses: watch::Sender::new(0),
        }
    }

    pub fn lease(&self) -> &Arc<Lease> {
        &self.lease
    }

    pub fn coordinator(&self) -> &Arc<dyn Coordinator> {
        &self.coordinator
    }

    /// What this node counts.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Where this node's commits go, several objects' at a time.
    pub fn committer(&self) -> &Committer {
        &self.committer
    }

    fn owned_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Owned>> {
        self.owned.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn hints(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<str>, Instant)>> {
        self.elsewhere.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The object, if this node owns it now.
    pub fn owned(&self, key: &str) -> Option<Owned> {
        let held = self.lease.held()?;
        let mut owned = self.owned_map();
        match owned.get(key) {
            Some(o) if o.held == held => Some(*o),
            Some(_) => {
                // Claimed under a session that is over.
                owned.remove(key);
                None
            }
            None => None,
        }
    }

    fn remember_owned(&self, key: &str, owned: Owned) {
        self.owned_map().insert(key.to_string(), owned);
        self.hints().remove(key);
    }

    fn remember_elsewhere(&self, key: &str, address: &str) -> Arc<str> {
        let address: Arc<str> = Arc::from(address);
        let mut hints = self.hints();
        if hints.len() >= MAX_REMEMBERED_OWNERS {
            hints.clear();
        }
        hints.insert(key.to_string(), (address.clone(), Instant::now()));
        address
    }

    /// Where `key` runs. `refresh`: what was remembered proved wrong.
    /// `forwarded`: the call already took its hop, so an unowned object
    /// is claimed here rather than sent on (and so it is on a refresh).
    pub async fn locate(
        &self,
        key: &str,
        refresh: bool,
        forwarded: bool,
    ) -> Result<Located, ClusterErrorCode> {
        let held = self
            .lease
            .held()
            .ok_or(ClusterErrorCode::StorageUnavailable)?;
        if let Some(owned) = self.owned(key) {
            return Ok(Located::Here(owned));
        }
        let hint = if refresh {
            self.hints().remove(key);
            None
        } else {
            self.hints().get(key).cloned()
        };
        if let Some((address, at)) = hint {
            // A hint is trusted unless a renewal sent after it was made
            // lists its node among the dead (no lease): one that vanished
            // without a reset (stopped, cut off) would otherwise take
            // every call, since it never answers "not run". A node that
            // registered after this one's last renewal is trusted until
            // the next.
            if !self.lease.lacks_address_since(&address, at) {
                return Ok(Located::Elsewhere(address));
            }
            self.hints().remove(key);
        }
        match self
            .coordinator
            .lookup(key, held.session)
            .await
            .map_err(unavailable)?
        {
            Owner::Me(state) => {
                let owned = Owned { state, held };
                self.remember_owned(key, owned);
                return Ok(Located::Here(owned));
            }
            Owner::Other { address, .. } => {
                return Ok(Located::Elsewhere(self.remember_elsewhere(key, &address)));
            }
            Owner::Nobody => {}
        }
        // A second attempt claims here: the preferred node may be the one
        // that just failed to answer.
        if !forwarded && !refresh {
            let nodes = self.lease.nodes();
            if let Some(node) = preferred(&nodes, key)
                && node.session != held.session
            {
                // Its preferred node claims it when the call arrives.
                return Ok(Located::Elsewhere(Arc::from(node.address.as_str())));
            }
        }
        self.claim(key, held).await
    }

    /// Claims `key` for this node's session.
    async fn claim(&self, key: &str, held: Held) -> Result<Located, ClusterErrorCode> {
        let empty = weir_store::replica::EMPTY.into_inner();
        match self
            .coordinator
            .claim(key, held.session, empty)
            .await
            .map_err(unavailable)?
        {
            Claimed::Owned(state) => {
                tracing::debug!(key, epoch = state.epoch, head = state.head, "claimed");
                add(&self.counters.claims, 1);
                let owned = Owned { state, held };
                self.remember_owned(key, owned);
                Ok(Located::Here(owned))
            }
            Claimed::Other { address, .. } => {
                Ok(Located::Elsewhere(self.remember_elsewhere(key, &address)))
            }
            Claimed::LeaseLost => Err(ClusterErrorCode::StorageUnavailable),
        }
    }

    /// Records objects the node claimed in one step of its own (due
    /// alarms of objects whose owner died, or of its own): an object it
    /// already holds under the same claim keeps what it knows, which may
    /// be newer than the row read a moment ago.
    pub fn adopt(&self, key: &str, state: ObjectState, held: Held) {
        let mut owned = self.owned_map();
        match owned.get(key) {
            Some(o)
                if o.held == held && o.state.epoch == state.epoch && o.state.head >= state.head => {
            }
            _ => {
                owned.insert(key.to_string(), Owned { state, held });
            }
        }
        drop(owned);
        self.hints().remove(key);
    }

    /// A commit of `key` was accepted: its row moved to `head`.
    pub fn advanced(&self, key: &str, held: Held, head: u64, checksum: u64, log_bytes: u64) {
        if let Some(owned) = self.owned_map().get_mut(key)
            && owned.held == held
        {
            owned.state.head = head;
            owned.state.checksum = checksum;
            owned.state.log_bytes = log_bytes;
        }
    }

    /// Deletes `key`'s history at the coordinator, while this node owns
    /// it: true if it had any (a head past 0). After it the node owns
    /// nothing of that key, and a later claim makes a new object.
    ///
    /// The node forgets its claim even when the coordinator's answer did
    /// not come: the object may be gone, and a claim kept on it would let
    /// a later deletion through this node name the gone object (answered
    /// "gone") while another node's new object of the same key lives on.
    pub async fn forget(&self, key: &str) -> Result<bool, ClusterErrorCode> {
        let owned = self.owned(key).ok_or(ClusterErrorCode::OwnershipLost)?;
        let deleted = self.coordinator.delete(owned.fence()).await;
        self.lost(key);
        match deleted.map_err(unavailable)? {
            Deleted::Deleted { head } => Ok(head > 0),
            // Deleted by an earlier try whose answer was lost.
            Deleted::Gone => Ok(false),
            // Another node owns it now, or this node's lease lapsed.
            Deleted::Fenced => Err(ClusterErrorCode::OwnershipLost),
        }
    }

    /// `key` is not this node's any more (a fenced commit told so).
    pub fn lost(&self, key: &str) {
        self.owned_map().remove(key);
        self.losses.send_modify(|n| *n += 1);
    }

    /// Resolves when this node's hold on `key`, as of now, ends: its
    /// session ends, or the object is lost or deleted here (at once if the
    /// node does not own it now). The node's own end of its lease, reached
    /// before a renewal answered, ends the session (see `crate::lease`),
    /// and so every tenure under it: a renewal answered later proves
    /// nothing of the time between.
    pub fn tenure(self: &Arc<Self>, key: &str) -> impl Future<Output = ()> + Send + 'static {
        let now = self.owned(key);
        let this = self.clone();
        let key = key.to_string();
        async move {
            let Some(owned) = now else { return };
            let mut losses = this.losses.subscribe();
            let lease = this.lease.clone();
            let session = async move { lease.changed_since(owned.held.generation).await };
            let mut session = std::pin::pin!(session);
            loop {
                if !this.still_holds(&key, &owned) {
                    return;
                }
                tokio::select! {
                    () = &mut session => return,
                    changed = losses.changed() => if changed.is_err() { return },
                }
            }
        }
    }

    /// True while `key` is held under the claim `owned` was made of.
    fn still_holds(&self, key: &str, owned: &Owned) -> bool {
        self.lease.generation() == owned.held.generation
            && self
                .owned_map()
                .get(key)
                .is_some_and(|o| o.held == owned.held && o.state.epoch == owned.state.epoch)
    }
}
