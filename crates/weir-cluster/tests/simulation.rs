//! The cluster protocol under a deterministic simulation: the node-side
//! code that runs against PostgreSQL in production — the lease keeper
//! (`Lease`), claims and placement (`Ownership`), fenced shipping
//! (`Shipper`) and the orphaned-alarm sweep — runs unchanged against an
//! in-memory coordinator with PostgreSQL's rules (`sim/model.rs`), through
//! links that lose requests and answers, delay them (a paused process, a
//! stalled network), partition nodes and crash them. Time is tokio's
//! paused clock on one thread, and every choice comes from one seed, so a
//! schedule replays exactly (`WEIR_SIM_SEED=<seed>`).
//!
//! Each schedule checks the invariants the issue names:
//! - at most one committing owner per epoch (the model records each
//!   commit's session against its object and epoch);
//! - no acknowledged write lost (every acknowledged write is in its
//!   object's log, exactly once);
//! - every due alarm delivered (each object's alarm, set by its first
//!   write, is delivered at least once after the faults end);
//! - a deletion is fenced and whole: an acknowledged write is gone only
//!   if a deletion accepted after it was sent took it, and no write
//!   acknowledged before an acknowledged deletion was sent outlives it.

mod sim;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use weir_cluster::coordinator::Coordinator;
use weir_cluster::lease::Lease;
use weir_cluster::ownership::{Located, Owned, Ownership};
use weir_cluster::shipper::{Records, Shipper};

use sim::link::{Faults, Link, Rng};
use sim::model::Model;
use sim::object::{SimCommit, State, Write, decode_state, encode, encode_state, replay};

/// Schedules run by default; `WEIR_SIM_SCHEDULES` sets another number.
const SCHEDULES: u64 = 10_000;

const NODES: usize = 3;
const OBJECTS: usize = 3;
const TTL: Duration = Duration::from_millis(1000);
/// How long faults go on; then everything heals.
const FAULTS_FOR: Duration = Duration::from_millis(6000);
/// How long a schedule runs in all (room for leases to lapse, alarms to
/// fall due and be swept after the faults end).
const RUN_FOR: Duration = Duration::from_millis(16_000);
/// A client write every this long, on average.
const WRITE_EVERY_MS: u64 = 60;
/// An object's alarm falls due this long after its first write.
const ALARM_AFTER_MS: i64 = 2_500;
/// One write in this many asks for a snapshot of its object at its head.
const SNAPSHOT_ONE_IN: u64 = 6;
/// One client call in this many deletes its object instead of writing
/// (an operator's deletion, run by the owner as a call is).
const DELETE_ONE_IN: u64 = 25;

/// A write acknowledged: its id, when it was sent, when acknowledged.
type AckedWrite = (u64, Instant, Instant);

/// What a client asks of an object.
#[derive(Clone, Copy, Debug)]
enum Op {
    Write(u64),
    Delete,
}

/// An object open on a node.
struct Open {
    owned: Owned,
    state: State,
    shipper: Shipper<SimCommit>,
    /// The first write set the alarm already (replayed or written here).
    written: bool,
}

