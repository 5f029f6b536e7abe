//! The actor host: every declared class, every actor in memory, the calls
//! that reach them, the timer dispatcher and hibernation.
//!
//! Invariants owned here:
//! - at most one live instance of an actor exists: an actor is reached only
//!   through its one cell, and a cell leaves the map (hibernation) only
//!   while nobody holds or waits for its turn — checked under the same lock
//!   that callers take to find the cell;
//! - an actor runs one turn at a time, in arrival order (a fair lock); at
//!   most `actor_max_queued` callers wait, and one more is refused at once
//!   with `actor_overloaded`;
//! - a turn, once started, runs to its end on its own task: a caller that
//!   leaves does not cut a turn short (its writes commit or roll back as a
//!   whole), and a caller that left before its turn began never enters Wasm;
//! - an actor with no event in flight is evicted after `actor_idle_ms`: its
//!   instance and its database are dropped; its timers stay in the index
//!   and wake it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::oneshot;
use weir_runtime::actor_host::now_ms;
use weir_runtime::metrics::{ActorClassMetrics, AppMetrics};
use weir_runtime::outbound::ActorCalls;
use weir_runtime::receipt::ReceiptSink;
use weir_runtime::{AppCode, ErrorCode};
use weir_store::actor::{ActorDb, CHECKPOINT_ON_CLOSE_COMMITS};

use crate::address::{ActorAddress, AddressError};
use crate::directory::{ActorDirectory, Unreadable};
use crate::timers::{MAX_DISPATCH_SLEEP_MS, TimerIndex, WAKE_RETRY_MS};
use crate::turn::{
    AlarmOutcome, Live, TurnContext, TurnReport, alarm_turns, error_response, request_turn,
};

/// Shortest pause between hibernation sweeps; the sweep interval is a
/// quarter of `actor_idle_ms`, but never busier than this.
pub const MIN_SWEEP_INTERVAL: Duration = Duration::from_millis(50);

/// Longest pause between hibernation sweeps, so an idle actor is evicted
/// within `actor_idle_ms` plus at most this.
pub const MAX_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// File descriptors one live actor holds: its database and its WAL (no
/// shared-memory file: each connection holds its database exclusively).
pub const FDS_PER_LIVE_ACTOR: u64 = 2;

/// File descriptors left for everything else — listeners, client and
/// upstream connections, stores — when the live-actor cap is derived from
/// the process's descriptor limit.
pub const FD_RESERVE: u64 = 1024;

/// Memory mappings one live actor's instance holds, rounded up from the ~7
/// measured (linear memory and its guards, stacks, tables).
pub const MAPS_PER_LIVE_ACTOR: u64 = 8;

/// Memory mappings left for everything else: the worker pool, threads,
/// libraries, the allocator. Past the kernel's map count, every mmap —
/// a thread's stack, a large allocation — fails.
pub const MAP_RESERVE: u64 = 8192;

/// Live actors allowed when an operating-system limit cannot be read.
pub const DEFAULT_MAX_LIVE_ACTORS: usize = 4096;

/// Fewest actors allowed in memory, whatever the open-file limit says.
pub const MIN_LIVE_ACTORS: usize = 16;

/// Idle actors hibernated at once when a new actor needs room, at most: a
/// batch amortizes the search for the least recently used.
pub const EVICTION_BATCH: usize = 32;

/// A batch is also at most this fraction of the live-actor cap (1/8), so
/// that under a small cap most recently used actors stay in memory.
pub const EVICTION_BATCH_DIVISOR: usize = 8;

/// Most entries an inspection dumps; a larger actor is paged with `start`.
pub const MAX_INSPECT_ENTRIES: u32 = 1_000;

/// One declared actor class.
pub struct ActorClass {
    pub name: String,
    pub code: AppCode,
    /// Generation counts (as an app `actor:<class>`).
    pub metrics: AppMetrics,
    pub actor_metrics: ActorClassMetrics,
    next_generation: AtomicU64,
}

impl ActorClass {
    pub fn new(
        name: String,
        code: AppCode,
        metrics: AppMetrics,
        actor_metrics: ActorClassMetrics,
    ) -> ActorClass {
        ActorClass {
            name,
            code,
            metrics,
            actor_metrics,
            next_generation: AtomicU64::new(1),
        }
    }
}

/// One actor in memory: its turn lock and what it holds between turns.
struct Cell {
    address: ActorAddress,
    class: Arc<ActorClass>,
    /// Callers holding or waiting for the turn. Raised only under the
    /// host's map lock, so the sweeper sees every caller.
    pending: AtomicUsize,
    /// Calls waiting for their turn, in arrival order.
    inbox: Mutex<Inbox>,
    live: tokio::sync::Mutex<Live>,
    /// When the last turn ended, in ms since the host started.
    last_active_ms: AtomicU64,
    /// The host-wide order of its last turn's end: exact where
    /// milliseconds tie, so eviction takes the least recently used.
    last_turn: AtomicU64,
}

