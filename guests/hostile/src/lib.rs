//! The hostile guest: a tenant that tries every door the host opens, so
//! that Weir's confinement is tested from outside with a real component.
//! It runs as the app (a worker) and as the `hostile` actor class.
//!
//! | path | attack |
//! |---|---|
//! | `POST /sql[?after_headers=1]` | the body's JSON `{"db": "...", "statements": ["...", ...]}` as one `weir:sql` batch; answers `{"rows": [...]}` or `{"error": "..."}` (with `after_headers`, sends its headers first and runs the batch while its body is open: under the session's deadline) |
//! | `POST /exec` | (actor) the body's JSON list of statements through `storage.exec`, one after another; answers each result or error |
//! | `GET /list?limit=N` | (actor) `storage.list`; answers the count of entries or the error |
//! | `POST /put-big?n=N&bytes=B` | (actor) N entries of B bytes (fills storage for the list attacks) |
//! | `GET /fetch?url=U` | an outbound GET of `U`; answers its status and body, or the error |
//! | `GET /raw?authority=A&path=P` | an outbound GET with an authority built by hand (ports, user info, extra labels) |
//! | `POST /grow?mb=N` | allocates and keeps N MiB of linear memory |
//! | `GET /recurse` | calls itself until its stack runs out |
//! | `GET /bodies?n=N&kb=K` | makes N responses it never sends, writes K KiB into each one's body and keeps them |
//! | `GET /fields?n=N&kb=K&values=V` | makes N header maps the host holds, each with V values (default 1) of K KiB, and keeps them |
//! | `GET /blob?mb=N` | answers N MiB |
//! | `GET /hoard?n=N&mb=M&name=A` | calls actor A's (default `blob`) `/blob?mb=M` N times and keeps each response, its body unread |
//! | `GET /names?n=N&prefix=P` | calls `/hello` of N made-up hostile actors `P0`, `P1`, … (each call makes an actor); answers each status and the first refusal's body |
//! | `GET /relay?via=A,B,…` | (actor) calls actor A's `/relay?via=B,…`; the last answers `"end"`; answers `{status, body}` of its call |
//! | `GET /kv?cursor=C` | `list-keys` of store `main` from cursor C |
//! | `GET /print?kb=N` | writes N KiB of lines to its standard error |
//! | `POST /say?stream=S` | writes the body, as it is, to its standard error (or standard output with `S=stdout`): a forged log line, a line cut short, control bytes |
//! | `GET /hello` | a harmless answer: proves the server still serves |
//! | `GET /ws?tags=N&tag_bytes=B&key_bytes=K&attachment=A&auto=R&trap=1` | (actor, an upgrade) accepts with N tags of B bytes (and a replacement key of K bytes), then sets an attachment of A bytes and an auto-response whose request is R bytes (and with `trap`, then traps); a refused accept is answered 400 with `{"accept": error}`, an accepted socket gets `{"attachment": result, "auto": result}` as its first message and then answers each message with the bytes of the attachment it holds, but for these, which fail their turn after an effect: `attach:N:trap` sets an attachment of N bytes, `auto:trap` sets the auto-response `auto-ping` → `auto-pong`, `write-close-trap` writes `closed` and closes the socket with 1000 `bye`; each then traps; and `sleep:N…` (padding after the digits) takes N ms and answers nothing. Each `on-close` adds a byte to the entry `closes` |

use std::cell::RefCell;

use serde_json::{json, Value as Json};
use wasi::http::types::{IncomingRequest, ResponseOutparam};
use weir_guest::http::{read_body, respond};

struct Hostile;

thread_local! {
    static HOARD: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

const MAX_BODY: usize = 1 << 20;

fn query<'a>(path: &'a str, name: &str) -> Option<&'a str> {
    let (_, q) = path.split_once('?')?;
    q.split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn json_out(out: ResponseOutparam, value: Json) {
    respond(
        out,
        200,
        &[("content-type", b"application/json")],
        value.to_string().as_bytes(),
    );
}

