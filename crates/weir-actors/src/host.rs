//! The actor host: every declared class and the one map of actors in
//! memory, which the other modules of this crate work on — [`crate::mailbox`]
//! (calls and their turns), [`crate::dispatcher`] (timers),
//! [`crate::residency`] (who stays in memory), [`crate::operators`] (what
//! operators see and do), [`crate::exclusive`] (holds outside turns) and
//! [`crate::receipts`].
//!
//! Invariants owned here: at most one live instance of an actor exists. An
//! actor is reached only through its one cell in the host's map, found
//! under the map's lock; every turn, delivery and operator request first
//! claims the cell (`ActorHost::claim`), and a cell leaves the map only
//! while nobody holds or waits for it (checked under the same lock). A
//! class's code is replaced whole ([`ActorHost::install_class`]): a turn
//! runs on the code it started with, and an actor's next turn after the
//! install runs a fresh incarnation of the new code on the same storage.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;
use wasmtime::component::ComponentExportIndex;
use weir_runtime::metrics::AppMetrics;
use weir_runtime::receipt::ReceiptSink;
use weir_runtime::{AppCode, ErrorCode};

use crate::address::ActorAddress;
use crate::bindings::ALARM_INTERFACE;
use crate::directory::{ActorDirectory, Unreadable};
use crate::error_code::{ActorErrorCode, TurnError};
use crate::limits::ActorLimits;
use crate::mailbox::Inbox;
use crate::metrics::ActorClassMetrics;
use crate::operators::AdminError;
use crate::placement::Placement;
use crate::receipts::Counters;
use crate::timers::TimerIndex;
use crate::turn::{Live, TurnContext};

/// One declared actor class.
pub struct ActorClass {
    pub name: String,
    /// The app that declares it and the version of its code, as receipts
    /// name them.
    pub app: Arc<str>,
    pub version: Arc<str>,
    pub code: AppCode,
    pub limits: ActorLimits,
    /// Generation counts (as an app `actor:<class>`).
    pub metrics: AppMetrics,
    pub actor_metrics: ActorClassMetrics,
    /// The component's `weir:actor/alarm#alarm` export, if any.
    alarm: Option<ComponentExportIndex>,
    next_generation: AtomicU64,
    /// Which install of the class this is (1 for the code it started
    /// with): a live instance of an older install is replaced before its
    /// actor's next turn.
    pub(crate) install: AtomicU64,
}

impl ActorClass {
    pub fn new(
        name: String,
        code: AppCode,
        limits: ActorLimits,
        metrics: AppMetrics,
        actor_metrics: ActorClassMetrics,
    ) -> ActorClass {
        let alarm = code
            .component
            .get_export_index(None, ALARM_INTERFACE)
            .and_then(|interface| code.component.get_export_index(Some(&interface), "alarm"));
        ActorClass {
            app: Arc::from(""),
            version: Arc::from(""),
            name,
            code,
            limits,
            metrics,
            actor_metrics,
            alarm,
            next_generation: AtomicU64::new(1),
            install: AtomicU64::new(1),
        }
    }

    /// The class as part of `app`, at `version`.
    pub fn versioned(mut self, app: &str, version: &str) -> ActorClass {
        self.app = Arc::from(app);
        self.version = Arc::from(version);
        self
    }
}

/// One actor in memory: its turn lock and what it holds between turns.
pub(crate) struct Cell {
    pub(crate) address: ActorAddress,
    /// The class's code now: replaced by [`ActorHost::install_class`].
    pub(crate) class: ArcSwap<ActorClass>,
    /// Callers holding or waiting for the turn. Raised only under the
    /// host's map lock, so the sweeper sees every caller.
    pub(crate) pending: AtomicUsize,
    /// Calls waiting for their turn, in arrival order.
    pub(crate) inbox: Mutex<Inbox>,
    pub(crate) live: Arc<tokio::sync::Mutex<Live>>,
    /// When the last turn ended, in ms since the host started.
    pub(crate) last_active_ms: AtomicU64,
    /// The host-wide order of its last turn's end: exact where
    /// milliseconds tie, so eviction takes the least recently used.
    pub(crate) last_turn: AtomicU64,
    /// Alarm dispatches in a row whose turn failed to commit: how long the
    /// next one waits ([`crate::timers::commit_retry_at`]).
    pub(crate) alarm_commit_failures: std::sync::atomic::AtomicU32,
}

