//! An actor's WebSocket in cluster mode: held by the node that owns the
//! actor, whichever node its client reached. An upgrade that reached
//! another node is relayed to the owner, where it is a turn of the actor
//! like any other ([`RelayDoor`]); the node the client reached then
//! carries the socket's bytes both ways and nothing else.
//!
//! Invariants owned here:
//! - the upgrade is checked, and given its place among this node's
//!   `max_sockets`, before it is located or relayed: a relayed socket
//!   holds a place on both nodes, and is refused on either alike;
//! - it runs on the owner or nowhere: located here, it runs only if this
//!   node still owns the actor when its turn starts; relayed, only if the
//!   owner does; after a "not run", it is located afresh once more;
//! - the owner's turn never sees the headers nodes send each other (the
//!   cluster's secret among them);
//! - once one direction of a relayed socket ends, the other is given
//!   [`RELAY_LINGER`] (the close handshake) and then dropped;
//! - a relayed socket lives no longer than its owner's lease: once the
//!   owner's node is known to have left (`Placement::owner_gone`: within
//!   about a lease and two thirds of its last renewal), the socket is
//!   dropped here, so that a client of an owner that vanished without a
//!   reset reconnects to the actor's next owner;
//! - at this node's shutdown its relayed sockets close as its own do,
//!   with 1001: the owner is told (once, for all of them) and closes them
//!   while their bytes still flow here, for at most [`LEAVING_LINGER`];
//!   an owner that cannot be told (gone, or of a build without the
//!   telling) is not waited for, and its sockets are dropped (their
//!   clients see their connections end);
//! - a relayed socket leaves one receipt on this node ("socket relayed":
//!   the actor, its owner, which end ended it) and counts in
//!   `sockets_relayed_open` while it lives; the socket's own receipt is
//!   its owner's.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use weir_actors::placement::BoxFuture;
use weir_actors::socket_relay::{CLUSTER_HEADER_PREFIX, RelayIo, relayer_mark};
use weir_actors::{ActorAddress, ActorHost, Location, Placement, Relayed, SocketDoor, TurnError};
use weir_runtime::ErrorCode;
use weir_runtime::error_code::error_response;

use super::SocketErrorCode;
use super::hub::RelayRecord;
use super::upgrade::{offer_upgrade, socket_refusal};
use super::wire::CLOSE_HANDSHAKE_TIMEOUT;
use super::worker::UpgradeOffer;
use crate::actor_route::{Reach, served, turn, with_offer};
use crate::response_body::ServeBody;
use crate::routing::Router;
use crate::server::{ServeOptions, over_head_limits, read_request_body};

/// How long the other direction of a relayed socket may go on once one
/// ended: as long as either end waits for the other's close frame.
pub const RELAY_LINGER: Duration = CLOSE_HANDSHAKE_TIMEOUT;

/// How long a relayed socket's bytes go on flowing at this node's
/// shutdown once its owner said it closes it: the owner's close handshake
/// (after which the owner drops its end, and both directions end), and a
/// second for the bytes in flight. With the owner's answer (at most 2 s)
/// it stays inside the shutdown's grace ([`crate::server::SHUTDOWN_GRACE`]),
/// so the socket's receipt is written before the process ends.
pub const LEAVING_LINGER: Duration = Duration::from_secs(CLOSE_HANDSHAKE_TIMEOUT.as_secs() + 1);

/// Bytes read at once in each direction of a relayed socket: small, as an
/// owned socket's read buffer is ([`super::wire::READ_BUFFER_BYTES`]),
/// since most sockets are idle and the two buffers are most of what an
/// idle relayed socket costs its node (9.1 KiB per socket in all with
/// 4 KiB here, measured); a larger message takes more reads.
pub const RELAY_BUFFER_BYTES: usize = super::wire::READ_BUFFER_BYTES;