fn sql_value(v: &weir_guest::sql::Value) -> Json {
    use weir_guest::sql::Value;
    match v {
        Value::Null => Json::Null,
        Value::Integer(i) => json!(i),
        Value::Real(r) => json!(r),
        Value::Text(t) => json!(t),
        Value::Blob(b) => json!({ "blob_bytes": b.len() }),
    }
}

fn actor_value(v: &weir_guest::actor::Value) -> Json {
    use weir_guest::actor::Value;
    match v {
        Value::Null => Json::Null,
        Value::Integer(i) => json!(i),
        Value::Real(r) => json!(r),
        Value::Text(t) => json!(t),
        Value::Blob(b) => json!({ "blob_bytes": b.len() }),
    }
}

/// Calls itself until the stack runs out. Not a tail call, so no call
/// becomes a jump; its frame is in Wasm locals, not in the shadow stack of
/// linear memory, so what it exhausts is the engine's stack for Wasm.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    if std::hint::black_box(depth) == u64::MAX {
        return depth;
    }
    recurse(depth + 1).wrapping_add(std::hint::black_box(depth))
}

/// One GET of `/blob?mb=MB` on `authority`: its response, body unread.
fn hoard_one(authority: &str, mb: usize) -> Result<wasi::http::types::IncomingResponse, String> {
    use wasi::http::types::{Fields, OutgoingRequest, Scheme};
    let request = OutgoingRequest::new(Fields::new());
    request.set_scheme(Some(&Scheme::Http)).map_err(|()| "scheme")?;
    request.set_authority(Some(authority)).map_err(|()| "authority")?;
    request
        .set_path_with_query(Some(&format!("/blob?mb={mb}")))
        .map_err(|()| "path")?;
    let future = wasi::http::outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    future.subscribe().block();
    match future.get() {
        Some(Ok(Ok(response))) => Ok(response),
        Some(Ok(Err(e))) => Err(format!("{e:?}")),
        other => Err(format!("{other:?}")),
    }
}

fn get(authority: &str, path: &str) -> Json {
    match weir_guest::http::send("GET", authority, path, b"") {
        Ok(reply) => json!({
            "status": reply.status,
            "body": String::from_utf8_lossy(&reply.body),
        }),
        Err(e) => json!({ "error": e }),
    }
}

