//! The simulated cluster: nodes that run the production protocol code
//! (lease keeper, claims and placement, fenced shipping, the orphaned
//! alarms' sweep) on links of their own to the model, and what a node does
//! with a client's call: a write on its copy of the object, or its
//! deletion, on the owner, handed on between nodes at most twice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use weir_cluster::coordinator::Coordinator;
use weir_cluster::lease::Lease;
use weir_cluster::ownership::{Located, Owned, Ownership};
use weir_cluster::shipper::{Records, Shipper};

use super::checks::AckedWrite;
use super::link::{Faults, Link};
use super::model::Model;
use super::object::{SimCommit, State, Write, decode_state, encode, encode_state, replay};
use tokio::time::Instant;

/// Each node's lease.
pub const TTL: Duration = Duration::from_millis(1000);
/// An object's alarm falls due this long after its first write.
const ALARM_AFTER_MS: i64 = 2_500;
/// One write in this many asks for a snapshot of its object at its head.
const SNAPSHOT_ONE_IN: u64 = 6;

/// What a client asks of an object.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Write(u64),
    Delete,
}

/// An object open on a node.
pub struct Open {
    pub owned: Owned,
    pub state: State,
    pub shipper: Shipper<SimCommit>,
    /// The first write set the alarm already (replayed or written here).
    pub written: bool,
}

/// One node: the production protocol code on a link of its own.
pub struct Node {
    pub address: String,
    pub ownership: Arc<Ownership>,
    pub records: Arc<Records>,
    pub objects: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<Option<Open>>>>>,
    pub dead: Arc<AtomicBool>,
    pub stop: watch::Sender<bool>,
    pub due: Mutex<BTreeSet<String>>,
}

impl Node {
    /// The slot of `key`'s copy here (empty until it is opened).
    fn object(&self, key: &str) -> Arc<tokio::sync::Mutex<Option<Open>>> {
        self.objects
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default()
            .clone()
    }
}

/// What a call to a node ended as.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Acked,
    /// It did not run (not the owner, or nothing reached the node).
    NotRun,
    /// It may or may not have run.
    Failed,
}

pub struct Cluster {
    pub model: Arc<Model>,
    pub faults: Arc<Faults>,
    pub nodes: Mutex<Vec<Arc<Node>>>,
    /// Client writes acknowledged, by object: each one's id, when it was
    /// sent and when it was acknowledged.
    pub acked: Mutex<BTreeMap<String, Vec<AckedWrite>>>,
    /// Deletions acknowledged: each one's object and when it was sent.
    pub deleted: Mutex<Vec<(String, Instant)>>,
}

impl Cluster {
    pub fn node(&self, i: usize) -> Arc<Node> {
        self.nodes.lock().unwrap()[i].clone()
    }

    fn by_address(&self, address: &str) -> Option<Arc<Node>> {
        self.nodes
            .lock()
            .unwrap()
            .iter()
            .find(|n| n.address == address && !n.dead.load(Ordering::Relaxed))
            .cloned()
    }

    /// Starts node `index` (again): a new session once the last one's
    /// lease is over.
    pub async fn start(self: &Arc<Self>, index: usize) -> Arc<Node> {
        let dead = Arc::new(AtomicBool::new(false));
        let link: Arc<dyn Coordinator> = Arc::new(Link {
            model: self.model.clone(),
            faults: self.faults.clone(),
            node: index,
            dead: dead.clone(),
        });
        let address = format!("node{index}");
        let lease = Lease::new(&format!("n{index}"), &address, TTL);
        let (stop, stopped) = watch::channel(false);
        let ownership = Arc::new(Ownership::new(link.clone(), lease.clone()));
        let node = Arc::new(Node {
            address,
            ownership: ownership.clone(),
            records: Arc::new(Records::default()),
            objects: Mutex::new(BTreeMap::new()),
            dead,
            stop,
            due: Mutex::new(BTreeSet::new()),
        });
        tokio::spawn(lease.keep(link, stopped.clone()));
        let swept = node.clone();
        tokio::spawn(weir_cluster::alarms::sweep_with(
            ownership,
            stopped.clone(),
            move |object| {
                swept.due.lock().unwrap().insert(object.key.clone());
                true
            },
        ));
        tokio::spawn(self.clone().dispatch(node.clone(), stopped));
        node
    }

    /// Crashes a node: nothing it sends arrives any more, its tasks stop.
    pub fn crash(&self, index: usize) {
        let node = self.node(index);
        node.dead.store(true, Ordering::Relaxed);
        node.stop.send_replace(true);
    }

