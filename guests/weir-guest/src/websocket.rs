//! `weir:websocket`: a worker accepts its event's WebSocket upgrade and
//! holds the socket while its handler runs.
//!
//! ```ignore
//! if let Ok(socket) = weir_guest::websocket::accept(None) {
//!     while let Ok(Incoming::Message(m)) = socket.receive() {
//!         socket.send(&m)?;
//!     }
//!     return;
//! }
//! ```

#[doc(hidden)]
pub use crate::websocket_bindings::weir::websocket::types as types_module;
pub use crate::websocket_bindings::weir::websocket::types::{CloseFrame, Error, Message};
pub use crate::websocket_bindings::weir::websocket::worker::{Incoming, Websocket};

/// Sockets an actor owns (`weir:websocket/actor`): accepted in a
/// request turn, delivered to the class's [`crate::socket_handler!`].
pub mod actor {
    use crate::websocket_bindings::weir::websocket::actor as host;
    pub use crate::websocket_bindings::weir::websocket::actor::SocketInfo;

    use super::{Error, Message};

    /// Accepts this turn's upgrade; the socket's id.
    pub fn accept(
        tags: &[String],
        key: Option<&str>,
        protocol: Option<&str>,
    ) -> Result<u64, Error> {
        host::accept(tags, key, protocol)
    }

    /// Queues a message (never waits; a full queue closes with 1008).
    pub fn send(socket: u64, message: &Message) -> Result<(), Error> {
        host::send(socket, message)
    }

    /// Sends a text message.
    pub fn send_text(socket: u64, text: &str) -> Result<(), Error> {
        host::send(socket, &Message::Text(text.to_string()))
    }

    pub fn close(socket: u64, code: u16, reason: &str) -> Result<(), Error> {
        host::close(socket, code, reason)
    }

    /// This actor's open sockets, or those tagged `tag`.
    pub fn sockets(tag: Option<&str>) -> Vec<SocketInfo> {
        host::sockets(tag)
    }

    pub fn set_attachment(socket: u64, attachment: &[u8]) -> Result<(), Error> {
        host::set_attachment(socket, attachment)
    }

    pub fn attachment(socket: u64) -> Result<Option<Vec<u8>>, Error> {
        host::attachment(socket)
    }

    /// Weir answers a text message equal to `request` with `reply`,
    /// without a turn; `None` clears it.
    pub fn set_auto_response(pair: Option<(&str, &str)>) -> Result<(), Error> {
        let pair = pair.map(|(a, b)| (a.to_string(), b.to_string()));
        host::set_auto_response(pair.as_ref().map(|(a, b)| (a.as_str(), b.as_str())))
    }
}

/// Accepts this event's upgrade (Weir answers 101), agreeing on
/// `protocol` if given; `Error::NotAnUpgrade` when the request is not
/// one, and the guest answers it as usual.
pub fn accept(protocol: Option<&str>) -> Result<Websocket, Error> {
    crate::websocket_bindings::weir::websocket::worker::accept(protocol)
}

/// The subprotocols the client offers, when the request is an upgrade.
pub fn offered() -> Option<Vec<String>> {
    crate::websocket_bindings::weir::websocket::worker::offered()
}