/// An upgrade to `address` that its actor may accept, on a node of a
/// cluster: run here if this node owns the actor, relayed to the owner
/// otherwise.
pub(crate) async fn socket(
    host: &Arc<ActorHost>,
    placement: &Arc<dyn Placement>,
    address: ActorAddress,
    actor_path: String,
    parts: http::request::Parts,
    bytes: Bytes,
    offer: UpgradeOffer,
) -> Response<ServeBody> {
    let method = parts.method.clone();
    let head = head_of(&parts.method, &parts.uri, &parts.headers);
    let offer = Arc::new(offer);
    let mut last = TurnError::from(ErrorCode::HostUnavailable);
    for attempt in 0..2 {
        match placement.locate(&address, attempt > 0, false).await {
            Ok(Location::Here) => {
                let own = with_offer(copy(&head).into_parts().0, Some(offer.clone()));
                let ran = turn(
                    host,
                    address.clone(),
                    actor_path.clone(),
                    own,
                    bytes.clone(),
                    Reach::HereOnly,
                )
                .await;
                match ran {
                    Some(response) => return served(&method, response),
                    // Not this node's any more: located afresh.
                    None => last = ErrorCode::HostUnavailable.into(),
                }
            }
            Ok(Location::Elsewhere(node)) => {
                let relayed = placement
                    .relay_socket(
                        node.clone(),
                        address.clone(),
                        actor_path.clone(),
                        copy(&head),
                    )
                    .await;
                match relayed {
                    Relayed::Opened(response, io) => {
                        let record = offer.hub.relay_opened(
                            &offer.app,
                            format!("{}/{}", address.class, address.name),
                            node.clone(),
                        );
                        return carry(&offer, response, io, (record, placement.clone(), node));
                    }
                    Relayed::Answered(response) => return served(&method, response),
                    Relayed::NotRun(code) => last = code,
                    Relayed::Failed(code) => return error_response(code),
                }
            }
            Err(code) => return error_response(code),
        }
    }
    error_response(last)
}

/// A request's method, target and headers, to send again.
fn head_of(method: &http::Method, uri: &http::Uri, headers: &http::HeaderMap) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = method.clone();
    *head.uri_mut() = uri.clone();
    *head.headers_mut() = headers.clone();
    head
}

fn copy(head: &Request<()>) -> Request<()> {
    head_of(head.method(), head.uri(), head.headers())
}

/// Answers the client with the owner's 101 and carries the socket's bytes
/// between the two from then on, holding its place among `max_sockets`;
/// its receipt says which end ended it. At this node's shutdown, the
/// owner (`node`, reached through `placement`) is asked to close it.
fn carry(
    offer: &UpgradeOffer,
    response: Response<()>,
    owner: Box<dyn RelayIo>,
    (record, placement, node): (RelayRecord, Arc<dyn Placement>, Arc<str>),
) -> Response<ServeBody> {
    let Some((client, permit)) = offer.take() else {
        offer
            .hub
            .relay_closed(&record, "client", Some("the upgrade was taken"));
        return error_response(ErrorCode::HostUnavailable);
    };
    let hub = offer.hub.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let (by, why) = match client.await {
            Ok(upgraded) => {
                let mut spliced = pin!(splice(TokioIo::new(upgraded), owner));
                let gone = placement.owner_gone(node.clone());
                tokio::select! {
                    ended = &mut spliced => ended,
                    // Dropped both ways: the client sees its connection
                    // end, as it would had the owner died with a reset.
                    () = gone => ("owner", Some("the owner's node left the cluster (its lease ended)".into())),
                    () = hub.shutting_down() => {
                        if placement.relayer_leaving(node).await {
                            match tokio::time::timeout(LEAVING_LINGER, spliced).await {
                                Ok(ended) => ended,
                                Err(_) => ("shutdown", Some("the owner did not close it in time".into())),
                            }
                        } else {
                            ("shutdown", Some("its owner could not be told this node is leaving".into()))
                        }
                    }
                }
            }
            Err(e) => ("client", Some(format!("upgrade failed: {e}"))),
        };
        hub.relay_closed(&record, by, why.as_deref());
    });
    let (head, ()) = response.into_parts();
    Response::from_parts(head, ServeBody::empty())
}

