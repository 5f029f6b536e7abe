//! The chat example's actor class: one actor per room. Each client is a
//! WebSocket the room owns, tagged with its user's name; Weir holds the
//! sockets while the room hibernates. Messages are kept in the room's
//! SQLite storage and the last 50 are replayed to whoever joins. Presence
//! comes from the sockets' tags. `ping` is answered by Weir itself (an
//! auto-response), so an idle tab's keepalive never wakes the room.
//!
//! Routes (under `/rooms/<room>`): `/?user=NAME` joins (an upgrade);
//! `/history` is the last 50 messages as JSON; `/departures` is every
//! socket whose end the room was told of, in order, with its close code
//! (JSON: `[[socket, code], …]`); `/echo` is an upgrade whose
//! socket gets back whatever it sends (for conformance runs and
//! benchmarks). `/?user=NAME&key=K` joins with a replacement key. A
//! message `/whoami` is answered with the socket's id, `/to ID TEXT` tries
//! to send TEXT to socket ID and says how it went. A message `trap!` makes its turn write, then trap, so its
//! write is rolled back: how the tests provoke a failing turn.

use serde_json::json;
use wasi::http::types::{IncomingRequest, ResponseOutparam};
use weir_guest::actor::storage;
use weir_guest::actor::Value;
use weir_guest::http::respond;
use weir_guest::websocket::actor as sockets;
use weir_guest::websocket::{CloseFrame, Error, Message};

/// Messages replayed to a client that joins.
const REPLAYED: i64 = 50;

struct Room;

fn query<'a>(path: &'a str, key: &str) -> Option<&'a str> {
    let (_, q) = path.split_once('?')?;
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then_some(v)
    })
}

fn schema() -> Result<(), String> {
    storage::exec(
        "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, user TEXT NOT NULL, text TEXT NOT NULL)",
        &[],
    )
    .map(|_| ())
    .map_err(|e| format!("{e:?}"))
}

fn history() -> Result<Vec<serde_json::Value>, String> {
    schema()?;
    let rows = storage::exec(
        "SELECT user, text FROM (SELECT id, user, text FROM messages ORDER BY id DESC LIMIT ?1) ORDER BY id",
        &[Value::Integer(REPLAYED)],
    )
    .map_err(|e| format!("{e:?}"))?;
    Ok(rows
        .rows
        .iter()
        .map(|row| {
            let text = |v: &Value| match v {
                Value::Text(t) => t.clone(),
                _ => String::new(),
            };
            json!({ "type": "message", "user": text(&row[0]), "text": text(&row[1]) })
        })
        .collect())
}

/// Who is here: the users tagged on the open sockets, once each.
fn presence() -> serde_json::Value {
    let mut users: Vec<String> = sockets::sockets(None)
        .iter()
        .flat_map(|s| s.tags.iter())
        .filter_map(|t| t.strip_prefix("user:").map(str::to_string))
        .collect();
    users.sort();
    users.dedup();
    json!({ "type": "presence", "users": users })
}

fn broadcast(event: &serde_json::Value) {
    let text = event.to_string();
    for socket in sockets::sockets(Some("chat")) {
        // A client that cannot keep up is closed by Weir (1008); the rest
        // still get the message.
        let _ = sockets::send_text(socket.id, &text);
    }
}

fn join(user: &str, key: Option<&str>) -> Result<u64, Error> {
    let id = sockets::accept(&["chat".to_string(), format!("user:{user}")], key, None)?;
    sockets::set_attachment(id, user.as_bytes())?;
    sockets::set_auto_response(Some(("ping", "pong")))?;
    for message in history().map_err(Error::Invalid)? {
        sockets::send_text(id, &message.to_string())?;
    }
    broadcast(&presence());
    Ok(id)
}

