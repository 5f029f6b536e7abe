//! The server's sockets as a whole: how many may be open, the signal that
//! closes them all at shutdown, their receipts and their metrics.
//!
//! Invariants owned here:
//! - at most `max_sockets` sockets are open at once, and each app of a
//!   server of several holds at most its share of them (`max_sockets`
//!   divided by the apps served), so one app's clients cannot take every
//!   place: a permit is taken before the upgrade is offered to the guest
//!   and held until the socket's connection is gone, so one more upgrade
//!   is answered 503 `socket_capacity_exceeded` and the guest never sees
//!   it;
//! - every socket ends with exactly one receipt line, saying who closed it,
//!   with which code and why.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use weir_runtime::metrics::Metrics;
use weir_runtime::receipt::{ReceiptSink, Terminal, write_receipt};

use super::close::Close;
use super::error_code::SocketErrorCode;
use super::limits::SocketLimits;

/// The log target of socket receipts.
pub const SOCKET_TARGET: &str = "weir::socket";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AppLabels {
    app: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    app: String,
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CloseLabels {
    app: String,
    code: u16,
    by: &'static str,
}

#[derive(Clone, Default)]
struct SocketMetrics {
    open: Family<AppLabels, Gauge>,
    relayed: Family<AppLabels, Gauge>,
    messages: Family<DirectionLabels, Counter>,
    closes: Family<CloseLabels, Counter>,
}

/// One socket's series, looked up once when it opens: counting a message
/// costs an increment, not a lookup.
pub(crate) struct SocketCounters {
    open: Gauge,
    pub incoming: Counter,
    pub outgoing: Counter,
    pub auto: Counter,
}

/// Who ended a socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClosedBy {
    /// The client sent a close frame.
    Client,
    /// The guest closed it, or its handler ended.
    Guest,
    /// Weir did: a limit, a protocol error, a dead peer, a shutdown.
    Weir,
    /// The connection was lost without a close frame.
    Connection,
}

impl ClosedBy {
    fn as_str(self) -> &'static str {
        match self {
            ClosedBy::Client => "client",
            ClosedBy::Guest => "guest",
            ClosedBy::Weir => "weir",
            ClosedBy::Connection => "connection",
        }
    }
}

/// Sockets open per app, and how many apps share `max_sockets`.
#[derive(Default)]
struct Shares {
    open: std::sync::Mutex<std::collections::HashMap<Arc<str>, usize>>,
    apps: std::sync::atomic::AtomicUsize,
}

impl Shares {
    fn open(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Arc<str>, usize>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The server's sockets.
pub struct SocketHub {
    pub limits: SocketLimits,
    capacity: Arc<Semaphore>,
    shares: Arc<Shares>,
    shutdown: watch::Sender<bool>,
    /// Versions replaced by a deploy, `(app, version)`, newest last: their
    /// sockets close with 1012.
    replaced: std::sync::Mutex<std::collections::VecDeque<(Arc<str>, Arc<str>)>>,
    /// Marks of the nodes that relayed sockets here and said they are
    /// leaving, newest last: their sockets close with 1001.
    relayers_gone: std::sync::Mutex<std::collections::VecDeque<Arc<str>>>,
    /// Bumped at each replacement and each relayer gone, so that every
    /// socket looks.
    updates: watch::Sender<u64>,
    sink: Option<Arc<dyn ReceiptSink>>,
    metrics: SocketMetrics,
    next_id: AtomicU64,
}

/// Replaced versions remembered. A socket is only accepted by a replaced
/// version in the moment after its deploy (a request routed just before
/// it), so only the last few deploys matter; the bound keeps a server that
/// is deployed all day from growing the list.
pub const MAX_REPLACED_VERSIONS: usize = 1024;

/// Leaving relayers remembered. A relayer says it is leaving once, as it
/// stops, and its sockets look at once; a socket it relayed a moment
/// before finds its mark here as it opens. Only the last few matter, and
/// the bound keeps a long-lived owner from growing the list.
pub const MAX_RELAYERS_GONE: usize = 1024;

/// A place among the `max_sockets`, and in its app's share, held by one
/// socket.
pub struct SocketPermit {
    _permit: OwnedSemaphorePermit,
    app: Arc<str>,
    shares: Arc<Shares>,
}

impl Drop for SocketPermit {
    fn drop(&mut self) {
        let mut open = self.shares.open();
        if let Some(n) = open.get_mut(&self.app) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.app);
            }
        }
    }
}