/// Copies bytes both ways until one direction ends, then gives the other
/// [`RELAY_LINGER`] to end too. Says which end ended first (`client` or
/// `owner`), and its error if it ended with one.
async fn splice(
    client: impl AsyncRead + AsyncWrite + Send,
    owner: Box<dyn RelayIo>,
) -> (&'static str, Option<String>) {
    let (from_client, mut to_client) = tokio::io::split(client);
    let (from_owner, mut to_owner) = tokio::io::split(owner);
    let mut up = pin!(async move {
        let mut from = BufReader::with_capacity(RELAY_BUFFER_BYTES, from_client);
        let copied = tokio::io::copy_buf(&mut from, &mut to_owner).await;
        let _ = to_owner.shutdown().await;
        copied
    });
    let mut down = pin!(async move {
        let mut from = BufReader::with_capacity(RELAY_BUFFER_BYTES, from_owner);
        let copied = tokio::io::copy_buf(&mut from, &mut to_client).await;
        let _ = to_client.shutdown().await;
        copied
    });
    let (by, copied) = tokio::select! {
        copied = &mut up => {
            let _ = tokio::time::timeout(RELAY_LINGER, down).await;
            ("client", copied)
        }
        copied = &mut down => {
            let _ = tokio::time::timeout(RELAY_LINGER, up).await;
            ("owner", copied)
        }
    };
    (by, copied.err().map(|e| e.to_string()))
}

/// Where one app's actors take the sockets other nodes relay to them: the
/// actor route's path, run here or not at all.
pub struct RelayDoor {
    router: Arc<Router>,
    app: Arc<str>,
    options: ServeOptions,
}

impl RelayDoor {
    /// The door of `app`, served by `router` (looked up at each upgrade,
    /// so a deploy's new version takes the next one) with `options`.
    pub fn new(router: Arc<Router>, app: &str, options: ServeOptions) -> Arc<RelayDoor> {
        Arc::new(RelayDoor {
            router,
            app: Arc::from(app),
            options,
        })
    }
}

impl SocketDoor for RelayDoor {
    fn open(
        &self,
        actor: ActorAddress,
        path: String,
        mut request: Request<Incoming>,
    ) -> BoxFuture<'static, Option<Response<Bytes>>> {
        let served = self
            .router
            .table()
            .apps()
            .into_iter()
            .find(|s| s.name == self.app);
        let sockets = self.options.sockets.clone();
        Box::pin(async move {
            let served = served?;
            let host = served.actors.clone()?;
            let app = &served.app;
            // Read before the headers nodes send each other go.
            let relayer = relayer_mark(request.headers()).map(Arc::<str>::from);
            // What nodes tell each other is not the actor's to read.
            let theirs: Vec<_> = request
                .headers()
                .keys()
                .filter(|name| name.as_str().starts_with(CLUSTER_HEADER_PREFIX))
                .cloned()
                .collect();
            for name in theirs {
                request.headers_mut().remove(name);
            }
            if let Some(code) = over_head_limits(&request, &app.code.limits) {
                return Some(error_response(code));
            }
            let mut offer = match offer_upgrade(app, sockets.as_ref(), &mut request) {
                Ok(Some(offer)) => offer,
                Ok(None) => return Some(socket_refusal(SocketErrorCode::InvalidUpgrade)),
                Err((_, code, _)) => return Some(socket_refusal(code)),
            };
            offer.relayer = relayer;
            let (parts, body) = request.into_parts();
            let bytes = match read_request_body(body, &app.code.limits).await {
                Ok(bytes) => bytes,
                Err(e) => return Some(error_response(e.code())),
            };
            let parts = with_offer(parts, Some(Arc::new(offer)));
            turn(&host, actor, path, parts, bytes, Reach::HereOnly).await
        })
    }

    fn relayer_leaving(&self, relayer: &str) {
        if let Some(hub) = &self.options.sockets {
            hub.relayer_leaving(relayer);
        }
    }
}
