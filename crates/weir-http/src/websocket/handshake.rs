//! The opening handshake (RFC 6455 §4.2): which requests ask for a
//! WebSocket, which of those are valid, and the 101 that accepts one.
//!
//! Invariant owned here: a request that names `websocket` in `Upgrade` is
//! either a valid version-13 handshake (GET, HTTP/1.1, `Connection:
//! upgrade`, a key of 16 bytes in base64) or refused as `invalid_upgrade`
//! with the reason; a request that does not name it is plain HTTP.

use base64::Engine;
use http::{HeaderMap, HeaderValue, Method, Request, Version, header};

/// The only protocol version Weir speaks (RFC 6455).
pub const WEBSOCKET_VERSION: &str = "13";

/// Subprotocols a client may offer in one handshake: more is not a real
/// client, and each is echoed to the guest.
pub const MAX_OFFERED_PROTOCOLS: usize = 16;

/// A valid handshake: what the accept needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// `Sec-WebSocket-Key`, as sent.
    pub key: String,
    /// `Sec-WebSocket-Protocol`, in the client's order.
    pub protocols: Vec<String>,
}

/// What a request is, as far as WebSockets go.
#[derive(Debug, PartialEq, Eq)]
pub enum Upgrade {
    /// Not a WebSocket request.
    No,
    /// A valid opening handshake.
    Valid(Handshake),
    /// It asks for a WebSocket, wrongly: why.
    Invalid(&'static str),
}

/// True when a comma-separated header holds `token` (case-insensitive).
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Reads the handshake of `req`.
pub fn inspect<B>(req: &Request<B>) -> Upgrade {
    let headers = req.headers();
    if !has_token(headers, header::UPGRADE, "websocket") {
        return Upgrade::No;
    }
    if req.method() != Method::GET {
        return Upgrade::Invalid("a WebSocket handshake must be a GET");
    }
    if req.version() != Version::HTTP_11 {
        return Upgrade::Invalid("a WebSocket handshake must be HTTP/1.1");
    }
    if !has_token(headers, header::CONNECTION, "upgrade") {
        return Upgrade::Invalid("a WebSocket handshake must say `Connection: upgrade`");
    }
    match headers.get(header::SEC_WEBSOCKET_VERSION) {
        Some(v) if v.as_bytes() == WEBSOCKET_VERSION.as_bytes() => {}
        _ => return Upgrade::Invalid("Sec-WebSocket-Version must be 13"),
    }
    let key = match headers.get(header::SEC_WEBSOCKET_KEY).map(|k| k.to_str()) {
        Some(Ok(key)) => key.trim(),
        _ => return Upgrade::Invalid("Sec-WebSocket-Key is missing"),
    };
    match base64::engine::general_purpose::STANDARD.decode(key) {
        Ok(nonce) if nonce.len() == 16 => {}
        _ => return Upgrade::Invalid("Sec-WebSocket-Key must be 16 bytes in base64"),
    }
    let protocols: Vec<String> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    if protocols.len() > MAX_OFFERED_PROTOCOLS {
        return Upgrade::Invalid("more than 16 subprotocols offered");
    }
    Upgrade::Valid(Handshake {
        key: key.to_string(),
        protocols,
    })
}

impl Handshake {
    /// The 101 head that accepts this handshake with `protocol`.
    pub fn accept(&self, protocol: Option<&str>) -> http::response::Builder {
        let accept =
            tokio_tungstenite::tungstenite::handshake::derive_accept_key(self.key.as_bytes());
        let mut builder = http::Response::builder()
            .status(http::StatusCode::SWITCHING_PROTOCOLS)
            .header(header::CONNECTION, HeaderValue::from_static("upgrade"))
            .header(header::UPGRADE, HeaderValue::from_static("websocket"))
            .header(header::SEC_WEBSOCKET_ACCEPT, accept);
        if let Some(protocol) = protocol {
            builder = builder.header(header::SEC_WEBSOCKET_PROTOCOL, protocol);
        }
        builder
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(edit: impl FnOnce(http::request::Builder) -> http::request::Builder) -> Request<()> {
        let builder = Request::get("/chat")
            .header("upgrade", "websocket")
            .header("connection", "keep-alive, Upgrade")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
        edit(builder).body(()).unwrap()
    }

    #[test]
    fn the_rfc_example_is_valid_and_accepted_with_its_digest() {
        let Upgrade::Valid(handshake) = inspect(&request(|b| {
            b.header("sec-websocket-protocol", "chat, superchat")
        })) else {
            panic!("valid")
        };
        assert_eq!(handshake.protocols, ["chat", "superchat"]);
        let response = handshake.accept(Some("chat")).body(()).unwrap();
        assert_eq!(response.status(), 101);
        // RFC 6455 §1.3's worked example.
        assert_eq!(
            response.headers()["sec-websocket-accept"],
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        assert_eq!(response.headers()["sec-websocket-protocol"], "chat");
    }

    #[test]
    fn each_wrong_part_is_refused_with_its_reason() {
        let plain = Request::get("/").body(()).unwrap();
        assert_eq!(inspect(&plain), Upgrade::No);
        let cases: [(http::request::Builder, &str); 4] = [
            (
                Request::post("/")
                    .header("upgrade", "websocket")
                    .header("connection", "upgrade"),
                "GET",
            ),
            (
                Request::get("/").header("upgrade", "WebSocket"),
                "Connection: upgrade",
            ),
            (
                Request::get("/")
                    .header("upgrade", "websocket")
                    .header("connection", "upgrade")
                    .header("sec-websocket-version", "8"),
                "must be 13",
            ),
            (
                Request::get("/")
                    .header("upgrade", "websocket")
                    .header("connection", "upgrade")
                    .header("sec-websocket-version", "13")
                    .header("sec-websocket-key", "c2hvcnQ="),
                "16 bytes",
            ),
        ];
        for (builder, why) in cases {
            match inspect(&builder.body(()).unwrap()) {
                Upgrade::Invalid(reason) => assert!(reason.contains(why), "{reason} vs {why}"),
                other => panic!("{other:?} for {why}"),
            }
        }
        let no_key = request(|b| b).into_parts().0;
        let mut headers = no_key.headers.clone();
        headers.remove("sec-websocket-key");
        let mut req = Request::get("/").body(()).unwrap();
        *req.headers_mut() = headers;
        assert_eq!(
            inspect(&req),
            Upgrade::Invalid("Sec-WebSocket-Key is missing")
        );
    }
}