impl SocketHub {
    pub fn new(
        limits: SocketLimits,
        sink: Option<Arc<dyn ReceiptSink>>,
        metrics: &Metrics,
    ) -> Arc<Self> {
        let m = SocketMetrics::default();
        metrics.register("sockets_open", "WebSockets open now", m.open.clone());
        metrics.register(
            "sockets_relayed_open",
            "Actors' WebSockets this node relays to the actor's owner, open now (cluster mode)",
            m.relayed.clone(),
        );
        metrics.register(
            "socket_messages",
            "WebSocket messages, by direction (in: from clients, out: to them)",
            m.messages.clone(),
        );
        metrics.register(
            "socket_closes",
            "WebSockets ended, by close code and by who ended them",
            m.closes.clone(),
        );
        Arc::new(SocketHub {
            capacity: Arc::new(Semaphore::new(limits.max_sockets)),
            shares: Arc::new(Shares {
                apps: std::sync::atomic::AtomicUsize::new(1),
                ..Default::default()
            }),
            limits,
            shutdown: watch::Sender::new(false),
            replaced: Default::default(),
            relayers_gone: Default::default(),
            updates: watch::Sender::new(0),
            sink,
            metrics: m,
            next_id: AtomicU64::new(1),
        })
    }

    /// How many apps this server serves: each holds at most its share of
    /// `max_sockets`.
    pub fn set_apps(&self, apps: usize) {
        self.shares.apps.store(apps.max(1), Ordering::Relaxed);
    }

    /// What one app may hold of `max_sockets`.
    pub fn share(&self) -> usize {
        (self.limits.max_sockets / self.shares.apps.load(Ordering::Relaxed).max(1)).max(1)
    }

    /// A place for one more socket of `app`, or `socket_capacity_exceeded`
    /// when the server's places or the app's share are all held.
    pub fn admit(&self, app: &Arc<str>) -> Result<SocketPermit, SocketErrorCode> {
        let share = self.share();
        let mut open = self.shares.open();
        let held = open.get(app).copied().unwrap_or(0);
        if held >= share {
            return Err(SocketErrorCode::CapacityExceeded);
        }
        let permit = self
            .capacity
            .clone()
            .try_acquire_owned()
            .map_err(|_| SocketErrorCode::CapacityExceeded)?;
        open.insert(app.clone(), held + 1);
        Ok(SocketPermit {
            _permit: permit,
            app: app.clone(),
            shares: self.shares.clone(),
        })
    }

    /// Sockets open now.
    pub fn open(&self) -> usize {
        self.limits.max_sockets - self.capacity.available_permits()
    }

    /// Closes every socket with 1001, now and for any opened later.
    pub fn shut_down(&self) {
        self.shutdown.send_replace(true);
    }

    /// Resolves once the server shuts down.
    pub(crate) async fn shutting_down(&self) {
        let mut shutdown = self.shutdown.subscribe();
        let _ = shutdown.wait_for(|down| *down).await;
    }

    /// Returns once every socket has ended (each gives its place back when
    /// its close handshake is done or given up on).
    pub async fn all_closed(&self) {
        let all = u32::try_from(self.limits.max_sockets).unwrap_or(u32::MAX);
        let _ = self.capacity.acquire_many(all).await;
    }

    /// Version `old` of `app` (a worker's app, or `actor:CLASS`) was
    /// replaced by `new`: the open sockets of `old`, and any it accepts
    /// from now on, close with 1012. A version is named by its label or
    /// digest, so `new` may be one replaced before (a rollback): it serves
    /// again. When the two are the same (only settings changed) the
    /// sockets cannot be told apart and stay open.
    pub fn code_replaced(&self, app: &str, old: &str, new: &str) {
        if old == new {
            return;
        }
        {
            let mut replaced = self.replaced.lock().unwrap_or_else(|p| p.into_inner());
            replaced.retain(|(a, v)| !(&**a == app && &**v == new));
            replaced.push_back((app.into(), old.into()));
            while replaced.len() > MAX_REPLACED_VERSIONS {
                replaced.pop_front();
            }
        }
        self.updates.send_modify(|n| *n += 1);
    }

