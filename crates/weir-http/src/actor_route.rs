//! A request on an actor route: the transport's limits, then one turn of
//! the actor, here or (in cluster mode) on the node that owns it; an
//! upgrade the actor may accept as its WebSocket goes to the owner whole
//! ([`crate::websocket::relay`]).
//!
//! Invariants owned here:
//! - the head limits, the actor's address and the upgrade (its place
//!   among `max_sockets`) are checked before the actor is located, and
//!   the body is read under the app's limits before its turn;
//! - the actor sees the path inside its route and its own address as the
//!   host, wherever the request came in;
//! - the answer follows the transport's bodyless rule, and an accepted
//!   socket's 101 carries no body.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, header};
use hyper::body::Incoming;
use weir_actors::{ActorAddress, ActorErrorCode, ActorHost};
use weir_runtime::error_code::error_response;
use weir_runtime::extension::{EventOffer, Takeover};
use weir_runtime::{App, ErrorCode};

use crate::response_body::ServeBody;
use crate::server::{ServeOptions, bodyless, over_head_limits, read_request_body};
use crate::websocket::relay;
use crate::websocket::upgrade::{offer_upgrade, socket_refusal};
use crate::websocket::worker::UpgradeOffer;

/// Where a turn may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Here, or on the node that owns the actor.
    Anywhere,
    /// Here or not at all (`None`): another node sent it, or it was located
    /// here a moment ago.
    HereOnly,
}

/// A request on an actor route of `app`: the transport limits, then one
/// turn of the actor; the actor's receipt records it.
pub(crate) async fn handle(
    app: &App,
    host: &Arc<ActorHost>,
    (class, name): (&str, &str),
    actor_path: String,
    mut req: Request<Incoming>,
    options: &ServeOptions,
) -> Response<ServeBody> {
    if let Some(code) = over_head_limits(&req, &app.code.limits) {
        return error_response(code);
    }
    let Ok(address) = ActorAddress::new(class, name) else {
        return error_response(ActorErrorCode::AddressInvalid);
    };
    let offer = match offer_upgrade(app, options.sockets.as_ref(), &mut req) {
        Ok(offer) => offer,
        Err((_, code, _)) => return socket_refusal(code),
    };
    let (parts, body) = req.into_parts();
    let bytes = match read_request_body(body, &app.code.limits).await {
        Ok(bytes) => bytes,
        Err(e) => return error_response(e.code()),
    };
    match (offer, host.placement()) {
        // A socket the actor may accept is held where the actor runs.
        (Some(offer), Some(placement)) => {
            relay::socket(host, placement, address, actor_path, parts, bytes, offer).await
        }
        (offer, _) => {
            let method = parts.method.clone();
            let parts = with_offer(parts, offer.map(Arc::new));
            let response = turn(host, address, actor_path, parts, bytes, Reach::Anywhere).await;
            let response = response.unwrap_or_else(|| error_response(ErrorCode::HostUnavailable));
            served(&method, response)
        }
    }
}

/// A request's head with the upgrade offer its turn may accept.
pub(crate) fn with_offer(
    mut parts: http::request::Parts,
    offer: Option<Arc<UpgradeOffer>>,
) -> http::request::Parts {
    if let Some(offer) = offer {
        parts.extensions.insert(EventOffer(offer));
    }
    parts
}

/// One turn of the actor at `address` on the request `parts` and `bytes`,
/// as the actor sees it (its path inside the route, its own address as the
/// host); `None` when `reach` is [`Reach::HereOnly`] and it did not run.
pub(crate) async fn turn(
    host: &Arc<ActorHost>,
    address: ActorAddress,
    actor_path: String,
    mut parts: http::request::Parts,
    bytes: Bytes,
    reach: Reach,
) -> Option<Response<Bytes>> {
    parts.uri = match http::Uri::builder()
        .scheme("http")
        .authority(address.to_string())
        .path_and_query(actor_path)
        .build()
    {
        Ok(uri) => uri,
        Err(_) => return Some(error_response(ErrorCode::BadRequest)),
    };
    parts.headers.insert(
        header::HOST,
        HeaderValue::from_str(&address.to_string()).expect("actor addresses are valid hosts"),
    );
    let request = Request::from_parts(parts, bytes);
    match reach {
        Reach::Anywhere => Some(host.call_address(address, request).await),
        Reach::HereOnly => host.call_forwarded(address, request).await,
    }
}

/// An actor's answer to a `method` request as the client gets it: an
/// accepted socket (101) and a bodyless answer (invariant 4 of the
/// transport) carry no body.
pub(crate) fn served(method: &http::Method, response: Response<Bytes>) -> Response<ServeBody> {
    let (mut parts, body) = response.into_parts();
    if parts.extensions.get::<Takeover>().is_some() || bodyless(method, &mut parts) {
        return Response::from_parts(parts, ServeBody::empty());
    }
    Response::from_parts(parts, ServeBody::full(body))
}