impl wasi::exports::http::incoming_handler::Guest for Hostile {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let route = path.split('?').next().unwrap_or("").to_string();
        match route.as_str() {
            "/hello" => json_out(out, json!("still here")),
            "/say" => {
                use std::io::Write;
                let bytes = read_body(&request, MAX_BODY);
                let written = if query(&path, "stream") == Some("stdout") {
                    std::io::stdout().write_all(&bytes)
                } else {
                    std::io::stderr().write_all(&bytes)
                };
                json_out(out, json!({ "said": bytes.len(), "ok": written.is_ok() }))
            }
            "/print" => {
                use std::io::Write;
                let kb: usize = query(&path, "kb").and_then(|v| v.parse().ok()).unwrap_or(1);
                let line = format!("{}\n", "x".repeat(1023));
                let mut err = std::io::stderr();
                for _ in 0..kb {
                    let _ = err.write_all(line.as_bytes());
                }
                json_out(out, json!({ "printed_kb": kb }))
            }
            "/sql" => {
                let input: Json =
                    serde_json::from_slice(&read_body(&request, MAX_BODY)).unwrap_or_default();
                let statements: Vec<_> = input["statements"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|s| weir_guest::sql::stmt(s.as_str().unwrap_or_default(), []))
                            .collect()
                    })
                    .unwrap_or_default();
                let db = input["db"].as_str().unwrap_or("app");
                let run = || match weir_guest::sql::batch(db, &statements) {
                    Ok(results) => json!({
                        "rows": results
                            .iter()
                            .map(|r| r.rows.iter().map(|row| row.iter().map(sql_value).collect::<Vec<_>>()).collect::<Vec<_>>())
                            .collect::<Vec<_>>(),
                    }),
                    Err(e) => json!({ "error": format!("{e:?}") }),
                };
                if query(&path, "after_headers").is_some() {
                    // Headers first: the batch then runs under the
                    // session's deadline, not the event's.
                    use wasi::http::types::{Fields, OutgoingBody, OutgoingResponse};
                    let response = OutgoingResponse::new(Fields::new());
                    let body = response.body().expect("body once");
                    ResponseOutparam::set(out, Ok(response));
                    let answer = run().to_string();
                    let stream = body.write().expect("stream once");
                    for chunk in answer.as_bytes().chunks(4096) {
                        if stream.blocking_write_and_flush(chunk).is_err() {
                            return;
                        }
                    }
                    drop(stream);
                    let _ = OutgoingBody::finish(body, None);
                } else {
                    json_out(out, run())
                }
            }
            "/exec" => {
                let input: Json =
                    serde_json::from_slice(&read_body(&request, MAX_BODY)).unwrap_or_default();
                let mut answers = Vec::new();
                for sql in input.as_array().cloned().unwrap_or_default() {
                    let sql = sql.as_str().unwrap_or_default().to_string();
                    answers.push(match weir_guest::actor::storage::exec(&sql, &[]) {
                        Ok(r) => json!({
                            "rows": r.rows.iter().map(|row| row.iter().map(actor_value).collect::<Vec<_>>()).collect::<Vec<_>>(),
                        }),
                        Err(e) => json!({ "error": format!("{e:?}") }),
                    });
                }
                json_out(out, Json::Array(answers))
            }
            "/list" => {
                let limit = query(&path, "limit").and_then(|v| v.parse().ok());
                let options = weir_guest::actor::ListOptions {
                    start: None,
                    end: None,
                    prefix: None,
                    reverse: false,
                    limit,
                };
                let answer = match weir_guest::actor::storage::list(&options) {
                    Ok(entries) => json!({ "entries": entries.len() }),
                    Err(e) => json!({ "error": format!("{e:?}") }),
                };
                json_out(out, answer)
            }
            "/put-big" => {
                let n: usize = query(&path, "n").and_then(|v| v.parse().ok()).unwrap_or(1);
                let bytes: usize = query(&path, "bytes")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1);
                let mut answer = json!({ "put": n });
                for i in 0..n {
                    if let Err(e) =
                        weir_guest::actor::storage::put(&format!("big:{i:06}"), &vec![7u8; bytes])
                    {
                        answer = json!({ "error": format!("{e:?}") });
                        break;
                    }
                }
                json_out(out, answer)
            }
            "/fill" => {
                // An actor turn that writes a mark, fills its storage until
                // a write is refused, then writes another mark.
                let bytes: usize = query(&path, "bytes")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(20_000);
                let put = weir_guest::actor::storage::put::<Vec<u8>>;
                let before = put("mark:a", &b"a".to_vec());
                let mut filled = 0u32;
                let mut refused = None;
                while filled < 100_000 {
                    match put(&format!("fill:{filled:06}"), &vec![7u8; bytes]) {
                        Ok(()) => filled += 1,
                        Err(e) => {
                            refused = Some(format!("{e:?}"));
                            break;
                        }
                    }
                }
                let after = put("mark:b", &b"b".to_vec());
                json_out(
                    out,
                    json!({
                        "before": format!("{before:?}"),
                        "filled": filled,
                        "refused": refused,
                        "after": format!("{after:?}"),
                    }),
                )
            }
            "/get" => {
                let key = query(&path, "key").unwrap_or_default();
                let answer = match weir_guest::actor::storage::get_bytes(key) {
                    Ok(value) => json!({ "bytes": value.map(|v| v.len()) }),
                    Err(e) => json!({ "error": format!("{e:?}") }),
                };
                json_out(out, answer)
            }
            "/kv-fill" => {
                // A worker that fills its key-value store until a write is
                // refused (`delete` first frees a key, `n` caps the writes).
                let bytes: usize = query(&path, "bytes")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(20_000);
                let n: u32 = query(&path, "n")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(100_000);
                let answer = match weir_guest::keyvalue::store::open("main") {
                    Ok(bucket) => {
                        let deleted =
                            query(&path, "delete").map(|key| format!("{:?}", bucket.delete(key)));
                        let mut filled = 0u32;
                        let mut refused = None;
                        while filled < n {
                            let key =
                                format!("fill:{}:{filled:06}", query(&path, "tag").unwrap_or(""));
                            match bucket.set(&key, &vec![7u8; bytes]) {
                                Ok(()) => filled += 1,
                                Err(e) => {
                                    refused = Some(format!("{e:?}"));
                                    break;
                                }
                            }
                        }
                        json!({ "deleted": deleted, "filled": filled, "refused": refused })
                    }
                    Err(e) => json!({ "error": format!("{e:?}") }),
                };
                json_out(out, answer)
            }
            "/storm" => {
                // Arms an alarm that re-arms itself for "now", forever.
                let answer = match weir_guest::actor::timers::schedule(
                    "storm",
                    weir_guest::actor::timers::now_ms(),
                ) {
                    Ok(()) => json!("storming"),
                    Err(e) => json!({ "error": format!("{e:?}") }),
                };
                json_out(out, answer)
            }
            "/storm-runs" => {
                let runs: Option<u64> =
                    weir_guest::actor::storage::get("storm-runs").ok().flatten();
                json_out(out, json!({ "runs": runs }))
            }
            "/fetch" => {
                let url = query(&path, "url").unwrap_or_default();
                let rest = url.strip_prefix("http://").unwrap_or(url);
                let (authority, p) = match rest.find('/') {
                    Some(i) => (&rest[..i], &rest[i..]),
                    None => (rest, "/"),
                };
                json_out(out, get(authority, p))
            }
            "/raw" => {
                let authority = query(&path, "authority").unwrap_or_default().to_string();
                let p = query(&path, "path").unwrap_or("/").to_string();
                json_out(out, get(&authority, &p))
            }
            "/grow" => {
                let mb: usize = query(&path, "mb").and_then(|v| v.parse().ok()).unwrap_or(1);
                HOARD.with(|h| h.borrow_mut().push(vec![1u8; mb << 20]));
                json_out(out, json!({ "grew_mb": mb }))
            }
            "/fields" => {
                // Header maps held by the host, each with VALUES values
                // (default 1) of KB KiB, kept until the instance ends.
                // Many empty values make the host hold far more than
                // their bytes: each is an entry of the host's map.
                let n: usize = query(&path, "n").and_then(|v| v.parse().ok()).unwrap_or(1);
                let kb: usize = query(&path, "kb").and_then(|v| v.parse().ok()).unwrap_or(0);
                let values: usize = query(&path, "values").and_then(|v| v.parse().ok()).unwrap_or(1);
                let value = vec![b'x'; kb << 10];
                let entries = vec![("x-fill".to_string(), value); values];
                let mut made = 0;
                let mut refused = None;
                for _ in 0..n {
                    match wasi::http::types::Fields::from_list(&entries) {
                        Ok(fields) => {
                            std::mem::forget(fields);
                            made += 1;
                        }
                        Err(e) => {
                            refused = Some(format!("{e:?}"));
                            break;
                        }
                    }
                }
                json_out(out, json!({ "made": made, "refused": refused }))
            }
            "/bodies" => {
                // Responses never sent, each with KB KiB written into its
                // body (buffered by the host), kept until the instance ends.
                let n: usize = query(&path, "n").and_then(|v| v.parse().ok()).unwrap_or(1);
                let kb: usize = query(&path, "kb").and_then(|v| v.parse().ok()).unwrap_or(64);
                let chunk = vec![b'x'; kb << 10];
                let mut made = 0;
                let mut refused = None;
                for _ in 0..n {
                    use wasi::http::types::{Fields, OutgoingResponse};
                    let response = OutgoingResponse::new(Fields::new());
                    let Ok(body) = response.body() else { break };
                    let Ok(stream) = body.write() else { break };
                    if let Err(e) = stream.write(&chunk) {
                        refused = Some(format!("{e:?}"));
                        break;
                    }
                    std::mem::forget((response, body, stream));
                    made += 1;
                }
                json_out(out, json!({ "made": made, "refused": refused }))
            }
            "/blob" => {
                // A response of MB MiB (as an actor: what an internal call
                // hands its caller).
                let mb: usize = query(&path, "mb").and_then(|v| v.parse().ok()).unwrap_or(1);
                json_out(out, json!("x".repeat(mb << 20)))
            }
            "/hoard" => {
                // N calls to actor NAME's `/blob?mb=MB`, each response kept
                // with its body unread until the instance ends.
                let n: usize = query(&path, "n").and_then(|v| v.parse().ok()).unwrap_or(1);
                let mb: usize = query(&path, "mb").and_then(|v| v.parse().ok()).unwrap_or(1);
                let name = query(&path, "name").unwrap_or("blob").to_string();
                let mut kept = 0;
                let mut refused = None;
                for _ in 0..n {
                    match hoard_one(&format!("{name}.hostile.actor.internal"), mb) {
                        Ok(response) => {
                            std::mem::forget(response);
                            kept += 1;
                        }
                        Err(e) => {
                            refused = Some(e);
                            break;
                        }
                    }
                }
                json_out(out, json!({ "kept": kept, "refused": refused }))
            }
            "/names" => {
                // One call to each of N actors that do not exist yet.
                let n: usize = query(&path, "n").and_then(|v| v.parse().ok()).unwrap_or(1);
                let prefix = query(&path, "prefix").unwrap_or("n").to_string();
                let mut statuses = Vec::new();
                let mut refusal = None;
                for i in 0..n {
                    let reply = get(&format!("{prefix}{i}.hostile.actor.internal"), "/hello");
                    if reply["status"] != 200 && refusal.is_none() {
                        refusal = Some(reply["body"].clone());
                    }
                    statuses.push(reply["status"].clone());
                }
                json_out(out, json!({ "statuses": statuses, "refusal": refusal }))
            }
            "/relay" => {
                // Calls the first actor of `via` with the rest; the last
                // one answers `end`. A name that is already on the way is
                // a call back into the chain.
                let via = query(&path, "via").unwrap_or("");
                let answer = match via.split_once(',').unwrap_or((via, "")) {
                    ("", _) => json!("end"),
                    (next, rest) => get(
                        &format!("{next}.hostile.actor.internal"),
                        &format!("/relay?via={rest}"),
                    ),
                };
                json_out(out, answer)
            }
            "/recurse" => {
                let depth = recurse(0);
                json_out(out, json!({ "depth": depth }))
            }
            "/kv" => {
                let cursor = query(&path, "cursor").and_then(|v| v.parse().ok());
                let answer = match weir_guest::keyvalue::store::open("main") {
                    Ok(bucket) => match bucket.list_keys(cursor) {
                        Ok(page) => json!({ "keys": page.keys.len(), "cursor": page.cursor }),
                        Err(e) => json!({ "error": format!("{e:?}") }),
                    },
                    Err(e) => json!({ "error": format!("{e:?}") }),
                };
                json_out(out, answer)
            }
            "/ws" => socket_limits(&path, out),
            _ => respond(out, 404, &[], b"no such attack"),
        }
    }
}