fn on_message(socket: u64, message: Message) -> Result<(), String> {
    let who = sockets::attachment(socket).map_err(|e| format!("{e:?}"))?;
    let Some(user) = who.and_then(|b| String::from_utf8(b).ok()) else {
        // An echo socket.
        return sockets::send(socket, &message).map_err(|e| format!("{e:?}"));
    };
    let Message::Text(text) = message else {
        return Ok(());
    };
    // Commands, answered to the sender only and not kept.
    if text == "/whoami" {
        return sockets::send_text(socket, &json!({ "type": "me", "socket": socket }).to_string())
            .map_err(|e| format!("{e:?}"));
    }
    if let Some(rest) = text.strip_prefix("/to ") {
        let (id, said) = rest.split_once(' ').unwrap_or((rest, ""));
        let result = match id.parse() {
            Ok(id) => format!("{:?}", sockets::send_text(id, said)),
            Err(_) => "not an id".to_string(),
        };
        return sockets::send_text(socket, &json!({ "type": "sent", "result": result }).to_string())
            .map_err(|e| format!("{e:?}"));
    }
    schema()?;
    storage::exec(
        "INSERT INTO messages (user, text) VALUES (?1, ?2)",
        &[Value::Text(user.clone()), Value::Text(text.clone())],
    )
    .map_err(|e| format!("{e:?}"))?;
    if text == "trap!" {
        panic!("a turn that traps after its write");
    }
    broadcast(&json!({ "type": "message", "user": user, "text": text }));
    Ok(())
}

fn departures_table() -> Result<(), String> {
    storage::exec(
        "CREATE TABLE IF NOT EXISTS departures (socket INTEGER NOT NULL, code INTEGER NOT NULL)",
        &[],
    )
    .map(|_| ())
    .map_err(|e| format!("{e:?}"))
}

fn departures() -> Result<serde_json::Value, String> {
    departures_table()?;
    let rows = storage::exec("SELECT socket, code FROM departures ORDER BY rowid", &[])
        .map_err(|e| format!("{e:?}"))?;
    let number = |v: &Value| match v {
        Value::Integer(i) => json!(i),
        _ => json!(null),
    };
    Ok(json!(rows
        .rows
        .iter()
        .map(|row| json!([number(&row[0]), number(&row[1])]))
        .collect::<Vec<_>>()))
}

fn on_close(socket: u64, close: CloseFrame) -> Result<(), String> {
    departures_table()?;
    storage::exec(
        "INSERT INTO departures (socket, code) VALUES (?1, ?2)",
        &[Value::Integer(socket as i64), Value::Integer(i64::from(close.code))],
    )
    .map_err(|e| format!("{e:?}"))?;
    broadcast(&presence());
    Ok(())
}

weir_guest::socket_handler!(on_message, on_close);

impl wasi::exports::http::incoming_handler::Guest for Room {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let route = path.split('?').next().unwrap_or("/");
        let json_header: &[(&str, &[u8])] = &[("content-type", b"application/json")];
        match route {
            "/history" => match history() {
                Ok(h) => respond(out, 200, json_header, json!(h).to_string().as_bytes()),
                Err(e) => respond(out, 500, json_header, json!({ "error": e }).to_string().as_bytes()),
            },
            "/departures" => match departures() {
                Ok(d) => respond(out, 200, json_header, d.to_string().as_bytes()),
                Err(e) => respond(out, 500, json_header, json!({ "error": e }).to_string().as_bytes()),
            },
            "/echo" => match sockets::accept(&["echo".to_string()], None, None) {
                Ok(_) => drop(out),
                Err(e) => respond(out, 400, &[], format!("{e:?}\n").as_bytes()),
            },
            "/" => {
                let user = query(&path, "user").filter(|u| !u.is_empty()).unwrap_or("anonymous");
                match join(user, query(&path, "key")) {
                    Ok(_) => drop(out),
                    Err(Error::NotAnUpgrade) => {
                        respond(out, 426, &[], b"join with a WebSocket\n")
                    }
                    Err(e) => respond(out, 400, &[], format!("{e:?}\n").as_bytes()),
                }
            }
            _ => respond(out, 404, &[], b"no such path\n"),
        }
    }
}

wasi::http::proxy::export!(Room);
