//! Weir's HTTP transport: the listener, the head and body limits, Weir's
//! JSON errors, streamed bodies and the admin endpoints.
//!
//! Everything about bytes on the wire lives here; what runs the guest
//! lives in `weir-runtime`.

pub mod admin;
pub mod error_response;
pub mod head;
pub mod request_body;
pub mod response_body;
pub mod server;

pub use admin::{AdminState, serve_admin};
pub use server::{ActorRoute, ServeOptions, serve};