/// Tries each limit of an actor's socket from inside: tags, key,
/// attachment and auto-response of the sizes the query asks for.
fn socket_limits(path: &str, out: ResponseOutparam) {
    use weir_guest::websocket::actor as sockets;
    let number = |name: &str| query(path, name).and_then(|v| v.parse::<usize>().ok());
    let tags: Vec<String> = (0..number("tags").unwrap_or(0))
        .map(|i| {
            char::from(b'a' + (i % 26) as u8)
                .to_string()
                .repeat(number("tag_bytes").unwrap_or(1))
        })
        .collect();
    let key = number("key_bytes").map(|k| "k".repeat(k));
    let id = match sockets::accept(&tags, key.as_deref(), None) {
        Ok(id) => id,
        Err(e) => {
            let body = json!({ "accept": format!("{e:?}") }).to_string();
            return respond(
                out,
                400,
                &[("content-type", b"application/json")],
                body.as_bytes(),
            );
        }
    };
    drop(out);
    let attachment =
        number("attachment").map(|a| format!("{:?}", sockets::set_attachment(id, &vec![7u8; a])));
    let auto = number("auto").map(|r| {
        format!(
            "{:?}",
            sockets::set_auto_response(Some((&"p".repeat(r), "pong")))
        )
    });
    let _ = sockets::send_text(
        id,
        &json!({ "attachment": attachment, "auto": auto }).to_string(),
    );
    if query(path, "trap").is_some() {
        panic!("the accepting turn traps");
    }
}