    /// The node that relayed sockets here under `relayer` is leaving:
    /// they close with 1001, and so does any it relayed that opens later.
    pub fn relayer_leaving(&self, relayer: &str) {
        {
            let mut gone = self.relayers_gone.lock().unwrap_or_else(|p| p.into_inner());
            if gone.iter().any(|r| &**r == relayer) {
                return;
            }
            gone.push_back(relayer.into());
            while gone.len() > MAX_RELAYERS_GONE {
                gone.pop_front();
            }
        }
        self.updates.send_modify(|n| *n += 1);
    }

    fn is_relayer_gone(&self, relayer: &str) -> bool {
        self.relayers_gone
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|r| &**r == relayer)
    }

    pub(crate) fn is_replaced(&self, app: &str, version: &str) -> bool {
        self.replaced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|(a, v)| &**a == app && &**v == version)
    }

    /// Resolves with the close Weir starts on a socket that `version` of
    /// `app` accepted: 1001 once the server shuts down, 1012 once a deploy
    /// has replaced that version (at once if it already had), 1001 once
    /// the node that relayed it (`relayer`, cluster mode) leaves. A socket
    /// holds one of these for its whole life, so it joins the server-wide
    /// signals' waiter lists once, not on every message it moves: those
    /// lists are shared by every socket of the server, and joining and
    /// leaving them per message locked them from every core.
    pub(crate) async fn weir_close(
        &self,
        app: Arc<str>,
        version: Arc<str>,
        relayer: Option<Arc<str>>,
    ) -> Close {
        let mut shutdown = self.shutdown.subscribe();
        let mut updates = self.updates.subscribe();
        let going_away = || {
            Close::new(
                super::close::CLOSE_GOING_AWAY,
                "the server is shutting down",
            )
        };
        let told = || {
            if self.is_replaced(&app, &version) {
                Some(Close::new(
                    super::close::CLOSE_SERVICE_RESTART,
                    "the code was updated",
                ))
            } else if relayer.as_deref().is_some_and(|r| self.is_relayer_gone(r)) {
                // The server the client reached is the one shutting down.
                Some(going_away())
            } else {
                None
            }
        };
        // Subscribed first: a replacement after this look bumps `updates`.
        if let Some(close) = told() {
            return close;
        }
        let down = async {
            // A sender gone is a server gone: closed as at shutdown.
            let _ = shutdown.wait_for(|down| *down).await;
        };
        let changed = async {
            loop {
                if updates.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
                if let Some(close) = told() {
                    return close;
                }
            }
        };
        tokio::select! {
            biased;
            () = down => going_away(),
            close = changed => close,
        }
    }

    /// A new socket of `app`: its id and its series.
    pub(crate) fn opened(&self, app: &str) -> (u64, SocketCounters) {
        let open = self
            .metrics
            .open
            .get_or_create(&AppLabels { app: app.into() })
            .clone();
        open.inc();
        let messages = |direction| {
            self.metrics
                .messages
                .get_or_create(&DirectionLabels {
                    app: app.into(),
                    direction,
                })
                .clone()
        };
        let counters = SocketCounters {
            open,
            incoming: messages("in"),
            outgoing: messages("out"),
            auto: messages("auto"),
        };
        (self.next_id.fetch_add(1, Ordering::Relaxed), counters)
    }

    /// The socket's one receipt, and its metrics.
    pub(crate) fn closed(&self, record: &SocketRecord, how: &Close, by: ClosedBy) {
        record.counters.open.dec();
        self.metrics
            .closes
            .get_or_create(&CloseLabels {
                app: record.app.to_string(),
                code: how.code,
                by: by.as_str(),
            })
            .inc();
        let Some(sink) = &self.sink else { return };
        let failed = matches!(how.code, 1002 | 1006..=1011);
        write_receipt(
            sink.as_ref(),
            SOCKET_TARGET,
            "socket closed",
            SystemTime::now(),
            &SocketFields {
                app: &record.app,
                version: &record.version,
                socket: record.id,
                protocol: record.protocol.as_deref(),
                relayed_by: record.relayer.as_deref(),
                messages_in: record.messages_in,
                messages_out: record.messages_out,
                bytes_in: record.bytes_in,
                bytes_out: record.bytes_out,
                queue_peak_bytes: record.queue_peak_bytes,
                close_code: how.code,
                closed_by: by,
            },
            &socket_end(
                if failed { "limit" } else { "ok" },
                record.opened,
                (!how.reason.is_empty()).then_some(how.reason.as_str()),
            ),
        );
    }
}

