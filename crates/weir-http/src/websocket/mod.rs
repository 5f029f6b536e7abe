//! WebSockets: the upgrade in the transport, the framing on the wire, and
//! the host interface (`weir:websocket`) through which guests hold sockets.
//! The host owns the framing; guests see whole messages.
//!
//! - [`handshake`]: which requests are valid upgrades, and the 101;
//! - [`upgrade`]: the transport's check of an upgrade before admission;
//! - [`socket`]: one socket's guest end and wire end, and the bounded
//!   queues between them; [`close`]: the close codes and frames;
//! - [`wire`]: the task that owns a socket's connection;
//! - [`hub`]: the server's sockets together (capacity, shutdown, receipts);
//! - [`worker`]: the host interface of workers' sockets;
//! - [`actor`]: sockets actors own, held across hibernation, delivered
//!   as turns, and [`relay`]: in cluster mode, held by the actor's owner
//!   whichever node the client reached;
//! - [`limits`], [`error_code`]: the sockets' limits and error codes.

pub mod actor;
pub mod close;
pub mod error_code;
pub mod handshake;
pub mod hub;
pub mod limits;
pub mod relay;
pub mod socket;
pub mod upgrade;
pub mod wire;
pub mod worker;

pub use actor::ActorSockets;
pub use error_code::SocketErrorCode;
pub use hub::SocketHub;
pub use limits::SocketLimits;
pub use worker::SocketInterfaces;