/// Each message is answered with the size of the attachment its socket
/// holds: what a refused `set-attachment` left in place. Some messages
/// make an effect and then fail their turn (see the module's table).
fn on_message(socket: u64, message: weir_guest::websocket::Message) -> Result<(), String> {
    use weir_guest::websocket::actor as sockets;
    let text = match &message {
        weir_guest::websocket::Message::Text(t) => t.as_str(),
        _ => "",
    };
    if let Some(n) = text
        .strip_prefix("attach:")
        .and_then(|rest| rest.strip_suffix(":trap"))
        .and_then(|n| n.parse::<usize>().ok())
    {
        sockets::set_attachment(socket, &vec![7u8; n]).map_err(|e| format!("{e:?}"))?;
        panic!("a turn that set an attachment traps");
    }
    // `sleep:N…` (anything after the digits is padding): a slow turn.
    if let Some(rest) = text.strip_prefix("sleep:") {
        let ms: u64 = rest
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap_or(0);
        wasi::clocks::monotonic_clock::subscribe_duration(ms * 1_000_000).block();
        return Ok(());
    }
    if text == "auto:trap" {
        sockets::set_auto_response(Some(("auto-ping", "auto-pong")))
            .map_err(|e| format!("{e:?}"))?;
        panic!("a turn that set an auto-response traps");
    }
    if text == "write-close-trap" {
        weir_guest::actor::storage::put("closed", &vec![1u8]).map_err(|e| format!("{e:?}"))?;
        sockets::close(socket, 1000, "bye").map_err(|e| format!("{e:?}"))?;
        panic!("a turn that closed its socket traps");
    }
    let held = sockets::attachment(socket).map_err(|e| format!("{e:?}"))?;
    let answer = json!({ "attachment_bytes": held.map(|a| a.len()) }).to_string();
    sockets::send_text(socket, &answer).map_err(|e| format!("{e:?}"))
}

/// Counts the ends it is told of, a byte each.
fn on_close(_socket: u64, _close: weir_guest::websocket::CloseFrame) -> Result<(), String> {
    use weir_guest::actor::storage;
    let mut closes = storage::get_bytes("closes")
        .map_err(|e| format!("{e:?}"))?
        .unwrap_or_default();
    closes.push(1);
    storage::put("closes", &closes).map_err(|e| format!("{e:?}"))
}

weir_guest::socket_handler!(on_message, on_close);

wasi::http::proxy::export!(Hostile);

/// An alarm that counts its runs and re-arms itself for "now": a turn
/// storm, as fast as Weir lets it go.
fn storm() -> Result<Option<u64>, String> {
    let runs: u64 = weir_guest::actor::storage::get("storm-runs")
        .map_err(|e| format!("{e:?}"))?
        .unwrap_or(0);
    weir_guest::actor::storage::put("storm-runs", &(runs + 1)).map_err(|e| format!("{e:?}"))?;
    Ok(Some(weir_guest::actor::timers::now_ms()))
}

weir_guest::alarms! {
    "storm" => storm,
}