/// The calls of one actor waiting for their turns, and whether a runner
/// task is taking them.
#[derive(Default)]
struct Inbox {
    calls: std::collections::VecDeque<QueuedCall>,
    running: bool,
}

/// A call waiting for its turn; its claim keeps the actor in memory.
struct QueuedCall {
    request: http::Request<Bytes>,
    reply: oneshot::Sender<http::Response<Bytes>>,
    arrived: Instant,
    claim: Claim,
}

/// A caller's claim on a cell; dropping it ends the claim.
struct Claim {
    cell: Arc<Cell>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.cell.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counters of the actor host, for `/actors` and metrics.
#[derive(Default)]
struct Counters {
    turns: AtomicU64,
    failed_turns: AtomicU64,
    wakes: AtomicU64,
    hibernations: AtomicU64,
    overloaded: AtomicU64,
    alarms: AtomicU64,
    alarms_dropped: AtomicU64,
    dispatches: AtomicU64,
}

/// Every actor class and every actor in memory.
pub struct ActorHost {
    classes: HashMap<String, Arc<ActorClass>>,
    directory: ActorDirectory,
    cells: Mutex<HashMap<ActorAddress, Arc<Cell>>>,
    timers: TimerIndex,
    sink: Option<Arc<dyn ReceiptSink>>,
    started: Instant,
    counters: Counters,
    /// Actors in memory at most: each holds open files, and the process
    /// has a limit on those. A new actor beyond it hibernates the least
    /// recently used idle ones first.
    max_live: usize,
    /// Where evicted actors go to be closed.
    closer: std::sync::mpsc::Sender<Vec<Arc<Cell>>>,
    /// Evicted actors not yet closed (their memory not yet returned).
    closing: Arc<AtomicUsize>,
    /// Hands out [`Cell::last_turn`].
    turn_order: AtomicU64,
    /// Database files found at start that could not be used: skipped.
    unreadable: Vec<Unreadable>,
}

/// Why an operator's request about an actor failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("no actor class `{0}` is declared")]
    UnknownClass(String),
    #[error(transparent)]
    Address(#[from] AddressError),
    #[error("actor {0} does not exist")]
    NotFound(ActorAddress),
    #[error("{0}")]
    Storage(String),
}

/// One actor as operators see it.
#[derive(Debug, Serialize)]
pub struct ActorSummary {
    pub class: String,
    pub name: String,
    /// In memory now (instance and database open), or hibernated.
    pub live: bool,
    /// Callers queued for a turn that still want it (a caller that left
    /// stays queued, but is skipped when its turn comes).
    pub waiting: usize,
    pub storage_bytes: u64,
    /// Earliest timer, ms since the Unix epoch.
    pub next_timer_ms: Option<i64>,
}

/// One actor in detail.
#[derive(Debug, Serialize)]
pub struct ActorDetail {
    #[serde(flatten)]
    pub summary: ActorSummary,
    pub incarnation: u64,
    pub entries: u64,
    pub timers: Vec<TimerView>,
    /// Entries (up to [`MAX_INSPECT_ENTRIES`]) when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<EntryView>>,
}

#[derive(Debug, Serialize)]
pub struct TimerView {
    pub reason: String,
    pub at_ms: i64,
    pub attempt: u32,
}

/// An entry: its value as UTF-8 text when it is, else as hex.
#[derive(Debug, Serialize)]
pub struct EntryView {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hex: Option<String>,
    pub bytes: usize,
}

/// The classes and counters, for `/actors`.
#[derive(Debug, Serialize)]
pub struct HostStatus {
    pub classes: Vec<String>,
    pub live: usize,
    /// Actors allowed in memory at once.
    pub max_live: usize,
    pub pending_timers: usize,
    pub turns: u64,
    pub failed_turns: u64,
    pub wakes: u64,
    pub hibernations: u64,
    pub overloaded: u64,
    pub alarms: u64,
    pub alarms_dropped: u64,
    /// Hibernated actors whose instances are still being freed.
    pub closing: usize,
    /// Database files found at start that could not be used (skipped).
    pub unreadable: Vec<Unreadable>,
}

#[derive(Serialize)]
struct ReceiptLine<'a> {
    timestamp: String,
    level: &'static str,
    target: &'static str,
    fields: ReceiptFields<'a>,
}

