//! A worker that holds WebSockets, for tests and benchmarks. By path:
//!
//! - `/echo`: sends back every message until the client closes (the
//!   Autobahn fuzzing client runs against this one);
//! - `/echo?protocol=P`: the same, agreeing on subprotocol `P`;
//! - `/close?code=C&reason=R`: accepts, then closes with `C` and `R`;
//! - `/trap-after?n=N`: echoes `N` messages, then traps;
//! - `/spin-after?n=N`: echoes `N` messages, then loops forever;
//! - `/return-after?n=N`: echoes `N` messages, then returns with the
//!   socket still open;
//! - `/flood?kb=K`: sends K KiB messages as fast as the client takes them,
//!   forever (a client that stops reading meets the send queue);
//! - `/hold`: accepts and waits for messages, answering none;
//! - `/send-over?bytes=N`: sends a binary message of `N` bytes, then one
//!   of `N - 1`, and reports what each send returned as a text message
//!   (`N` one over `max_socket_message_bytes` is refused, the socket
//!   stays open), then echoes;
//! - `/refuse`: does not accept; answers 403 itself;
//! - `/bad-close`: tries close codes that may not be sent, and reports what
//!   Weir said as a text message, then closes with 1000;
//! - anything else: a plain 200 that says whether an upgrade was offered.

use wasi::http::types::{IncomingRequest, ResponseOutparam};
use weir_guest::http::respond;
use weir_guest::websocket::{self, Error, Incoming, Message, Websocket};

struct Sockets;

fn query<'a>(path: &'a str, key: &str) -> Option<&'a str> {
    let (_, q) = path.split_once('?')?;
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then_some(v)
    })
}

/// Echoes until the client closes, or `limit` messages.
fn echo(socket: &Websocket, limit: Option<u64>) {
    let mut n = 0;
    while limit.is_none_or(|l| n < l) {
        match socket.receive() {
            Ok(Incoming::Message(m)) => {
                if socket.send(&m).is_err() {
                    return;
                }
            }
            Ok(Incoming::Close(_)) | Err(_) => return,
        }
        n += 1;
    }
}

impl wasi::exports::http::incoming_handler::Guest for Sockets {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let route = path.split('?').next().unwrap_or("/").to_string();
        let n = query(&path, "n").and_then(|n| n.parse().ok());
        if route == "/refuse" {
            respond(out, 403, &[], b"not you\n");
            return;
        }
        let protocol = query(&path, "protocol").map(str::to_string);
        let socket = match websocket::accept(protocol.as_deref()) {
            Ok(socket) => socket,
            Err(Error::NotAnUpgrade) => {
                let offered = websocket::offered().is_some();
                respond(out, 200, &[], format!("upgrade offered: {offered}\n").as_bytes());
                return;
            }
            Err(e) => {
                respond(out, 400, &[], format!("{e:?}\n").as_bytes());
                return;
            }
        };
        // The 101 went out in place of this response.
        drop(out);
        match route.as_str() {
            "/echo" => echo(&socket, None),
            "/close" => {
                let code = query(&path, "code").and_then(|c| c.parse().ok()).unwrap_or(1000);
                let reason = query(&path, "reason").unwrap_or("").to_string();
                socket.close(code, &reason).expect("a sendable close");
                // The client's reply ends it.
                while socket.receive().is_ok() {}
            }
            "/trap-after" => {
                echo(&socket, n);
                panic!("trapping mid-socket");
            }
            "/spin-after" => {
                echo(&socket, n);
                let mut x: u64 = 0;
                loop {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
            "/return-after" => echo(&socket, n),
            "/flood" => {
                let kb = query(&path, "kb").and_then(|k| k.parse().ok()).unwrap_or(64);
                let chunk = Message::Binary(vec![b'x'; kb * 1024]);
                while socket.send(&chunk).is_ok() {}
            }
            "/hold" => while let Ok(Incoming::Message(_)) = socket.receive() {},
            "/send-over" => {
                let bytes: usize = query(&path, "bytes").and_then(|b| b.parse().ok()).unwrap_or(0);
                let over = socket.send(&Message::Binary(vec![1; bytes]));
                let under = socket.send(&Message::Binary(vec![2; bytes.saturating_sub(1)]));
                let _ = socket.send(&Message::Text(format!("{over:?}\n{under:?}")));
                echo(&socket, None);
            }
            "/bad-close" => {
                let mut said = Vec::new();
                for code in [1005u16, 1006, 1015, 2000, 5000] {
                    said.push(format!("{code}:{:?}", socket.close(code, "")));
                }
                said.push(format!("long:{:?}", socket.close(1000, &"x".repeat(124))));
                let _ = socket.send(&Message::Text(said.join("\n")));
                let _ = socket.close(1000, "done");
                while socket.receive().is_ok() {}
            }
            _ => {
                let _ = socket.close(1003, "no such route");
                while socket.receive().is_ok() {}
            }
        }
    }
}

wasi::http::proxy::export!(Sockets);
