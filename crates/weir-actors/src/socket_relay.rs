//! Socket relays: what a placement that runs actors on several nodes
//! (cluster mode) offers an actor's WebSocket whose client reached a node
//! that does not own the actor. The upgrade goes to the owner, which runs
//! it as a turn of the actor like any other; once the owner accepted it,
//! the node the client reached only carries bytes both ways, and the
//! socket is the owner's: its framing, its limits, its hibernation.
//!
//! Invariants this module's types carry:
//! - an upgrade is relayed at most once, and it runs where it lands or
//!   not at all ([`SocketDoor::open`] answers `None`, and nothing ran);
//! - a socket lives only as long as its actor's owner keeps the actor:
//!   [`crate::Placement::tenure`] ends when the owner's hold on the actor
//!   does, and the socket is closed then, so that an actor never holds a
//!   socket its clients reach through a node that no longer owns it;
//! - a relayed socket ends, too, when the node that relays it leaves: that
//!   node tells the owner first ([`crate::Placement::relayer_leaving`]),
//!   and the owner closes its sockets going away (1001) while their bytes
//!   still flow, so their clients see a close frame, not a lost connection.

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::address::ActorAddress;
use crate::error_code::TurnError;
use crate::placement::BoxFuture;

/// The prefix of the headers only nodes send each other: none of the
/// client's travels, and none reaches the actor.
pub const CLUSTER_HEADER_PREFIX: &str = "x-weir-cluster-";

/// On a relayed upgrade: which run of which node relayed it (its name and
/// a mark of this run of its process), so that the owner can close the
/// sockets that node relays when it says it is leaving
/// ([`SocketDoor::relayer_leaving`]). A node that starts again under the
/// same name relays under a new mark: its new sockets are not the ones
/// it said it was leaving.
pub const RELAYER_HEADER: &str = "x-weir-cluster-relayer";

/// The longest relayer mark an owner keeps: a node's name and a number.
pub const MAX_RELAYER_BYTES: usize = 256;

/// The relayer's mark `headers` carry, if they carry a usable one.
pub fn relayer_mark(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(RELAYER_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|m| !m.is_empty() && m.len() <= MAX_RELAYER_BYTES)
}

/// A relayed socket's connection to the actor's owner.
pub trait RelayIo: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> RelayIo for T {}

/// How an upgrade relayed to an actor's owner ended.
pub enum Relayed {
    /// The owner accepted the socket: its answer (101, head only) and the
    /// connection the socket's bytes now take.
    Opened(http::Response<()>, Box<dyn RelayIo>),
    /// The owner answered without a socket (the actor did not accept it,
    /// or a limit refused it): its answer goes to the client.
    Answered(http::Response<Bytes>),
    /// It did not run there: it may be relayed again after a fresh
    /// [`crate::Placement::locate`], or answered with this error.
    NotRun(TurnError),
    /// It could not be relayed, or may have run without an answer: it is
    /// not tried again.
    Failed(TurnError),
}

/// Where a node takes the upgrades other nodes relay to the actors of one
/// app (the transport's actor route, run as if the client had come here).
pub trait SocketDoor: Send + Sync + 'static {
    /// Runs the upgrade `request` to `actor`, with `path` its path inside
    /// the actor, here or not at all (`None`: this node does not own the
    /// actor, and nothing ran). An accepted socket's answer is a 101 whose
    /// connection the socket then takes.
    fn open(
        &self,
        actor: ActorAddress,
        path: String,
        request: http::Request<hyper::body::Incoming>,
    ) -> BoxFuture<'static, Option<http::Response<Bytes>>>;

    /// The node that relayed sockets here under the mark `relayer` is
    /// leaving: those sockets close as this node's own do at its shutdown
    /// (1001), their close frames carried by the relayer while it still
    /// can, and their actors hear of it as of any other end.
    fn relayer_leaving(&self, relayer: &str);
}
