//! Placement: the extension point through which a layer that keeps actors'
//! storage beyond this process (cluster mode) decides where each call runs,
//! makes an actor's local copy current before it wakes, and makes its
//! commits durable before their effects leave. Without a placement every
//! actor runs here on its local database, as on one machine.
//!
//! Invariants the actor host keeps for a placement:
//! - a call runs here only after [`Placement::locate`] said so; a call
//!   located elsewhere is handed to [`Placement::forward`] whole (an
//!   operator's to [`Placement::forward_operator`]); it is handed on again
//!   (once, after a fresh `locate`) only when it did not run where it was
//!   sent ([`Forwarded::NotRun`]);
//! - an actor's history is deleted ([`Placement::forget`]) only where it
//!   runs, between its turns, once its commits settled;
//! - an actor's database is opened only through [`Placement::open`], and
//!   every commit made on it is handed to its [`Durable`] in commit order;
//! - nothing a turn produced leaves the actor (its response, an outbound
//!   request) before [`Durable::settled`] says the commits before it are
//!   durable;
//! - a [`Durable`] that is broken is never used again: the actor is reset
//!   (instance and database dropped) and opened anew before its next turn;
//! - an actor's WebSocket is held only by the node that owns the actor,
//!   and only for that ownership ([`Placement::tenure`]); a client that
//!   reached another node is relayed there ([`Placement::relay_socket`]).

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use weir_store::actor::ActorDb;
use weir_store::replica::{LogEntry, Mirror};

use crate::address::ActorAddress;
use crate::error_code::TurnError;
use crate::operator_calls::OperatorCall;
use crate::socket_relay::Relayed;

/// A future a placement hands back.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A placement's own failure: a stable code and its HTTP status, answered
/// as Weir's JSON error like every other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub code: &'static str,
    pub status: u16,
}

/// An actor's database opened by a placement, with its durable half.
pub type Opened = (ActorDb, Arc<dyn Durable>);

/// Where a call to an actor runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    Here,
    /// On another node, reached at this internal address.
    Elsewhere(Arc<str>),
}

/// An actor a placement keeps beyond this process, as operators list it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Known {
    pub name: String,
    /// Its earliest timer, ms since the Unix epoch.
    pub next_timer_ms: Option<i64>,
    /// The node that owns it now, if one does.
    pub owner: Option<String>,
}

/// How a call handed to another node ended.
#[derive(Debug)]
pub enum Forwarded {
    /// The node answered; the answer may be an error of its own.
    Answered(http::Response<Bytes>),
    /// The call did not run there (the node does not own the actor, or
    /// could not be reached at all): it may be sent again after a fresh
    /// [`Placement::locate`], or answered with this error.
    NotRun(TurnError),
    /// The call could not be delivered, or may have run without an answer
    /// coming back: it is never sent again.
    Failed(TurnError),
}