    /// Delivers the alarms due on objects this node owns, every 100 ms.
    async fn dispatch(self: Arc<Self>, node: Arc<Node>, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let now = self.model.now_ms();
            let mut due: BTreeSet<String> = std::mem::take(&mut *node.due.lock().unwrap());
            let open: Vec<(String, Arc<tokio::sync::Mutex<Option<Open>>>)> = node
                .objects
                .lock()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (key, object) in open {
                if let Ok(guard) = object.try_lock()
                    && guard
                        .as_ref()
                        .is_some_and(|o| o.state.alarm.is_some_and(|at| at <= now))
                {
                    due.insert(key);
                }
            }
            for key in due {
                if let Some(owned) = node.ownership.owned(&key) {
                    let _ = self.local(&node, &key, owned, Write::Alarm).await;
                }
            }
        }
    }

    /// Runs a client's call on the node that owns its object, handed on
    /// at most twice.
    pub async fn call(self: &Arc<Self>, entry: usize, key: &str, op: Op) -> Reply {
        let first = self.node(entry);
        if first.dead.load(Ordering::Relaxed) {
            return Reply::NotRun;
        }
        let mut last = Reply::NotRun;
        for attempt in 0..2 {
            match first.ownership.locate(key, attempt > 0, false).await {
                Ok(Located::Here(owned)) => return self.run(&first, key, owned, op).await,
                Ok(Located::Elsewhere(address)) => {
                    let (lost_on_the_way, lost_coming_back) = {
                        let mut rng = self.faults.rng();
                        let faulty = !self.faults.healed.load(Ordering::Relaxed);
                        (faulty && rng.chance(40), faulty && rng.chance(40))
                    };
                    let Some(owner) = self.by_address(&address) else {
                        last = Reply::NotRun;
                        continue;
                    };
                    if lost_on_the_way {
                        last = Reply::NotRun;
                        continue;
                    }
                    let reply = self.forwarded(&owner, key, op).await;
                    if reply == Reply::NotRun {
                        last = reply;
                        continue;
                    }
                    return if lost_coming_back {
                        Reply::Failed
                    } else {
                        reply
                    };
                }
                Err(_) => return Reply::Failed,
            }
        }
        last
    }

    async fn forwarded(self: &Arc<Self>, node: &Arc<Node>, key: &str, op: Op) -> Reply {
        if node.dead.load(Ordering::Relaxed) {
            return Reply::NotRun;
        }
        match node.ownership.locate(key, false, true).await {
            Ok(Located::Here(owned)) => self.run(node, key, owned, op).await,
            Ok(Located::Elsewhere(_)) => Reply::NotRun,
            Err(_) => Reply::Failed,
        }
    }

    /// Runs a client's call here, on the owner.
    async fn run(self: &Arc<Self>, node: &Arc<Node>, key: &str, owned: Owned, op: Op) -> Reply {
        match op {
            Op::Write(id) => self.local(node, key, owned, Write::Client(id)).await,
            Op::Delete => self.delete(node, key).await,
        }
    }

    /// Deletes an object on its owner as an operator's deletion does:
    /// between two writes (its lock held throughout), once its commits
    /// settled; this node's copy goes with its history.
    async fn delete(self: &Arc<Self>, node: &Arc<Node>, key: &str) -> Reply {
        let object = node.object(key);
        let mut guard = object.lock().await;
        if node.dead.load(Ordering::Relaxed) {
            return Reply::Failed;
        }
        if let Some(open) = guard.as_ref()
            && open.shipper.settled().await.is_err()
        {
            return Reply::Failed;
        }
        let forgotten = node.ownership.forget(key).await;
        node.records.forget(key);
        *guard = None;
        match forgotten {
            Ok(_) => Reply::Acked,
            Err(_) => Reply::Failed,
        }
    }

    /// Runs a write on this node's copy, opened (rebuilt from the log) if
    /// it is not, and answers once its commit settled.
    async fn local(
        self: &Arc<Self>,
        node: &Arc<Node>,
        key: &str,
        owned: Owned,
        write: Write,
    ) -> Reply {
        let object = node.object(key);
        let mut guard = object.lock().await;
        if node.dead.load(Ordering::Relaxed) {
            return Reply::Failed;
        }
        let reusable = guard
            .as_ref()
            .is_some_and(|o| o.shipper.broken().is_none() && o.owned.fence() == owned.fence());
        if !reusable {
            *guard = None;
            let history = match node
                .ownership
                .coordinator()
                .history(owned.state.id, owned.state.head)
                .await
            {
                Ok(history) => history,
                Err(_) => return Reply::Failed,
            };
            // Claims make new rows with the empty database's checksum.
            let mut state = match &history.snapshot {
                Some((at, bytes)) => {
                    let state = decode_state(bytes);
                    assert_eq!(state.head, *at, "a snapshot holds its own head");
                    state
                }
                None => State {
                    checksum: weir_store::replica::EMPTY.into_inner(),
                    ..State::default()
                },
            };
            for (head, entry) in &history.log {
                assert_eq!(*head, state.head + 1, "a history without gaps");
                replay(&mut state, entry);
            }
            if state.head != owned.state.head || state.checksum != owned.state.checksum {
                // The row moved on since the claim: try again later.
                return Reply::Failed;
            }
            node.records.opened(key, state.head, state.checksum);
            let shipper = Shipper::new(key, node.ownership.clone(), node.records.clone(), owned);
            *guard = Some(Open {
                owned,
                written: state.head > 0,
                state,
                shipper,
            });
        }
        let open = guard.as_mut().unwrap();
        if matches!(write, Write::Alarm) && open.state.alarm.is_none() {
            return Reply::Acked;
        }
        let alarm_at = self.model.now_ms() + ALARM_AFTER_MS;
        let bytes = encode(write, alarm_at);
        replay(&mut open.state, &bytes);
        open.written = true;
        open.shipper.ship(
            vec![SimCommit {
                head: open.state.head,
                bytes,
                checksum: open.state.checksum,
            }],
            weir_store::replica::Mirror::alarm(open.state.alarm),
        );
        // Now and then the object is compacted at this head, while the
        // commits up to it may still be queued and later ones join them.
        if self.faults.rng().chance(SNAPSHOT_ONE_IN) {
            open.shipper
                .snapshot(open.state.head, encode_state(&open.state));
        }
        let settled = open.shipper.settled();
        drop(guard);
        match settled.await {
            Ok(()) => Reply::Acked,
            Err(_) => Reply::Failed,
        }
    }
}