/// A caller's claim on a cell; dropping it ends the claim.
pub(crate) struct Claim {
    pub(crate) cell: Arc<Cell>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.cell.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Every actor class and every actor in memory.
pub struct ActorHost {
    /// The declared classes; the set is fixed, each one's code can be
    /// replaced.
    pub(crate) classes: HashMap<String, ArcSwap<ActorClass>>,
    pub(crate) directory: ActorDirectory,
    pub(crate) cells: Mutex<HashMap<ActorAddress, Arc<Cell>>>,
    pub(crate) timers: TimerIndex,
    /// Every actor's next deadline on disk, on one machine
    /// ([`crate::timer_ledger`]).
    pub(crate) ledger: Option<Arc<weir_store::timer_ledger::TimerLedger>>,
    /// Alarm deliveries running, bounded by `max_concurrent_alarms`.
    pub(crate) deliveries: crate::dispatcher::Deliveries,
    pub(crate) sink: Option<Arc<dyn ReceiptSink>>,
    started: Instant,
    pub(crate) counters: Counters,
    /// Actors in memory at most: each holds open files, and the process
    /// has a limit on those. A new actor beyond it hibernates the least
    /// recently used idle ones first.
    pub(crate) max_live: usize,
    /// Where evicted actors go to be closed.
    pub(crate) closer: std::sync::mpsc::Sender<Vec<Arc<Cell>>>,
    /// Evicted actors not yet closed (their memory not yet returned).
    pub(crate) closing: Arc<AtomicUsize>,
    /// Hands out [`Cell::last_turn`].
    turn_order: AtomicU64,
    /// Database files that could not be used, found at start or by the
    /// timer pass: skipped.
    pub(crate) unreadable: std::sync::Mutex<Vec<Unreadable>>,
    /// The timer pass's progress ([`crate::timer_pass`]).
    pub(crate) pass: crate::timer_pass::TimerPass,
    /// Actors with a launch mark at start: owners whose launch journal may
    /// have rows, of resident processes the last run did not see end.
    journaled: Vec<ActorAddress>,
    /// Where actors run and their commits become durable, when that is
    /// decided beyond this process (cluster mode).
    pub(crate) placement: Option<Arc<dyn Placement>>,
    /// What the layers above keep in actors' names, let go of when an
    /// actor is deleted ([`ActorHost::keep_holdings`]).
    pub(crate) holdings: std::sync::Mutex<Vec<Arc<dyn crate::holdings::Holdings>>>,
    /// What takes over an actor's running work where its storage opens
    /// (cluster mode; [`ActorHost::bind_handover`]).
    pub(crate) handover: std::sync::OnceLock<Arc<dyn crate::handover::Handover>>,
}

impl ActorHost {
    /// A host for `classes`, with actors' databases under `directory`:
    /// the actors on disk counted (census and storage room) and the owners
    /// with launch journal rows found from one listing per class, without
    /// opening their databases. Their timers are indexed by the timer pass
    /// [`ActorHost::start`] begins.
    pub fn new(
        classes: Vec<ActorClass>,
        directory: ActorDirectory,
        sink: Option<Arc<dyn ReceiptSink>>,
        placement: Option<Arc<dyn Placement>>,
    ) -> Result<Arc<ActorHost>, AdminError> {
        let configured = classes.iter().map(|c| c.limits.max_live_actors).min();
        let closing = Arc::new(AtomicUsize::new(0));
        let mut host = ActorHost {
            classes: classes
                .into_iter()
                .map(|c| (c.name.clone(), ArcSwap::from_pointee(c)))
                .collect(),
            directory,
            cells: Mutex::new(HashMap::new()),
            timers: TimerIndex::default(),
            ledger: None,
            deliveries: Default::default(),
            sink,
            started: Instant::now(),
            counters: Counters::default(),
            max_live: crate::os_limits::live_actor_cap(configured),
            closer: crate::residency::start_closer(closing.clone()),
            closing,
            turn_order: AtomicU64::new(1),
            unreadable: Default::default(),
            pass: Default::default(),
            journaled: Vec::new(),
            placement,
            holdings: std::sync::Mutex::new(Vec::new()),
            handover: std::sync::OnceLock::new(),
        };
        if host.placement.is_none() {
            host.ledger = crate::timer_ledger::open(host.directory.root());
        }
        let mut journaled = Vec::new();
        let mut unreadable = Vec::new();
        let mut census = 0;
        // A data dir last served by a build before launch marks: its
        // journals are found by opening each database once, and marked.
        let unmarked = !host.directory.marks_kept();
        let mut searched_all = true;
        for class in host.classes.keys() {
            let found = host
                .directory
                .scan(class)
                .map_err(|e| AdminError::Storage(e.to_string()))?;
            unreadable.extend(found.strangers);
            census += found.actors.len();
            if unmarked {
                for actor in &found.actors {
                    match host.mark_if_journaled(actor) {
                        Some(true) => journaled.push(actor.clone()),
                        Some(false) => {}
                        None => searched_all = false,
                    }
                }
            } else {
                journaled.extend(found.marked);
            }
            for actor in &found.actors {
                host.directory
                    .room()
                    .moved(0, host.directory.files_bytes(actor));
            }
        }
        // Recorded only once every database was searched: one that could
        // not be opened (reported by the timer pass) may hold rows, and is
        // searched again at the next start.
        if unmarked && searched_all {
            host.directory.keep_marks().map_err(|e| {
                AdminError::Storage(format!("cannot record the launch marks as kept: {e}"))
            })?;
        }
        for u in &unreadable {
            tracing::warn!(path = %u.path.display(), error = %u.error, "skipping an actor database that cannot be used");
        }
        host.unreadable = std::sync::Mutex::new(unreadable);
        host.journaled = journaled;
        host.directory.recount(census);
        host.apply_app_limits();
        Ok(Arc::new(host))
    }

