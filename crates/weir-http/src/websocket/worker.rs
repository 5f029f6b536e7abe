//! The host side of `weir:websocket/worker`: a worker accepts its event's
//! upgrade and holds the socket while its handler runs.
//!
//! Invariants owned here:
//! - only the event whose request was a valid upgrade can accept, once,
//!   and only before its response is set; the 101 goes out through the
//!   event's own response, so the event's deadline turns into its session
//!   deadline as for any response;
//! - a subprotocol the client did not offer is refused, and the offer
//!   stays for a corrected accept;
//! - the socket ends with its event: 1000 when the handler returns, 1001 at
//!   the session deadline, 1011 when the guest failed (see `ending`).

use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Empty};
use hyper::upgrade::OnUpgrade;
use tokio::sync::oneshot;
use wasmtime::component::{HasData, Linker, Resource};
use weir_runtime::code::HostInterfaces;
use weir_runtime::event::{CancelHandle, SessionEnd};
use weir_runtime::extension::Takeover;
use weir_runtime::guest_state::GenerationState;
use weir_runtime::outcome::Outcome;

use super::close::{CLOSE_GOING_AWAY, CLOSE_INTERNAL, CLOSE_NORMAL, Close};
use super::handshake::Handshake;
use super::hub::{ClosedBy, SocketHub, SocketPermit};
use super::socket::{self, GuestEnd, Incoming, Message, SocketError};
use super::wire::{Ending, Wire};

mod generated {
    wasmtime::component::bindgen!({
        path: "../../wit/weir-websocket",
        world: "weir:websocket/imports",
        imports: {
            "weir:websocket/worker.[method]websocket.receive": async | trappable,
            "weir:websocket/worker.[method]websocket.send": async | trappable,
            default: trappable,
        },
        with: {
            "weir:websocket/worker.websocket": super::WorkerSocket,
        },
    });
}

pub(crate) use generated::weir::websocket::actor::SocketInfo;
pub(crate) use generated::weir::websocket::types;
use generated::weir::websocket::worker;

/// A worker's socket, as its guest holds it.
pub struct WorkerSocket(GuestEnd);

/// What the transport offers an event whose request is a valid upgrade.
pub struct UpgradeOffer {
    pub handshake: Handshake,
    pub hub: Arc<SocketHub>,
    pub app: Arc<str>,
    /// The version of the app whose event took the upgrade.
    pub version: Arc<str>,
    /// The app's `cancellation_limit_ms` (see [`Wire::grace`]).
    pub grace: std::time::Duration,
    /// The mark of the node that relayed the upgrade here, if one did.
    pub relayer: Option<Arc<str>>,
    taken: Mutex<Option<(OnUpgrade, SocketPermit)>>,
}

impl UpgradeOffer {
    pub fn new(
        handshake: Handshake,
        hub: Arc<SocketHub>,
        (app, version): (Arc<str>, Arc<str>),
        grace: std::time::Duration,
        upgrade: OnUpgrade,
        permit: SocketPermit,
    ) -> Self {
        UpgradeOffer {
            handshake,
            hub,
            app,
            version,
            grace,
            relayer: None,
            taken: Mutex::new(Some((upgrade, permit))),
        }
    }
}

/// The event an accepted socket belongs to: its cancel handle and the
/// session's end.
type SessionLink = (CancelHandle, oneshot::Receiver<SessionEnd>);