/// One node: the production protocol code on a link of its own.
struct Node {
    address: String,
    ownership: Arc<Ownership>,
    records: Arc<Records>,
    objects: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<Option<Open>>>>>,
    dead: Arc<AtomicBool>,
    stop: watch::Sender<bool>,
    due: Mutex<BTreeSet<String>>,
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
enum Reply {
    Acked,
    /// It did not run (not the owner, or nothing reached the node).
    NotRun,
    /// It may or may not have run.
    Failed,
}

struct Cluster {
    model: Arc<Model>,
    faults: Arc<Faults>,
    nodes: Mutex<Vec<Arc<Node>>>,
    /// Client writes acknowledged, by object: each one's id, when it was
    /// sent and when it was acknowledged.
    acked: Mutex<BTreeMap<String, Vec<AckedWrite>>>,
    /// Deletions acknowledged: each one's object and when it was sent.
    deleted: Mutex<Vec<(String, Instant)>>,
}

impl Cluster {
    fn node(&self, i: usize) -> Arc<Node> {
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
    async fn start(self: &Arc<Self>, index: usize) -> Arc<Node> {
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
    fn crash(&self, index: usize) {
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
    async fn call(self: &Arc<Self>, entry: usize, key: &str, op: Op) -> Reply {
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
            open.state.alarm,
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

/// One schedule: its faults, its writes, then its checks. `Err` names
/// every invariant it broke.
async fn schedule(seed: u64, fenced: bool) -> Result<String, String> {
    let faults = Arc::new(Faults {
        rng: Mutex::new(Rng(seed)),
        healed: AtomicBool::new(false),
        partitioned: Mutex::new(BTreeMap::new()),
    });
    let cluster = Arc::new(Cluster {
        model: Arc::new(Model::new(fenced)),
        faults: faults.clone(),
        nodes: Mutex::new(Vec::new()),
        acked: Mutex::new(BTreeMap::new()),
        deleted: Mutex::new(Vec::new()),
    });
    for i in 0..NODES {
        let node = cluster.start(i).await;
        cluster.nodes.lock().unwrap().push(node);
    }
    let begin = Instant::now();
    // Disruptions: crashes (restarted later), partitions.
    let disrupt = {
        let cluster = cluster.clone();
        tokio::spawn(async move {
            loop {
                let (wait, what, who, span) = {
                    let mut rng = cluster.faults.rng();
                    (
                        Duration::from_millis(300 + rng.below(1500)),
                        rng.below(2),
                        rng.below(NODES as u64) as usize,
                        Duration::from_millis(300 + rng.below(2500)),
                    )
                };
                tokio::time::sleep(wait).await;
                if Instant::now() - begin >= FAULTS_FOR {
                    return;
                }
                match what {
                    0 => {
                        cluster.crash(who);
                        let cluster = cluster.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(span).await;
                            let node = cluster.start(who).await;
                            cluster.nodes.lock().unwrap()[who] = node;
                        });
                    }
                    _ => {
                        cluster
                            .faults
                            .partitioned
                            .lock()
                            .unwrap()
                            .insert(who, Instant::now() + span);
                    }
                }
            }
        })
    };
    // Clients.
    let next_id = Arc::new(AtomicU64::new(1));
    let writing = {
        let cluster = cluster.clone();
        tokio::spawn(async move {
            let mut calls = Vec::new();
            while Instant::now() - begin < FAULTS_FOR + Duration::from_millis(2000) {
                let (wait, entry, object, delete) = {
                    let mut rng = cluster.faults.rng();
                    (
                        Duration::from_millis(rng.below(2 * WRITE_EVERY_MS)),
                        rng.below(NODES as u64) as usize,
                        rng.below(OBJECTS as u64),
                        rng.chance(DELETE_ONE_IN),
                    )
                };
                tokio::time::sleep(wait).await;
                let op = if delete {
                    Op::Delete
                } else {
                    Op::Write(next_id.fetch_add(1, Ordering::Relaxed))
                };
                let cluster = cluster.clone();
                calls.push(tokio::spawn(async move {
                    let key = format!("actor/sim/o/{object}");
                    let sent = Instant::now();
                    let reply = cluster.call(entry, &key, op).await;
                    if reply == Reply::Acked {
                        match op {
                            Op::Write(id) => {
                                cluster.acked.lock().unwrap().entry(key).or_default().push((
                                    id,
                                    sent,
                                    Instant::now(),
                                ))
                            }
                            Op::Delete => cluster.deleted.lock().unwrap().push((key, sent)),
                        }
                    }
                    (op, reply)
                }));
            }
            let mut replies = BTreeMap::new();
            for call in calls {
                if let Ok((op, reply)) = call.await {
                    let what = match op {
                        Op::Write(_) => "write",
                        Op::Delete => "delete",
                    };
                    *replies.entry(format!("{what} {reply:?}")).or_insert(0u64) += 1;
                }
            }
            replies
        })
    };
    tokio::time::sleep(FAULTS_FOR).await;
    faults.healed.store(true, Ordering::Relaxed);
    let _ = disrupt.await;
    let replies = writing.await.unwrap_or_default();
    // Every node back up (a crash restarting late included).
    tokio::time::sleep(Duration::from_millis(3000)).await;
    for i in 0..NODES {
        if cluster.node(i).dead.load(Ordering::Relaxed) {
            let node = cluster.start(i).await;
            cluster.nodes.lock().unwrap()[i] = node;
        }
    }
    let left = RUN_FOR.saturating_sub(Instant::now() - begin);
    tokio::time::sleep(left).await;

    // The checks.
    let mut wrong = cluster.model.check_logs();
    let logs = cluster.model.logs();
    let erased = cluster.model.erased();
    let written = |log: &[Vec<u8>]| -> Vec<u64> {
        log.iter()
            .filter(|e| e[0] == b'w')
            .map(|e| u64::from_be_bytes(e[1..9].try_into().unwrap()))
            .collect()
    };
    let acked = cluster.acked.lock().unwrap().clone();
    let mut acked_total = 0;
    let mut finals: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let keys: BTreeSet<&String> = logs
        .keys()
        .chain(erased.keys())
        .chain(acked.keys())
        .collect();
    for key in keys {
        // Each write once, in the object's log or in one deleted before it.
        let kept = written(logs.get(key).map_or(&[][..], |l| &l[..]));
        let lives: Vec<(Instant, Vec<u64>)> = erased
            .get(key)
            .map(|e| e.iter().map(|(at, log)| (*at, written(log))).collect())
            .unwrap_or_default();
        let every: Vec<u64> = kept
            .iter()
            .chain(lives.iter().flat_map(|(_, ids)| ids))
            .copied()
            .collect();
        if every.iter().copied().collect::<BTreeSet<_>>().len() != every.len() {
            wrong.push(format!("{key}: a write is in the logs twice"));
        }
        let kept: BTreeSet<u64> = kept.into_iter().collect();
        for (id, sent, _) in acked.get(key).map_or(&[][..], |a| &a[..]) {
            acked_total += 1;
            if kept.contains(id) {
                continue;
            }
            match lives.iter().find(|(_, ids)| ids.contains(id)) {
                Some((at, _)) if at >= sent => {}
                Some(_) => wrong.push(format!(
                    "{key}: acknowledged write {id} is in a log deleted before it was sent"
                )),
                None => wrong.push(format!("{key}: acknowledged write {id} is lost")),
            }
        }
        finals.insert(key.clone(), kept);
    }
    // An acknowledged deletion took every write acknowledged before it
    // was sent.
    for (key, sent) in cluster.deleted.lock().unwrap().iter() {
        for (id, _, acked_at) in acked.get(key).map_or(&[][..], |a| &a[..]) {
            if acked_at < sent && finals.get(key).is_some_and(|k| k.contains(id)) {
                wrong.push(format!(
                    "{key}: write {id}, acknowledged before a deletion that was acknowledged, \
                     outlived it"
                ));
            }
        }
    }
    let mut delivered = 0;
    for (key, log) in &logs {
        let set = log.iter().any(|e| e[0] == b'w');
        let fired = log.iter().any(|e| e[0] == b'a');
        if set && !fired {
            wrong.push(format!("{key}: its alarm was never delivered"));
        }
        if fired {
            delivered += 1;
        }
    }
    for i in 0..NODES {
        cluster.crash(i);
    }
    let (takeovers, refused, runs, snapshots, deletions) = cluster.model.counts();
    if wrong.is_empty() {
        Ok(format!(
            "{acked_total} acknowledged, {delivered} alarms delivered, {takeovers} takeovers, \
             {refused} commits refused by the fence, {runs} entries of several writes, \
             {snapshots} snapshots, {deletions} deletions, replies {replies:?}"
        ))
    } else {
        Err(wrong.join("\n"))
    }
}

/// Runs one schedule on a runtime of its own: one thread, paused time.
fn run(seed: u64) -> Result<String, String> {
    run_with(seed, true)
}

fn run_with(seed: u64, fenced: bool) -> Result<String, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(schedule(seed, fenced))
}

/// The checks are not hollow: with the fence taken out of the
/// coordinator, they catch it within a few schedules.
#[test]
fn a_coordinator_without_its_fence_is_caught() {
    let caught = (0..200).find_map(|seed| run_with(seed, false).err());
    let wrong = caught.expect("200 schedules without a fence broke no invariant");
    assert!(
        wrong.contains("was accepted after epoch") || wrong.contains("both committed"),
        "{wrong}"
    );
}

#[test]
fn one_schedule_replays_exactly() {
    let a = run(7);
    let b = run(7);
    assert_eq!(a, b, "the same seed, the same run");
    assert!(a.is_ok(), "{a:?}");
}

#[test]
fn the_protocol_keeps_its_invariants_over_ten_thousand_seeded_schedules() {
    if let Ok(seed) = std::env::var("WEIR_SIM_SEED") {
        let seed: u64 = seed.parse().expect("a number");
        match run(seed) {
            Ok(summary) => println!("seed {seed}: {summary}"),
            Err(wrong) => panic!("seed {seed}:\n{wrong}"),
        }
        return;
    }
    let schedules = std::env::var("WEIR_SIM_SCHEDULES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(SCHEDULES);
    let started = std::time::Instant::now();
    // Each schedule is independent and runs on a runtime of its own, so
    // the seeds are shared out over the machine's cores; the totals are
    // sums, and a failure names the lowest failing seed whatever the order.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let outcomes: Vec<Result<[u64; 6], (u64, String)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| scope.spawn(move || schedules_from(t, threads, schedules)))
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mut totals = [0u64; 6];
    let mut failed: Option<(u64, String)> = None;
    for outcome in outcomes {
        match outcome {
            Ok(sums) => totals.iter_mut().zip(sums).for_each(|(t, s)| *t += s),
            Err((seed, wrong)) => {
                if failed.as_ref().is_none_or(|(first, _)| seed < *first) {
                    failed = Some((seed, wrong));
                }
            }
        }
    }
    if let Some((seed, wrong)) = failed {
        panic!("seed {seed} (replay with WEIR_SIM_SEED={seed}):\n{wrong}");
    }
    let [acked, takeovers, refused, runs, snapshots, deletions] = totals;
    println!(
        "{schedules} schedules: {acked} acknowledged writes, {takeovers} takeovers, \
         {refused} commits refused by the fence, {runs} entries of several writes, {snapshots} snapshots, \
         {deletions} deletions; every invariant held, in {:?}",
        started.elapsed()
    );
    assert!(deletions > 0, "objects were deleted under the faults");
    assert!(
        takeovers > schedules,
        "the faults moved objects between nodes"
    );
    assert!(refused > 0, "the fence refused stale commits");
    assert!(
        runs > 0,
        "writes queued during a round trip went as one entry"
    );
}

/// Runs every `step`th seed below `schedules` from `first`; the sums of
/// their summaries (acknowledged, takeovers, refused, runs, snapshots,
/// deletions), or the first seed that broke an invariant and what it broke.
fn schedules_from(first: u64, step: u64, schedules: u64) -> Result<[u64; 6], (u64, String)> {
    let number = |summary: &str, i: usize| {
        summary
            .split(", ")
            .nth(i)
            .and_then(|part| part.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let mut sums = [0u64; 6];
    for seed in (first..schedules).step_by(step as usize) {
        let summary = run(seed).map_err(|wrong| (seed, wrong))?;
        for (sum, i) in sums.iter_mut().zip([0, 2, 3, 4, 5, 6]) {
            *sum += number(&summary, i);
        }
    }
    Ok(sums)
}