/// Where actors run and where their storage is made durable.
pub trait Placement: Send + Sync + 'static {
    /// Where a call to `actor` runs. `refresh`: what was known of its owner
    /// proved wrong, ask again. `forwarded`: the call already took its hop,
    /// so it runs here or nowhere.
    fn locate<'a>(
        &'a self,
        actor: &'a ActorAddress,
        refresh: bool,
        forwarded: bool,
    ) -> BoxFuture<'a, Result<Location, TurnError>>;

    /// Hands a call to the node at `node`.
    fn forward(
        &self,
        node: Arc<str>,
        actor: ActorAddress,
        request: http::Request<Bytes>,
    ) -> BoxFuture<'static, Forwarded>;

    /// Hands an operator's call about `actor` to the node at `node`; its
    /// answer is an [`crate::OperatorAnswer`].
    fn forward_operator(
        &self,
        node: Arc<str>,
        actor: ActorAddress,
        call: OperatorCall,
    ) -> BoxFuture<'static, Forwarded>;

    /// At most `limit` of the actors of `class` with durable history,
    /// wherever they run, in name order (the database's), from the first
    /// after `after`.
    fn list<'a>(
        &'a self,
        class: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Known>, TurnError>>;

    /// Those of `actors` (of one class) with durable history, by name.
    fn with_history<'a>(
        &'a self,
        actors: &'a [ActorAddress],
    ) -> BoxFuture<'a, Result<Vec<String>, TurnError>>;

    /// Whether `actor`, which runs here, has committed anything durable
    /// (an actor no turn ever ran on has no history, whatever made it
    /// known).
    fn has_history(&self, actor: &ActorAddress) -> bool;

    /// Deletes the durable history of `actor`, which runs here: true if it
    /// had any. Its next call starts a new actor. Other nodes are asked to
    /// drop the copies they kept ([`OperatorCall::DropCopy`]).
    fn forget<'a>(&'a self, actor: &'a ActorAddress) -> BoxFuture<'a, Result<bool, TurnError>>;

    /// Whether this node owns `actor` now.
    fn owns(&self, actor: &ActorAddress) -> bool;

    /// This node's local copy of `actor`, which it does not own, was
    /// removed: what it knew of that copy goes too.
    fn copy_dropped(&self, actor: &ActorAddress);

    /// Opens the actor's database at `path` for its turns here, its local
    /// copy made current first, with the durable half of its commits.
    fn open<'a>(
        &'a self,
        actor: &'a ActorAddress,
        path: &'a Path,
    ) -> BoxFuture<'a, Result<Opened, TurnError>>;

    /// Relays an upgrade to `actor` (its `path` inside the actor, the
    /// client's `head`) to the node at `node`, where it runs as a turn of
    /// the actor ([`crate::SocketDoor`]).
    fn relay_socket(
        &self,
        node: Arc<str>,
        actor: ActorAddress,
        path: String,
        head: http::Request<()>,
    ) -> BoxFuture<'static, Relayed>;

    /// This node is leaving: asks the node at `node` to close, going away,
    /// the sockets this node relays to it ([`crate::SocketDoor::relayer_leaving`]),
    /// so that their clients get a close frame rather than a dropped
    /// connection. Asked once per node however many sockets ask; true when
    /// that node said it will.
    fn relayer_leaving(&self, node: Arc<str>) -> BoxFuture<'static, bool>;

    /// Resolves when this node's hold on `actor`, as of now, ends (at once
    /// if it does not own it): the sockets it accepted then close, so that
    /// the node that owns it next holds all of them.
    fn tenure(&self, actor: &ActorAddress) -> BoxFuture<'static, ()>;

    /// Resolves when the node at `node` is known to have left: it holds
    /// no lease as of this node's latest word from the cluster. A socket
    /// relayed to it then ends here, so that its client reaches the
    /// actor's next owner, even when the owner vanished without a reset
    /// (power lost, cut off, stopped). Never, unless a placement says.
    fn owner_gone(&self, node: Arc<str>) -> BoxFuture<'static, ()> {
        let _ = node;
        Box::pin(std::future::pending())
    }
}

/// The durable half of one open actor database: where its commits go.
pub trait Durable: Send + Sync {
    /// Takes commits, in order, and what the actor's row mirrors after the
    /// last of them (its earliest timer, whether its launch journal has
    /// rows), to make them durable.
    fn ship(&self, log: Vec<LogEntry>, mirror: Mirror);

    /// Resolves once everything shipped so far is durable and this node
    /// may still answer for the actor.
    fn settled(&self) -> BoxFuture<'static, Result<(), TurnError>>;

    /// Calls `done` once everything shipped so far is durable (as
    /// [`Durable::settled`] resolves), in the order of the calls, without
    /// a task of its own: how answers leave a busy actor.
    fn on_settled(&self, done: Box<dyn FnOnce(Result<(), TurnError>) + Send>) {
        let settled = self.settled();
        tokio::spawn(async move { done(settled.await) });
    }

    /// Why the actor's state here can no longer be trusted, once it cannot.
    fn broken(&self) -> Option<TurnError>;

    /// True when a snapshot would compact the actor's log.
    fn wants_snapshot(&self) -> bool;

    /// Takes a snapshot at `head`, made once everything before it settled.
    fn snapshot(&self, head: u64, ltx: Vec<u8>);
}
