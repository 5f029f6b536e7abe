//! The way from a simulated node to the coordinator (the model), through
//! the faults a schedule injects: delays, lost requests and answers,
//! partitions, pauses past a lease, and crashes. Every choice comes from the
//! schedule's one seeded generator.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use weir_cluster::coordinator::{
    Claimed, CoordError, Coordinator, Deleted, DueObject, Fence, History, Listed, Owner,
    Registration, Renewal, SessionId, ShipBatch,
};

use super::cluster::TTL;
use super::model::Model;

/// A call the link has not answered in this long counts as unavailable
/// (production bounds every statement the same way).
const CALL_TIMEOUT: Duration = Duration::from_millis(2_000);

/// splitmix64: small, fast, and the same on every machine.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

/// What the simulation injects, shared by every link.
pub struct Faults {
    pub rng: Mutex<Rng>,
    pub healed: AtomicBool,
    /// Until when each node is cut off from the coordinator.
    pub partitioned: Mutex<BTreeMap<usize, Instant>>,
}

/// What happens to one call.
struct Fate {
    before: Duration,
    after: Duration,
    lose_request: bool,
    lose_answer: bool,
}

impl Faults {
    pub fn rng(&self) -> std::sync::MutexGuard<'_, Rng> {
        self.rng.lock().unwrap()
    }

    fn fate(&self, node: usize) -> Fate {
        let mut rng = self.rng();
        let before = Duration::from_micros(rng.below(4_000));
        let after = Duration::from_micros(rng.below(4_000));
        if self.healed.load(Ordering::Relaxed) {
            return Fate {
                before,
                after,
                lose_request: false,
                lose_answer: false,
            };
        }
        let cut = self
            .partitioned
            .lock()
            .unwrap()
            .get(&node)
            .is_some_and(|until| *until > Instant::now());
        // A paused process or a stalled network: the request arrives late,
        // past a lease.
        let before = if rng.chance(300) {
            TTL + Duration::from_millis(rng.below(2 * TTL.as_millis() as u64))
        } else {
            before
        };
        Fate {
            before,
            after,
            lose_request: cut || rng.chance(60),
            lose_answer: cut || rng.chance(60),
        }
    }
}

/// A node's way to the coordinator, through the faults.
pub struct Link {
    pub model: Arc<Model>,
    pub faults: Arc<Faults>,
    pub node: usize,
    /// The node crashed: nothing it sends arrives any more.
    pub dead: Arc<AtomicBool>,
}

fn unavailable(why: &str) -> CoordError {
    CoordError::Unavailable(why.to_string())
}

impl Link {
    async fn call<T: Send + 'static>(
        &self,
        apply: impl FnOnce(&Model) -> T + Send + 'static,
    ) -> Result<T, CoordError> {
        if self.dead.load(Ordering::Relaxed) {
            return Err(unavailable("crashed"));
        }
        let fate = self.faults.fate(self.node);
        if fate.lose_request {
            tokio::time::sleep(fate.before).await;
            return Err(unavailable("request lost"));
        }
        // Once sent, the step takes effect when it arrives, whatever
        // becomes of the caller.
        // A request in flight arrives even if its sender crashed since.
        let model = self.model.clone();
        let arrives = tokio::spawn(async move {
            tokio::time::sleep(fate.before).await;
            apply(&model)
        });
        let result = match tokio::time::timeout(CALL_TIMEOUT, arrives).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => return Err(unavailable("the step failed")),
            Err(_) => return Err(unavailable("no answer in time")),
        };
        tokio::time::sleep(fate.after).await;
        if fate.lose_answer || self.dead.load(Ordering::Relaxed) {
            return Err(unavailable("answer lost"));
        }
        Ok(result)
    }
}

#[async_trait]
impl Coordinator for Link {
    async fn register(
        &self,
        name: &str,
        address: &str,
        ttl_ms: u64,
    ) -> Result<Registration, CoordError> {
        let (name, address) = (name.to_string(), address.to_string());
        self.call(move |m| m.register(&name, &address, ttl_ms))
            .await
    }

    async fn renew(&self, session: SessionId, ttl_ms: u64) -> Result<Renewal, CoordError> {
        self.call(move |m| m.renew(session, ttl_ms)).await
    }

    async fn release(&self, session: SessionId) -> Result<(), CoordError> {
        self.call(move |m| m.release(session)).await
    }

    async fn left(&self, address: &str) -> Result<bool, CoordError> {
        let address = address.to_string();
        self.call(move |m| m.left(&address)).await
    }

    async fn lookup(&self, key: &str, session: SessionId) -> Result<Owner, CoordError> {
        let key = key.to_string();
        self.call(move |m| m.lookup(&key, session)).await
    }

    async fn claim(
        &self,
        key: &str,
        session: SessionId,
        empty: u64,
    ) -> Result<Claimed, CoordError> {
        let key = key.to_string();
        self.call(move |m| m.claim(&key, session, empty)).await
    }

    async fn commit_many(&self, batches: &[ShipBatch]) -> Result<Vec<bool>, CoordError> {
        let batches = batches.to_vec();
        self.call(move |m| {
            batches
                .iter()
                .map(|b| m.commit(b.fence, b.previous, &b.entries, b.mirror.alarm))
                .collect()
        })
        .await
    }

    async fn snapshot(&self, fence: Fence, head: u64, ltx: &[u8]) -> Result<bool, CoordError> {
        let bytes = ltx.to_vec();
        self.call(move |m| m.snapshot(fence, head, &bytes)).await
    }

    async fn delete(&self, fence: Fence) -> Result<Deleted, CoordError> {
        self.call(move |m| m.delete(fence)).await
    }

    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, CoordError> {
        let (prefix, after) = (prefix.to_string(), after.map(str::to_string));
        self.call(move |m| m.list(&prefix, after.as_deref(), limit))
            .await
    }

    async fn with_history(&self, keys: &[String]) -> Result<Vec<String>, CoordError> {
        let keys = keys.to_vec();
        self.call(move |m| m.with_history(&keys)).await
    }

    async fn history(&self, id: i64, head: u64) -> Result<History, CoordError> {
        self.call(move |m| m.history(id, head)).await
    }

    async fn claim_due(
        &self,
        session: SessionId,
        limit: i64,
    ) -> Result<Vec<DueObject>, CoordError> {
        self.call(move |m| m.claim_due(session, limit)).await
    }
}
