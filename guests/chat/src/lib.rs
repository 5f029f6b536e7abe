//! The chat example's worker: serves the page. The rooms are actors of
//! class `room` (guests/chat-room), reached by the page at
//! `/rooms/<room>/?user=<name>` over a WebSocket.

use wasi::http::types::{IncomingRequest, ResponseOutparam};
use weir_guest::http::respond;

const PAGE: &[u8] = include_bytes!("page.html");

struct Chat;

impl wasi::exports::http::incoming_handler::Guest for Chat {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        match path.split('?').next().unwrap_or("/") {
            "/" => respond(out, 200, &[("content-type", b"text/html; charset=utf-8")], PAGE),
            _ => respond(out, 404, &[], b"no such page\n"),
        }
    }
}

wasi::http::proxy::export!(Chat);