impl SocketHub {
    /// A socket of `app` this node relays to `actor`'s owner at `owner`:
    /// its id and record.
    pub(crate) fn relay_opened(&self, app: &str, actor: String, owner: Arc<str>) -> RelayRecord {
        let open = self
            .metrics
            .relayed
            .get_or_create(&AppLabels { app: app.into() })
            .clone();
        open.inc();
        RelayRecord {
            app: app.into(),
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            actor,
            owner,
            open,
            opened: Instant::now(),
        }
    }

    /// A relayed socket's one receipt: which end ended it first, and why
    /// when it was an error.
    pub(crate) fn relay_closed(&self, record: &RelayRecord, ended_by: &str, why: Option<&str>) {
        record.open.dec();
        let Some(sink) = &self.sink else { return };
        write_receipt(
            sink.as_ref(),
            SOCKET_TARGET,
            "socket relayed",
            SystemTime::now(),
            &RelayFields {
                app: &record.app,
                socket: record.id,
                actor: &record.actor,
                owner: &record.owner,
                ended_by,
            },
            &socket_end("ok", record.opened, why),
        );
    }
}

/// How a socket opened at `opened` ended, as its receipt's last fields
/// say: a socket's answer was its 101.
fn socket_end<'a>(outcome: &'static str, opened: Instant, detail: Option<&'a str>) -> Terminal<'a> {
    Terminal {
        outcome,
        error: None,
        status: Some(101),
        queued_us: None,
        wasm_us: None,
        total_us: opened.elapsed().as_micros() as u64,
        operations: 0,
        operations_refused: 0,
        detail,
    }
}

/// A socket this node relays to its actor's owner.
pub(crate) struct RelayRecord {
    app: Arc<str>,
    id: u64,
    /// `CLASS/NAME`.
    actor: String,
    /// The owner's internal address.
    owner: Arc<str>,
    open: Gauge,
    opened: Instant,
}

#[derive(Serialize)]
struct RelayFields<'a> {
    app: &'a str,
    socket: u64,
    actor: &'a str,
    owner: &'a str,
    /// Whose connection ended first: `owner` (as at the end of a close
    /// handshake, where the server closes first, or an owner gone),
    /// `client` (a client gone without one), or `shutdown` (this node's).
    ended_by: &'a str,
}

/// What one socket's receipt counts.
pub(crate) struct SocketRecord {
    pub app: Arc<str>,
    pub version: Arc<str>,
    /// The mark of the node that relayed it here, if one did.
    pub relayer: Option<Arc<str>>,
    pub id: u64,
    pub counters: SocketCounters,
    pub protocol: Option<String>,
    pub opened: Instant,
    pub messages_in: u64,
    pub messages_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// The most its send queue held at once, in cost (bytes and
    /// [`super::socket::MESSAGE_COST_BYTES`] a message).
    pub queue_peak_bytes: u64,
}

#[derive(Serialize)]
struct SocketFields<'a> {
    app: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    version: &'a str,
    socket: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    protocol: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    relayed_by: Option<&'a str>,
    messages_in: u64,
    messages_out: u64,
    bytes_in: u64,
    bytes_out: u64,
    queue_peak_bytes: u64,
    close_code: u16,
    closed_by: ClosedBy,
}
