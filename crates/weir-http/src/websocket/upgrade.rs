//! The transport's side of an upgrade: a request that asks for a
//! WebSocket is checked and given its place among the server's sockets
//! before admission, or refused with Weir's JSON answer, so the guest never
//! sees an upgrade Weir refuses.

use std::sync::Arc;

use http::{HeaderValue, Request, Response, header};
use hyper::body::Incoming;
use weir_runtime::App;
use weir_runtime::error_code::error_response;
use weir_runtime::outcome::Outcome;
use weir_runtime::receipt::Receipt;

use super::handshake::{self, Upgrade, WEBSOCKET_VERSION};
use super::worker::UpgradeOffer;
use super::{SocketErrorCode, SocketHub};
use crate::response_body::ServeBody;

/// Why an upgrade is refused: the receipt's outcome, the code, the reason.
pub(crate) type Refusal = (Outcome, SocketErrorCode, Option<&'static str>);

/// A request's WebSocket upgrade, checked and given its place among the
/// server's sockets before admission, so that the guest never sees one
/// Weir refuses; `None` for a plain request.
pub(crate) fn offer_upgrade(
    app: &App,
    sockets: Option<&Arc<SocketHub>>,
    req: &mut Request<Incoming>,
) -> Result<Option<UpgradeOffer>, Refusal> {
    let Some(hub) = sockets else {
        return Ok(None);
    };
    match handshake::inspect(req) {
        Upgrade::No => Ok(None),
        Upgrade::Invalid(why) => Err((Outcome::Limit, SocketErrorCode::InvalidUpgrade, Some(why))),
        Upgrade::Valid(handshake) => match hub.admit(&app.name) {
            Ok(permit) => Ok(Some(UpgradeOffer::new(
                handshake,
                hub.clone(),
                (app.name.clone(), app.receipts.version().clone()),
                app.code.limits.cancellation_limit,
                hyper::upgrade::on(req),
                permit,
            ))),
            Err(code) => Err((Outcome::Capacity, code, None)),
        },
    }
}

/// Refuses a WebSocket upgrade before admission; an invalid one says
/// which version Weir speaks (RFC 6455 §4.2.2).
pub(crate) fn refuse_socket(
    receipt: &Receipt,
    outcome: Outcome,
    code: SocketErrorCode,
    why: Option<&str>,
) -> Response<ServeBody> {
    use weir_runtime::WeirError;
    receipt.fail(
        outcome,
        None,
        Some(format!(
            "{}: {}",
            code.as_str(),
            why.unwrap_or("max_sockets, or the app's share of it, reached")
        )),
    );
    receipt.status(code.status());
    socket_refusal(code)
}

/// Weir's answer to an upgrade it refuses.
pub(crate) fn socket_refusal<B: From<bytes::Bytes>>(code: SocketErrorCode) -> Response<B> {
    let mut response: Response<B> = error_response(code);
    if code == SocketErrorCode::InvalidUpgrade {
        response.headers_mut().insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static(WEBSOCKET_VERSION),
        );
    }
    response
}