#[derive(Serialize)]
struct ReceiptFields<'a> {
    message: &'static str,
    class: &'a str,
    name: &'a str,
    turn: &'static str,
    incarnation: u64,
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    /// Which delivery of due timers ran this alarm turn (one per wake of
    /// the actor by the dispatcher).
    #[serde(skip_serializing_if = "Option::is_none")]
    dispatch: Option<u64>,
    woke: bool,
    /// Waiting for the actor's turn (behind earlier turns).
    #[serde(skip_serializing_if = "Option::is_none")]
    queued_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    wasm_us: Option<u64>,
    total_us: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn file_size(path: &std::path::Path) -> u64 {
    let mut total = 0;
    for suffix in ["", "-wal"] {
        let file = format!("{}{suffix}", path.display());
        total += std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
    }
    total
}

impl ActorHost {
    /// A host for `classes`, with actors' databases under `directory`. The
    /// timers of every existing actor are indexed before it returns.
    pub fn new(
        classes: Vec<ActorClass>,
        directory: ActorDirectory,
        sink: Option<Arc<dyn ReceiptSink>>,
    ) -> Result<Arc<ActorHost>, AdminError> {
        let closing = Arc::new(AtomicUsize::new(0));
        let host = ActorHost {
            classes: classes
                .into_iter()
                .map(|c| (c.name.clone(), Arc::new(c)))
                .collect(),
            directory,
            cells: Mutex::new(HashMap::new()),
            timers: TimerIndex::default(),
            sink,
            started: Instant::now(),
            counters: Counters::default(),
            max_live: 0,
            closer: start_closer(closing.clone()),
            closing,
            turn_order: AtomicU64::new(1),
            unreadable: Vec::new(),
        };
        let by_files = crate::os_limits::raise_open_files()
            .map(|n| (n.saturating_sub(FD_RESERVE) / FDS_PER_LIVE_ACTOR) as usize)
            .unwrap_or(DEFAULT_MAX_LIVE_ACTORS);
        let by_maps = crate::os_limits::max_map_count()
            .map(|n| (n.saturating_sub(MAP_RESERVE) / MAPS_PER_LIVE_ACTOR) as usize)
            .unwrap_or(DEFAULT_MAX_LIVE_ACTORS);
        let configured = host
            .classes
            .values()
            .map(|c| c.code.limits.max_live_actors)
            .min()
            .unwrap_or(DEFAULT_MAX_LIVE_ACTORS);
        let mut host = host;
        host.max_live = by_files.min(by_maps).min(configured).max(MIN_LIVE_ACTORS);
        let mut unreadable = Vec::new();
        for class in host.classes.keys() {
            let (actors, strangers) = host
                .directory
                .scan(class)
                .map_err(|e| AdminError::Storage(e.to_string()))?;
            unreadable.extend(strangers);
            for actor in actors {
                // No actor runs yet: open each briefly, as its own turn
                // would. One that cannot be opened is reported and skipped;
                // the others are served.
                match host
                    .directory
                    .open(&actor)
                    .and_then(|db| db.next_deadline())
                {
                    Ok(next) => host.timers.set(&actor, next),
                    Err(e) => unreadable.push(Unreadable {
                        path: host.directory.path(&actor),
                        error: e.to_string(),
                    }),
                }
            }
        }
        for u in &unreadable {
            tracing::warn!(path = %u.path.display(), error = %u.error, "skipping an actor database that cannot be used");
        }
        host.unreadable = unreadable;
        Ok(Arc::new(host))
    }

    /// Starts the timer dispatcher and the hibernation sweeper; they stop
    /// when the host is dropped.
    pub fn start(self: &Arc<Self>) {
        tokio::spawn(dispatch(Arc::downgrade(self)));
        tokio::spawn(sweep(Arc::downgrade(self)));
    }

    fn lock_cells(&self) -> std::sync::MutexGuard<'_, HashMap<ActorAddress, Arc<Cell>>> {
        self.cells.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn class(&self, name: &str) -> Result<&Arc<ActorClass>, AdminError> {
        self.classes
            .get(name)
            .ok_or_else(|| AdminError::UnknownClass(name.to_string()))
    }

    fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Claims an actor's cell, creating it if the actor is not in memory.
    /// `limit` bounds the callers already waiting; `None` always admits
    /// (timers and operators), even past the live-actor cap.
    fn claim(
        &self,
        address: &ActorAddress,
        class: &Arc<ActorClass>,
        limit: Option<usize>,
    ) -> Result<Claim, ErrorCode> {
        let mut cells = self.lock_cells();
        if cells.len() >= self.max_live && !cells.contains_key(address) {
            self.evict_least_recent(&mut cells);
            if cells.len() >= self.max_live && limit.is_some() {
                tracing::warn!(
                    live = cells.len(),
                    max = self.max_live,
                    "no idle actor to hibernate for a new one"
                );
                return Err(ErrorCode::HostUnavailable);
            }
        }
        let cell = cells
            .entry(address.clone())
            .or_insert_with(|| {
                Arc::new(Cell {
                    address: address.clone(),
                    class: class.clone(),
                    pending: AtomicUsize::new(0),
                    inbox: Mutex::new(Inbox::default()),
                    live: tokio::sync::Mutex::new(Live::default()),
                    last_active_ms: AtomicU64::new(0),
                    last_turn: AtomicU64::new(0),
                })
            })
            .clone();
        // One caller runs while up to `limit` wait.
        let before = cell.pending.fetch_add(1, Ordering::AcqRel);
        let claim = Claim { cell };
        if limit.is_some_and(|limit| before > limit) {
            return Err(ErrorCode::ActorOverloaded);
        }
        Ok(claim)
    }

    /// Hibernates up to [`EVICTION_BATCH`] idle actors, least recently
    /// active first, to make room for a new one.
    fn evict_least_recent(&self, cells: &mut HashMap<ActorAddress, Arc<Cell>>) {
        let mut idle: Vec<(u64, ActorAddress)> = cells
            .iter()
            .filter(|(_, c)| c.pending.load(Ordering::Acquire) == 0)
            .map(|(a, c)| (c.last_turn.load(Ordering::Relaxed), a.clone()))
            .collect();
        let batch = (self.max_live / EVICTION_BATCH_DIVISOR).clamp(1, EVICTION_BATCH);
        let n = idle.len().min(batch);
        if n == 0 {
            return;
        }
        if n < idle.len() {
            idle.select_nth_unstable(n - 1);
        }
        let evicted: Vec<Arc<Cell>> = idle[..n]
            .iter()
            .filter_map(|(_, a)| cells.remove(a))
            .inspect(|c| c.class.actor_metrics.hibernated())
            .collect();
        self.counters
            .hibernations
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        self.close_evicted(evicted);
    }

    /// Hands evicted actors to the closer thread.
    fn close_evicted(&self, evicted: Vec<Arc<Cell>>) {
        if evicted.is_empty() {
            return;
        }
        // If the closer is gone, the batch comes back and drops here.
        let n = evicted.len();
        self.closing.fetch_add(n, Ordering::AcqRel);
        if self.closer.send(evicted).is_err() {
            self.closing.fetch_sub(n, Ordering::AcqRel);
        }
    }

    fn context<'a>(&'a self, cell: &'a Cell) -> TurnContext<'a> {
        TurnContext {
            address: &cell.address,
            code: &cell.class.code,
            directory: &self.directory,
            metrics: &cell.class.metrics,
            next_generation: &cell.class.next_generation,
        }
    }