    /// For a data dir without launch marks: opens `actor`'s database to
    /// see whether its launch journal has rows, and marks it if so. `None`
    /// when it cannot be opened (the timer pass reports it).
    fn mark_if_journaled(&self, actor: &ActorAddress) -> Option<bool> {
        let journaled = self
            .directory
            .open(actor)
            .and_then(|db| Ok(!db.journal()?.is_empty()))
            .ok()?;
        if journaled
            && let Err(e) = weir_store::journal::make_launch_mark(&self.directory.path(actor))
        {
            tracing::warn!(%actor, error = %e, "cannot mark an owner of resident processes");
            return None;
        }
        Some(journaled)
    }

    /// Binds a layer that keeps something in actors' names (processes and
    /// slots, sockets): an actor's deletion has each let go of what it
    /// keeps first, in the order they were bound.
    pub fn keep_holdings(&self, holdings: Arc<dyn crate::holdings::Holdings>) {
        self.holdings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(holdings);
    }

    /// The layers bound with [`ActorHost::keep_holdings`].
    pub(crate) fn holdings(&self) -> Vec<Arc<dyn crate::holdings::Holdings>> {
        self.holdings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether an actor that is not open has storage to open: its database
    /// here, or, in cluster mode, committed history where its placement
    /// keeps it (a call's claim alone makes none). What an alarm's
    /// delivery and an inspection check before they open an actor, so
    /// neither makes one.
    pub(crate) fn has_storage(&self, actor: &ActorAddress) -> bool {
        match &self.placement {
            None => self.directory.exists(actor),
            Some(placement) => placement.has_history(actor),
        }
    }

    /// Actors whose launch journal may have had rows when this host
    /// started (those with a launch mark): each is recovered, or found to
    /// have none and unmarked, under its hold.
    pub fn journaled(&self) -> &[ActorAddress] {
        &self.journaled
    }

    /// True when `class` is declared and exports `function` of `interface`.
    pub fn exports(&self, class: &str, (interface, function): (&str, &str)) -> bool {
        self.class(class).is_ok_and(|class| {
            let component = &class.code.component;
            component
                .get_export_index(None, interface)
                .and_then(|i| component.get_export_index(Some(&i), function))
                .is_some()
        })
    }

    /// Starts the timer dispatcher and the hibernation sweeper; they stop
    /// when the host is dropped.
    pub fn start(self: &Arc<Self>) {
        let host = self.clone();
        tokio::task::spawn_blocking(move || host.timer_pass());
        tokio::spawn(crate::dispatcher::dispatch(Arc::downgrade(self)));
        tokio::spawn(crate::residency::sweep(Arc::downgrade(self)));
    }

    pub(crate) fn lock_cells(&self) -> std::sync::MutexGuard<'_, HashMap<ActorAddress, Arc<Cell>>> {
        self.cells.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn class(&self, name: &str) -> Result<Arc<ActorClass>, AdminError> {
        self.classes
            .get(name)
            .map(ArcSwap::load_full)
            .ok_or_else(|| AdminError::UnknownClass(name.to_string()))
    }

    /// Replaces a declared class's code. Turns running now finish on the
    /// code they started with; each actor of the class in memory runs its
    /// next turn on a fresh instance of `class` (a new incarnation), with
    /// its storage as it was; hibernated actors wake on `class`.
    pub fn install_class(&self, class: ActorClass) -> Result<(), AdminError> {
        let Some(slot) = self.classes.get(&class.name) else {
            return Err(AdminError::UnknownClass(class.name));
        };
        // Under the map lock, so that no cell is made from the old code
        // after the cells below are moved to the new one.
        let cells = self.lock_cells();
        let old = slot.load();
        class.next_generation.store(
            old.next_generation.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        class
            .install
            .store(old.install.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let class = Arc::new(class);
        slot.store(class.clone());
        for cell in cells.values() {
            if cell.address.class == class.name {
                cell.class.store(class.clone());
            }
        }
        drop(cells);
        self.apply_app_limits();
        Ok(())
    }

    /// Applies the limits that bound the app's actors together (actors on
    /// disk, the disk they take, alarm deliveries at once) as the classes'
    /// code now sets them: one app's limits, so the same for every class;
    /// the smallest if not.
    fn apply_app_limits(&self) {
        fn least<T: Ord>(host: &ActorHost, limit: impl Fn(&ActorLimits) -> T) -> Option<T> {
            host.classes.values().map(|c| limit(&c.load().limits)).min()
        }
        self.directory
            .set_max_actors(least(self, |l| l.max_actors).unwrap_or(usize::MAX));
        self.directory.room().set_max(
            least(self, |l| l.max_actor_storage_bytes)
                .unwrap_or(crate::limits::DEFAULT_MAX_ACTOR_STORAGE_BYTES),
        );
        self.deliveries.set_max(
            least(self, |l| l.max_concurrent_alarms)
                .unwrap_or(crate::limits::DEFAULT_MAX_CONCURRENT_ALARMS as usize),
        );
    }

    /// The version of each class's code now.
    pub fn class_versions(&self) -> Vec<(String, Arc<str>)> {
        let mut versions: Vec<_> = self
            .classes
            .iter()
            .map(|(name, class)| (name.clone(), class.load().version.clone()))
            .collect();
        versions.sort();
        versions
    }

    pub(crate) fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Claims an actor's cell, creating it if the actor is not in memory.
    /// `limit` bounds the callers already waiting; `None` always admits
    /// (timers and operators), even past the live-actor cap.
    pub(crate) fn claim(
        &self,
        address: &ActorAddress,
        class: &ActorClass,
        limit: Option<usize>,
    ) -> Result<Claim, TurnError> {
        let mut cells = self.lock_cells();
        if cells.len() >= self.max_live && !cells.contains_key(address) {
            self.evict_least_recent(&mut cells);
            if cells.len() >= self.max_live && limit.is_some() {
                tracing::warn!(
                    live = cells.len(),
                    max = self.max_live,
                    "no idle actor to hibernate for a new one"
                );
                return Err(ErrorCode::HostUnavailable.into());
            }
        }
        self.claim_cell(&mut cells, address, class, limit)
    }

    /// Claims a cell for the timer pass ([`crate::timer_pass`]): never
    /// refused, and never hibernates an actor to make room for it (the
    /// pass holds one cell at a time, let go of at once).
    pub(crate) fn claim_passing(&self, address: &ActorAddress, class: &ActorClass) -> Claim {
        let mut cells = self.lock_cells();
        match self.claim_cell(&mut cells, address, class, None) {
            Ok(claim) => claim,
            Err(_) => unreachable!("unlimited claims are never refused"),
        }
    }

    /// Takes a place among the cell's callers, making the cell if the
    /// actor has none.
    fn claim_cell(
        &self,
        cells: &mut HashMap<ActorAddress, Arc<Cell>>,
        address: &ActorAddress,
        class: &ActorClass,
        limit: Option<usize>,
    ) -> Result<Claim, TurnError> {
        let cell = cells
            .entry(address.clone())
            .or_insert_with(|| {
                // The class now, read under the map lock: a class
                // installed since the caller looked is the one used.
                let class = self.classes.get(&class.name).map(ArcSwap::load_full);
                Arc::new(Cell {
                    address: address.clone(),
                    class: ArcSwap::new(class.expect("claims are for declared classes")),
                    pending: AtomicUsize::new(0),
                    inbox: Mutex::new(Inbox::default()),
                    live: Arc::new(tokio::sync::Mutex::new(Live::default())),
                    last_active_ms: AtomicU64::new(0),
                    last_turn: AtomicU64::new(0),
                    alarm_commit_failures: Default::default(),
                })
            })
            .clone();
        // One caller runs while up to `limit` wait.
        let before = cell.pending.fetch_add(1, Ordering::AcqRel);
        let claim = Claim { cell };
        if limit.is_some_and(|limit| before > limit) {
            return Err(ActorErrorCode::Overloaded.into());
        }
        Ok(claim)
    }

    /// Claims a cell for a timer delivery or an operator: never refused.
    pub(crate) fn claim_always(&self, address: &ActorAddress, class: &ActorClass) -> Claim {
        match self.claim(address, class, None) {
            Ok(claim) => claim,
            Err(_) => unreachable!("unlimited claims are never refused"),
        }
    }

    /// What a turn of `cell` runs with: `class` is the cell's class as the
    /// turn found it ([`Cell::class`]), held for the whole turn.
    pub(crate) fn context<'a>(&'a self, cell: &'a Cell, class: &'a ActorClass) -> TurnContext<'a> {
        TurnContext {
            address: &cell.address,
            code: &class.code,
            alarm: class.alarm.as_ref(),
            directory: &self.directory,
            ledger: self.ledger.as_ref(),
            placement: self.placement.as_ref(),
            handover: self.handover.get(),
            holdings: &self.holdings,
            metrics: &class.metrics,
            next_generation: &class.next_generation,
            install: class.install.load(Ordering::Relaxed),
        }
    }

    /// Ends a turn's bookkeeping: the actor's next deadline goes back into
    /// the index (when its timers may have changed, or always after alarm
    /// turns), and its idle clock restarts.
    pub(crate) fn after_turn(&self, cell: &Cell, live: &Live, alarms_ran: bool) {
        if let Some(gate) = &live.gate
            && (gate.take_timers_changed() || alarms_ran)
        {
            match gate.with_db(|db| db.next_deadline()) {
                Ok(next) => {
                    self.timers.set(&cell.address, next);
                    self.ledger_exact(&cell.address, next);
                }
                Err(e) => {
                    tracing::warn!(actor = %cell.address, error = %e, "cannot read the actor's next timer");
                    self.timers.set(&cell.address, None);
                }
            }
        }
        cell.last_active_ms
            .store(self.elapsed_ms(), Ordering::Relaxed);
        cell.last_turn.store(
            self.turn_order.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }

    /// Delivers the actor's due timers at `at_ms` (ms since the Unix
    /// epoch): how a layer above wakes an actor whose timer it found due
    /// (cluster mode's alarms of actors whose owner died).
    pub fn wake_at(&self, class: &str, name: &str, at_ms: i64) -> Result<(), AdminError> {
        let class = self.class(class)?;
        let actor = ActorAddress::new(&class.name, name)?;
        self.timers.set(&actor, Some(at_ms));
        Ok(())
    }

    /// Where this host's actors are placed, in cluster mode.
    pub fn placement(&self) -> Option<&Arc<dyn Placement>> {
        self.placement.as_ref()
    }

    /// Actors in memory now.
    pub fn live_count(&self) -> usize {
        self.lock_cells().len()
    }
}