impl UpgradeOffer {
    /// The upgrade and its place among `max_sockets`, for the one accept.
    pub(crate) fn take(&self) -> Option<(OnUpgrade, SocketPermit)> {
        self.taken.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// What the transport hands an accepted socket once the 101 goes out: the
/// event's cancel handle (held while the socket is open: a socket that
/// ends is a caller that left) and the session's end.
#[derive(Clone)]
pub struct Handoff(Arc<Mutex<Option<oneshot::Sender<SessionLink>>>>);

impl Handoff {
    /// Gives the socket its event; false when it was not waiting.
    pub fn give(&self, cancel: CancelHandle, session: oneshot::Receiver<SessionEnd>) -> bool {
        let taken = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        taken.is_some_and(|to| to.send((cancel, session)).is_ok())
    }
}

/// How a worker's socket ends: with its event.
fn ending() -> (Handoff, Ending) {
    let (tx, rx) = oneshot::channel();
    let ending = Box::pin(async move {
        let Ok((cancel, session)) = rx.await else {
            return (
                Close::new(CLOSE_INTERNAL, "the event ended before its socket opened"),
                ClosedBy::Weir,
            );
        };
        let end = session.await;
        drop(cancel);
        match end {
            Ok(SessionEnd::Clean) => (
                Close::new(CLOSE_NORMAL, "the handler returned"),
                ClosedBy::Guest,
            ),
            Ok(SessionEnd::Failed(Outcome::Deadline)) => (
                Close::new(CLOSE_GOING_AWAY, "session_limit_ms passed"),
                ClosedBy::Weir,
            ),
            Ok(SessionEnd::Failed(outcome)) => (
                Close::new(
                    CLOSE_INTERNAL,
                    format!("the guest failed ({})", outcome.as_str()),
                ),
                ClosedBy::Weir,
            ),
            Err(_) => (
                Close::new(CLOSE_INTERNAL, "the event was lost"),
                ClosedBy::Weir,
            ),
        }
    });
    (Handoff(Arc::new(Mutex::new(Some(tx)))), ending)
}

/// The 101 that accepts `offer`'s handshake with `protocol`, marked as a
/// host interface's takeover (a guest cannot set one).
pub(crate) fn switching_protocols(
    offer: &UpgradeOffer,
    protocol: Option<&str>,
) -> wasmtime::Result<hyper::Response<wasmtime_wasi_http::p2::body::HyperOutgoingBody>> {
    let body = Empty::new().map_err(|never| match never {}).boxed_unsync();
    let mut response = offer
        .handshake
        .accept(protocol)
        .body(body)
        .map_err(|e| wasmtime::format_err!("a 101 head: {e}"))?;
    response.extensions_mut().insert(Takeover);
    Ok(response)
}

pub(crate) fn to_guest_error(e: SocketError) -> types::Error {
    match e {
        SocketError::Closed(close) => types::Error::Closed(types::CloseFrame {
            code: close.code,
            reason: close.reason,
        }),
        SocketError::TooLarge(why) => types::Error::TooLarge(why),
        SocketError::Invalid(why) => types::Error::Invalid(why),
    }
}

pub(crate) fn from_guest(message: types::Message) -> Message {
    match message {
        types::Message::Text(t) => Message::Text(t),
        types::Message::Binary(b) => Message::Binary(b),
    }
}

pub(crate) fn to_guest(message: Message) -> types::Message {
    match message {
        Message::Text(t) => types::Message::Text(t),
        Message::Binary(b) => types::Message::Binary(b),
    }
}

impl types::Host for GenerationState {}

impl worker::Host for GenerationState {
    fn offered(&mut self) -> wasmtime::Result<Option<Vec<String>>> {
        Ok(self
            .offer::<UpgradeOffer>()
            .map(|offer| offer.handshake.protocols.clone()))
    }

    fn accept(
        &mut self,
        protocol: Option<String>,
    ) -> wasmtime::Result<Result<Resource<WorkerSocket>, types::Error>> {
        let Some(offer) = self.offer::<UpgradeOffer>() else {
            return Ok(Err(types::Error::NotAnUpgrade));
        };
        if let Some(p) = &protocol
            && !offer.handshake.protocols.contains(p)
        {
            return Ok(Err(types::Error::Invalid(format!(
                "the client did not offer the subprotocol {p:?}"
            ))));
        }
        let (offer, answer) = self
            .take_offer::<UpgradeOffer>()
            .expect("the offer was just there");
        let Some((upgrade, permit)) = offer.take() else {
            return Ok(Err(types::Error::NotAnUpgrade));
        };
        let limits = &offer.hub.limits;
        let (mut guest, wire) = socket::pair(
            limits.max_socket_message_bytes,
            limits.max_socket_send_queue_bytes,
            protocol.clone(),
        );
        let permit = std::sync::Arc::new(permit);
        guest.receiver.hold(permit.clone());
        let (handoff, ending) = ending();
        let mut response = switching_protocols(&offer, protocol.as_deref())?;
        response.extensions_mut().insert(handoff);
        if !answer.set(Ok(response)) {
            return Ok(Err(types::Error::AlreadyAnswered));
        }
        tokio::spawn(
            Wire {
                hub: offer.hub.clone(),
                permit,
                upgrade,
                end: wire,
                ending,
                app: offer.app.clone(),
                version: offer.version.clone(),
                relayer: offer.relayer.clone(),
                protocol,
                grace: offer.grace,
            }
            .run(),
        );
        Ok(Ok(self.table().push(WorkerSocket(guest))?))
    }
}

impl worker::HostWebsocket for GenerationState {
    async fn receive(
        &mut self,
        socket: Resource<WorkerSocket>,
    ) -> wasmtime::Result<Result<worker::Incoming, types::Error>> {
        let socket = self.table().get_mut(&socket)?;
        Ok(match socket.0.receive().await {
            Ok(Incoming::Message(m)) => Ok(worker::Incoming::Message(to_guest(m))),
            Ok(Incoming::Close(c)) => Ok(worker::Incoming::Close(types::CloseFrame {
                code: c.code,
                reason: c.reason,
            })),
            Err(e) => Err(to_guest_error(e)),
        })
    }

    async fn send(
        &mut self,
        socket: Resource<WorkerSocket>,
        message: types::Message,
    ) -> wasmtime::Result<Result<(), types::Error>> {
        let socket = self.table().get(&socket)?;
        Ok(socket
            .0
            .send(from_guest(message))
            .await
            .map_err(to_guest_error))
    }

    fn close(
        &mut self,
        socket: Resource<WorkerSocket>,
        code: u16,
        reason: String,
    ) -> wasmtime::Result<Result<(), types::Error>> {
        let socket = self.table().get(&socket)?;
        Ok(socket.0.close(code, reason).map_err(to_guest_error))
    }

    fn protocol(&mut self, socket: Resource<WorkerSocket>) -> wasmtime::Result<Option<String>> {
        Ok(self.table().get(&socket)?.0.protocol.clone())
    }

    fn drop(&mut self, socket: Resource<WorkerSocket>) -> wasmtime::Result<()> {
        self.table().delete(socket)?;
        Ok(())
    }
}

struct Sockets;

impl HasData for Sockets {
    type Data<'a> = &'a mut GenerationState;
}

/// `weir:websocket` in every app's linker: workers' sockets, and the
/// sockets actors own.
pub struct SocketInterfaces(pub Arc<super::actor::ActorSockets>);

impl HostInterfaces for SocketInterfaces {
    fn add_to_linker(&self, linker: &mut Linker<GenerationState>) -> wasmtime::Result<()> {
        generated::weir::websocket::types::add_to_linker::<_, Sockets>(linker, |s| s)?;
        generated::weir::websocket::worker::add_to_linker::<_, Sockets>(linker, |s| s)?;
        super::actor::add_to_linker(&self.0, linker)
    }
}