    /// Ends a turn's bookkeeping: the actor's next deadline goes back into
    /// the index (when its timers may have changed, or always after alarm
    /// turns), and its idle clock restarts.
    fn after_turn(&self, cell: &Cell, live: &Live, alarms_ran: bool) {
        if let Some(gate) = &live.gate
            && (gate.take_timers_changed() || alarms_ran)
        {
            self.timers.set(&cell.address, live.next_deadline());
        }
        cell.last_active_ms
            .store(self.elapsed_ms(), Ordering::Relaxed);
        cell.last_turn.store(
            self.turn_order.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }

    fn receipt(
        &self,
        cell: &Cell,
        turn: &'static str,
        report: &TurnReport,
        extra: ReceiptExtra<'_>,
        started: Instant,
        ended: Instant,
    ) {
        let metrics = &cell.class.actor_metrics;
        if report.error.is_some() {
            self.counters.failed_turns.fetch_add(1, Ordering::Relaxed);
        }
        if report.woke {
            self.counters.wakes.fetch_add(1, Ordering::Relaxed);
            metrics.woke();
        }
        match turn {
            "request" => {
                metrics.request_turn(report.error.is_none(), (ended - started).as_secs_f64())
            }
            _ => metrics.alarm_turn(report.error.is_none()),
        }
        let Some(sink) = &self.sink else { return };
        let line = ReceiptLine {
            timestamp: humantime::format_rfc3339_micros(
                std::time::SystemTime::now() - ended.elapsed(),
            )
            .to_string(),
            level: if report.error.is_some() {
                "WARN"
            } else {
                "INFO"
            },
            target: "weir::actor",
            fields: ReceiptFields {
                message: "turn",
                class: &cell.address.class,
                name: &cell.address.name,
                turn,
                incarnation: report.incarnation,
                outcome: extra.outcome.unwrap_or(if report.error.is_some() {
                    "failed"
                } else {
                    "ok"
                }),
                error: report.error.map(|e| e.as_str()),
                status: extra.status,
                reason: extra.reason,
                attempt: extra.attempt,
                dispatch: extra.dispatch,
                woke: report.woke,
                queued_us: extra.queued.map(|q| q.as_micros() as u64),
                wasm_us: report.wasm.map(|w| w.as_micros() as u64),
                total_us: (ended - started).as_micros() as u64,
                detail: report.detail.as_deref(),
            },
        };
        if let Ok(mut bytes) = serde_json::to_vec(&line) {
            bytes.push(b'\n');
            sink.write_line(&bytes);
        }
    }

    /// Runs a call to an actor and returns its response (or Weir's error).
    pub async fn call_actor(
        self: &Arc<Self>,
        request: http::Request<Bytes>,
    ) -> http::Response<Bytes> {
        // The whole authority, so that a port or user information makes
        // the address invalid rather than being dropped.
        let host = request
            .uri()
            .authority()
            .map(|a| a.as_str().to_string())
            .or_else(|| {
                request
                    .headers()
                    .get(http::header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        let address = match ActorAddress::from_host(&host) {
            Ok(address) => address,
            Err(_) => return error_response(ErrorCode::ActorAddressInvalid),
        };
        self.call_address(address, request).await
    }

    /// Runs a call to the actor at `address`.
    pub async fn call_address(
        self: &Arc<Self>,
        address: ActorAddress,
        request: http::Request<Bytes>,
    ) -> http::Response<Bytes> {
        let Ok(class) = self.class(&address.class).cloned() else {
            return error_response(ErrorCode::ActorClassUnknown);
        };
        let claim = match self.claim(&address, &class, Some(class.code.limits.actor_max_queued)) {
            Ok(claim) => claim,
            Err(code) => {
                if code == ErrorCode::ActorOverloaded {
                    self.counters.overloaded.fetch_add(1, Ordering::Relaxed);
                    class.actor_metrics.overloaded();
                }
                return error_response(code);
            }
        };
        let (reply, rx) = oneshot::channel();
        let cell = claim.cell.clone();
        let start_runner = {
            let mut inbox = cell.inbox.lock().unwrap_or_else(|p| p.into_inner());
            inbox.calls.push_back(QueuedCall {
                request,
                reply,
                arrived: Instant::now(),
                claim,
            });
            !std::mem::replace(&mut inbox.running, true)
        };
        if start_runner {
            tokio::spawn(self.clone().run_calls(cell));
        }
        rx.await
            .unwrap_or_else(|_| error_response(ErrorCode::HostUnavailable))
    }

    /// Runs an actor's queued calls, one turn after another, on one task:
    /// the next turn starts as soon as the last one ends, with no hand-off
    /// between tasks. Turns run here, not on the callers' tasks, so a
    /// caller that goes away does not cut one short; a caller that left
    /// before its turn began is skipped. Between turns the actor is
    /// released, so due timers and operators get their turn in order.
    async fn run_calls(self: Arc<Self>, cell: Arc<Cell>) {
        loop {
            let mut live = cell.live.lock().await;
            let call = {
                let mut inbox = cell.inbox.lock().unwrap_or_else(|p| p.into_inner());
                match inbox.calls.pop_front() {
                    Some(call) => call,
                    None => {
                        inbox.running = false;
                        return;
                    }
                }
            };
            let QueuedCall {
                request,
                reply,
                arrived,
                claim,
            } = call;
            if reply.is_closed() {
                continue; // the caller left before its turn: never run it
            }
            let queued = arrived.elapsed();
            let (response, report) = request_turn(&self.context(&cell), &mut live, request).await;
            self.after_turn(&cell, &live, false);
            self.counters.turns.fetch_add(1, Ordering::Relaxed);
            let status = response.status().as_u16();
            // The receipt's end is taken while the turn is still held, so
            // its time span never overlaps the next turn's.
            let ended = Instant::now();
            let _ = reply.send(response);
            drop(live);
            self.receipt(
                &cell,
                "request",
                &report,
                ReceiptExtra {
                    status: Some(status),
                    queued: Some(queued),
                    ..Default::default()
                },
                arrived,
                ended,
            );
            drop(claim);
        }
    }

    /// Delivers the due timers of one actor.
    async fn deliver(self: Arc<Self>, address: ActorAddress) {
        let Ok(class) = self.class(&address.class).cloned() else {
            return;
        };
        let claim = self
            .claim(&address, &class, None)
            .expect("unlimited claims are never refused");
        let cell = claim.cell.clone();
        let mut live = cell.live.lock().await;
        let started = Instant::now();
        let host = self.clone();
        let dispatch = self.counters.dispatches.fetch_add(1, Ordering::Relaxed) + 1;
        let result = alarm_turns(
            &self.context(&cell),
            &mut live,
            |reason, outcome, report| {
                host.counters.alarms.fetch_add(1, Ordering::Relaxed);
                let (label, attempt) = match outcome {
                    AlarmOutcome::Delivered { .. } => ("ok", None),
                    AlarmOutcome::Retrying { attempt, .. } => ("retrying", Some(*attempt)),
                    AlarmOutcome::Dropped { attempts, .. } => {
                        host.counters.alarms_dropped.fetch_add(1, Ordering::Relaxed);
                        cell.class.actor_metrics.alarm_dropped();
                        ("dropped", Some(*attempts))
                    }
                    AlarmOutcome::CommitFailed(_) => ("failed", None),
                };
                host.receipt(
                    &cell,
                    "alarm",
                    report,
                    ReceiptExtra {
                        outcome: Some(label),
                        reason: Some(reason),
                        attempt,
                        dispatch: Some(dispatch),
                        ..Default::default()
                    },
                    started,
                    Instant::now(),
                );
            },
        )
        .await;
        match result {
            Ok(()) => self.after_turn(&cell, &live, true),
            Err(why) => {
                tracing::warn!(actor = %address, error = %why, "cannot wake an actor for its timers; retrying");
                self.timers.set(&address, Some(now_ms() + WAKE_RETRY_MS));
            }
        }
        drop(live);
        drop(claim);
    }

    /// Evicts actors idle for `actor_idle_ms` with nobody waiting for them.
    fn hibernate_idle(&self) -> usize {
        let now = self.elapsed_ms();
        let mut evicted = Vec::new();
        {
            let mut cells = self.lock_cells();
            cells.retain(|_, cell| {
                if cell.pending.load(Ordering::Acquire) > 0 {
                    return true;
                }
                let idle_ms = cell.class.code.limits.actor_idle.as_millis() as u64;
                let idle_for = now.saturating_sub(cell.last_active_ms.load(Ordering::Relaxed));
                if idle_for < idle_ms {
                    return true;
                }
                cell.class.actor_metrics.hibernated();
                evicted.push(cell.clone());
                false
            });
            if let Some(class) = self.classes.values().next() {
                class.actor_metrics.set_in_memory(cells.len());
            }
        }
        let n = evicted.len();
        self.close_evicted(evicted);
        n
    }

    /// Actors in memory now.
    pub fn live_count(&self) -> usize {
        self.lock_cells().len()
    }

    pub fn status(&self) -> HostStatus {
        let mut classes: Vec<String> = self.classes.keys().cloned().collect();
        classes.sort();
        let c = &self.counters;
        HostStatus {
            classes,
            live: self.live_count(),
            max_live: self.max_live,
            pending_timers: self.timers.len(),
            turns: c.turns.load(Ordering::Relaxed),
            failed_turns: c.failed_turns.load(Ordering::Relaxed),
            wakes: c.wakes.load(Ordering::Relaxed),
            hibernations: c.hibernations.load(Ordering::Relaxed),
            overloaded: c.overloaded.load(Ordering::Relaxed),
            alarms: c.alarms.load(Ordering::Relaxed),
            alarms_dropped: c.alarms_dropped.load(Ordering::Relaxed),
            closing: self.closing.load(Ordering::Acquire),
            unreadable: self.unreadable.clone(),
        }
    }

    fn summary(&self, actor: &ActorAddress) -> ActorSummary {
        let cell = self.lock_cells().get(actor).cloned();
        let waiting = cell.as_ref().map_or(0, |c| {
            let inbox = c.inbox.lock().unwrap_or_else(|p| p.into_inner());
            inbox.calls.iter().filter(|q| !q.reply.is_closed()).count()
        });
        // Live: it has an instance now, or is in a turn (which has one).
        let live = cell.is_some_and(|c| match c.live.try_lock() {
            Ok(live) => live.generation.is_some(),
            Err(_) => true,
        });
        ActorSummary {
            live,
            waiting,
            storage_bytes: file_size(&self.directory.path(actor)),
            next_timer_ms: self.timers.get(actor),
            class: actor.class.clone(),
            name: actor.name.clone(),
        }
    }

    /// The actors of a class (every class when `None`), live or hibernated.
    pub fn list(&self, class: Option<&str>) -> Result<Vec<ActorSummary>, AdminError> {
        let mut classes: Vec<&String> = match class {
            Some(name) => vec![&self.class(name)?.name],
            None => self.classes.keys().collect(),
        };
        classes.sort();
        let mut out = Vec::new();
        for class in classes {
            for actor in self
                .directory
                .list(class)
                .map_err(|e| AdminError::Storage(e.to_string()))?
            {
                out.push(self.summary(&actor));
            }
        }
        Ok(out)
    }

    /// One actor in detail; with `keys`, its entries from `start` on.
    /// It waits for the actor's turn like any caller and reads between
    /// turns — through the actor's own connection when it is live, else by
    /// opening its database — so it sees exactly what is committed.
    pub async fn inspect(
        &self,
        class: &str,
        name: &str,
        keys: bool,
        start: Option<String>,
    ) -> Result<ActorDetail, AdminError> {
        let class = self.class(class)?.clone();
        let actor = ActorAddress::new(&class.name, name)?;
        if !self.directory.exists(&actor) {
            return Err(AdminError::NotFound(actor));
        }
        let claim = self
            .claim(&actor, &class, None)
            .expect("unlimited claims are never refused");
        let live = claim.cell.live.lock().await;
        let is_live = live.generation.is_some();
        let detail = match &live.gate {
            Some(gate) => gate.with_db(|db| self.read_detail(&actor, db, keys, start)),
            None => {
                let db = self
                    .directory
                    .open(&actor)
                    .map_err(|e| AdminError::Storage(e.to_string()))?;
                self.read_detail(&actor, &db, keys, start)
            }
        };
        drop(live);
        drop(claim);
        let mut detail = detail?;
        detail.summary.live = is_live;
        Ok(detail)
    }

    fn read_detail(
        &self,
        actor: &ActorAddress,
        db: &ActorDb,
        keys: bool,
        start: Option<String>,
    ) -> Result<ActorDetail, AdminError> {
        let storage = |e: weir_store::actor::ActorStoreError| AdminError::Storage(e.to_string());
        let timers = db
            .timers()
            .map_err(storage)?
            .into_iter()
            .map(|t| TimerView {
                reason: t.reason,
                at_ms: t.at_ms,
                attempt: t.attempt,
            })
            .collect();
        let keys = if keys {
            let entries = db
                .list(&weir_store::actor::ListOptions {
                    start,
                    limit: Some(MAX_INSPECT_ENTRIES),
                    ..Default::default()
                })
                .map_err(storage)?;
            Some(
                entries
                    .into_iter()
                    .map(|(key, value)| {
                        let bytes = value.len();
                        match String::from_utf8(value) {
                            Ok(text) => EntryView {
                                key,
                                text: Some(text),
                                hex: None,
                                bytes,
                            },
                            Err(e) => EntryView {
                                key,
                                text: None,
                                hex: Some(hex(e.as_bytes())),
                                bytes,
                            },
                        }
                    })
                    .collect(),
            )
        } else {
            None
        };
        Ok(ActorDetail {
            incarnation: db.incarnation().map_err(storage)?,
            entries: db.entry_count().map_err(storage)?,
            timers,
            keys,
            summary: self.summary(actor),
        })
    }

    /// Deletes an actor: waits for its turn, drops it from memory, removes
    /// its database and its timers. True if it existed.
    pub async fn delete(&self, class: &str, name: &str) -> Result<bool, AdminError> {
        let class = self.class(class)?.clone();
        let actor = ActorAddress::new(&class.name, name)?;
        let claim = self
            .claim(&actor, &class, None)
            .expect("unlimited claims are never refused");
        let mut live = claim.cell.live.lock().await;
        live.reset();
        self.timers.set(&actor, None);
        let existed = self
            .directory
            .delete(&actor)
            .map_err(|e| AdminError::Storage(e.to_string()))?;
        drop(live);
        drop(claim);
        Ok(existed)
    }
}

#[derive(Default)]
struct ReceiptExtra<'a> {
    outcome: Option<&'static str>,
    status: Option<u16>,
    reason: Option<&'a str>,
    attempt: Option<u32>,
    dispatch: Option<u64>,
    queued: Option<Duration>,
}

impl weir_runtime::memory_budget::Reclaim for ActorHost {
    /// Hibernates idle actors, least recently used first, until their
    /// instances hold at least `bytes`; their memory comes back to the
    /// budget when the closer drops them.
    fn reclaim(&self, bytes: u64) -> u64 {
        let mut cells = self.lock_cells();
        let mut idle: Vec<(u64, ActorAddress, Arc<Cell>)> = cells
            .iter()
            .filter(|(_, c)| c.pending.load(Ordering::Acquire) == 0)
            .map(|(a, c)| (c.last_turn.load(Ordering::Relaxed), a.clone(), c.clone()))
            .collect();
        idle.sort_unstable_by_key(|(order, _, _)| *order);
        let mut freed = 0u64;
        let mut evicted = Vec::new();
        for (_, address, cell) in idle {
            if freed >= bytes {
                break;
            }
            // A cell nobody claims has a free lock; one taken meanwhile is
            // skipped.
            let held = match cell.live.try_lock() {
                Ok(live) => live.generation.as_ref().map_or(0, |g| g.memory_bytes()),
                Err(_) => continue,
            };
            if held == 0 {
                continue;
            }
            freed += held as u64;
            if let Some(cell) = cells.remove(&address) {
                cell.class.actor_metrics.hibernated();
                evicted.push(cell);
            }
        }
        self.counters
            .hibernations
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        drop(cells);
        if !evicted.is_empty() {
            tracing::info!(
                actors = evicted.len(),
                bytes = freed,
                "hibernating idle actors to make room in the guest memory budget"
            );
        }
        self.close_evicted(evicted);
        freed
    }
}

impl ActorCalls for ActorHost {
    fn handles(&self, host: &str) -> bool {
        ActorAddress::is_actor_host(host)
    }

    fn call(
        self: Arc<Self>,
        request: http::Request<Bytes>,
    ) -> std::pin::Pin<Box<dyn Future<Output = http::Response<Bytes>> + Send>> {
        Box::pin(async move { self.call_actor(request).await })
    }
}

/// Closes hibernated actors on one thread of its own: their instances and
/// databases are dropped outside the map lock and off the async workers
/// (thousands of stores take a while to free), an actor with a long WAL is
/// checkpointed first so its next wake does not replay it, and the heap is
/// trimmed whenever the queue runs dry. One thread, whatever the rate of
/// evictions: a thread per batch would itself hold memory.
fn start_closer(closing: Arc<AtomicUsize>) -> std::sync::mpsc::Sender<Vec<Arc<Cell>>> {
    let (tx, rx) = std::sync::mpsc::channel::<Vec<Arc<Cell>>>();
    let spawned = std::thread::Builder::new()
        .name("weir-actor-closer".into())
        .spawn(move || {
            while let Ok(batch) = rx.recv() {
                let mut closed = batch.len();
                close(batch);
                while let Ok(batch) = rx.try_recv() {
                    closed += batch.len();
                    close(batch);
                }
                release_freed_memory();
                // Counted down only once their memory is back.
                closing.fetch_sub(closed, Ordering::AcqRel);
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the actor closer thread; evicted actors close where they are dropped");
    }
    tx
}

fn close(evicted: Vec<Arc<Cell>>) {
    for cell in evicted {
        // Nobody holds an evicted cell: the lock is free.
        if let Ok(live) = cell.live.try_lock()
            && let Some(gate) = &live.gate
        {
            gate.with_db(|db| {
                if db.commits_since_checkpoint() >= CHECKPOINT_ON_CLOSE_COMMITS {
                    let _ = db.checkpoint();
                }
            });
        }
    }
}

/// Hands memory freed by hibernated actors back to the kernel. glibc keeps
/// freed heap pages in its arenas; thousands of evicted stores leave them
/// fragmented, so without a trim the server's RSS would stay at its peak.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas; it takes no
    // pointers from us and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The timer dispatcher: sleeps until the earliest deadline, then hands
/// each due actor to a delivery task of its own.
async fn dispatch(host: std::sync::Weak<ActorHost>) {
    loop {
        let Some(h) = host.upgrade() else { return };
        let now = now_ms();
        for actor in h.timers.take_due(now) {
            tokio::spawn(h.clone().deliver(actor));
        }
        let sleep_ms = h.timers.earliest().map_or(MAX_DISPATCH_SLEEP_MS, |at| {
            (at - now_ms()).clamp(0, MAX_DISPATCH_SLEEP_MS)
        });
        let changed = async {
            h.timers.changed().await;
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(sleep_ms as u64)) => {}
            _ = changed => {}
        }
    }
}

/// The hibernation sweeper.
async fn sweep(host: std::sync::Weak<ActorHost>) {
    loop {
        let interval = {
            let Some(h) = host.upgrade() else { return };
            let idle = h
                .classes
                .values()
                .map(|c| c.code.limits.actor_idle)
                .min()
                .unwrap_or(MAX_SWEEP_INTERVAL);
            h.hibernate_idle();
            (idle / 4).clamp(MIN_SWEEP_INTERVAL, MAX_SWEEP_INTERVAL)
        };
        tokio::time::sleep(interval).await;
    }
}
