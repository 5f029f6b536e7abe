//! Weir's HTTP transport: the listener, the head and body limits,
//! streamed bodies and the admin endpoints (Weir's JSON errors are the
//! runtime's `error_code::error_response`).
//!
//! Everything about bytes on the wire lives here; what runs the guest
//! lives in `weir-runtime`.

pub mod actor_route;
pub mod admin;
pub mod admin_apps;
pub mod admin_images;
pub mod admin_processes;
pub mod connection_places;
pub mod head;
pub mod request_body;
pub mod response_body;
pub mod routing;
pub mod server;
pub mod shutdown;
pub mod websocket;

pub use admin::{AdminState, Tenant, serve_admin};
pub use routing::{Router, Served};
pub use server::{ActorRoute, ServeOptions, serve};
