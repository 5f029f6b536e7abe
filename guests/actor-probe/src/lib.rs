//! The test actor: one actor class whose paths exercise every part of the
//! actor contract from outside — turns, storage limits, SQL, traps, the
//! output gate, timers and incarnations.
//!
//! | path | behaviour |
//! |---|---|
//! | `POST /incr` | n = n + 1 in storage; answers n |
//! | `GET /get?key=K` | the value of K, or 404 |
//! | `POST /pair?i=N&gap_ms=G` | writes `x:N`, says `pair N: x written` on stderr, waits G ms, writes `y:N`, in one turn (crash tests) |
//! | `GET /pairs` | every N with `x:N`, and every N with `y:N` (JSON) |
//! | `POST /gate?port=P` | writes `gate`, then GETs `http://127.0.0.1:P/`; answers its body |
//! | `POST /put?key=K` | stores the body under K; 413 with the error when too large |
//! | `POST /put-many?n=N&bytes=B&big=I` | N entries `many:<i>` of B bytes in one call; entry I (if given) is one byte over the entry limit |
//! | `POST /write-then-trap` | writes `trapped`, then traps |
//! | `POST /sync-then-trap` | writes `before`, syncs, writes `after`, traps |
//! | `POST /store-then-trap?kv=S&key=K` or `?sql=D&key=K` | writes `store-mark`, then sets key K of key-value store S to `stored` (or inserts K into table `from_actor` of database D), writes `store-after`, traps; 500 with the store's error if it refuses |
//! | `GET /store-read?kv=S&key=K` or `?sql=D&key=K` | key K of store S (404 when unset), or how many rows of table `from_actor` of database D are K |
//! | `POST /fk-violation` | writes `fk`, then leaves a deferred foreign key broken |
//! | `POST /sql` | runs the body as one statement; JSON result or 400 with the error |
//! | `GET /whoami` | class, name, incarnation, pid base (JSON) |
//! | `POST /sleep?ms=N` | says `sleeping N ms` on stderr, then sleeps N ms inside the turn |
//! | `POST /schedule?reason=R&in_ms=N` | schedules R (or the body's text, when it has one) N ms from now (may be negative) |
//! | `POST /flaky?for_ms=N` | alarm `flaky` traps until N ms from now, then succeeds |
//! | `POST /callout?port=P&for_ms=N` | alarm `callout` counts its runs (`callout-runs`), GETs `http://127.0.0.1:P/` (a commit point), then errs until N ms from now; schedules it now |
//! | `POST /commit-fails?for_ms=N` | alarm `commit-fails` leaves a deferred foreign key broken (its commit fails) until N ms from now; schedules it now and `tick` 50 ms later |
//! | `POST /dispatch?first=R` | schedules alarm R and then `victim` 10 ms later, both already due, in one turn (R: `cancels-victim` or `moves-victim`) |
//! | `GET /timers` | the actor's timers (JSON) |
//! | `GET /log` | what alarm handlers recorded, in order (JSON) |
//! | `POST /loop` | spins forever |
//! | `POST /large?bytes=N` | writes `large`, answers N bytes |
//! | `POST /memory` | counts in instance memory only; answers the count |
//! | `POST /grow?mb=N` | allocates and keeps N MiB |
//! | `ANY /echo?status=S` | counts the run (`echoes`), answers S (default 200) with the request as JSON (method, path, headers in order, body as bytes), `x-echo-count` and two `set-cookie` headers |
//!
//! Alarm handlers: `tick` logs; `rearm` logs and re-arms itself 150 ms
//! later, three times; `self-now` logs and schedules itself for "now"
//! (twice in all); `flaky` traps until its window ends; `always-fails`
//! errs; `callout` and `commit-fails` as their paths say, logging once
//! they succeed; `cancels-victim` logs and cancels `victim`;
//! `moves-victim` logs and moves `victim` an hour later; `victim` logs;
//! `other` is not handled (ignored).

use std::time::Duration;

use wasi::http::types::{IncomingRequest, ResponseOutparam};
use weir_guest::actor::{self, storage, timers, Error, Value};
use weir_guest::http::{read_body, respond};

struct Probe;

thread_local! {
    /// State that lives in the instance only: gone with its generation.
    static IN_MEMORY: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static HOARD: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

const MAX_BODY: usize = 4 << 20;

fn query<'a>(path: &'a str, name: &str) -> Option<&'a str> {
    let (_, q) = path.split_once('?')?;
    q.split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn text(out: ResponseOutparam, status: u16, body: &str) {
    respond(
        out,
        status,
        &[("content-type", b"text/plain")],
        body.as_bytes(),
    );
}

fn json(out: ResponseOutparam, value: serde_json::Value) {
    respond(
        out,
        200,
        &[("content-type", b"application/json")],
        value.to_string().as_bytes(),
    );
}

fn error_status(e: &Error) -> u16 {
    match e {
        Error::EntryTooLarge(_) => 413,
        Error::Refused(_) => 403,
        Error::Failed(_) => 400,
        Error::CommitFailed(_) => 503,
        Error::NotAnActor => 500,
    }
}

fn value_json(v: &Value) -> serde_json::Value {
    match v {
        Value::Null => serde_json::Value::Null,
        Value::Integer(i) => (*i).into(),
        Value::Real(r) => (*r).into(),
        Value::Text(t) => t.clone().into(),
        Value::Blob(b) => b.len().into(),
    }
}

/// Appends a line to the alarm log (`log:<seq>`).
fn log(line: &str) -> Result<(), Error> {
    let seq: u64 = storage::get("log-seq")?.unwrap_or(0) + 1;
    storage::put("log-seq", &seq)?;
    storage::put(&format!("log:{seq:08}"), &line.to_string())
}

fn handle(request: &IncomingRequest, path: &str) -> Result<(u16, String), Error> {
    let route = path.split('?').next().unwrap_or("");
    Ok(match route {
        "/incr" => {
            let n: u64 = storage::get("n")?.unwrap_or(0) + 1;
            storage::put("n", &n)?;
            (200, n.to_string())
        }
        "/get" => {
            let key = query(path, "key").unwrap_or("n");
            match storage::get::<String>(key)? {
                Some(v) => (200, v),
                None => (404, String::new()),
            }
        }
        "/pair" => {
            let i = query(path, "i").unwrap_or("0");
            let gap_ms: u64 = query(path, "gap_ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            storage::put(&format!("x:{i}"), &i.to_string())?;
            // Said on stderr (a `weir::guest` line), so that a test knows
            // the turn is in its gap.
            eprintln!("pair {i}: x written");
            if gap_ms > 0 {
                wasi::clocks::monotonic_clock::subscribe_duration(gap_ms * 1_000_000).block();
            }
            storage::put(&format!("y:{i}"), &i.to_string())?;
            (200, i.to_string())
        }
        "/pairs" => {
            let numbers = |prefix: &str| -> Result<Vec<u64>, Error> {
                let mut n: Vec<u64> = storage::list_prefix(prefix)?
                    .into_iter()
                    .filter_map(|(k, _)| k[prefix.len()..].parse().ok())
                    .collect();
                n.sort_unstable();
                Ok(n)
            };
            (
                200,
                serde_json::json!({ "x": numbers("x:")?, "y": numbers("y:")? }).to_string(),
            )
        }
        "/gate" => {
            let port = query(path, "port").unwrap_or("80");
            storage::put("gate", &1u64)?;
            let seen = match weir_guest::http::send("GET", &format!("127.0.0.1:{port}"), "/", b"") {
                Ok(reply) => String::from_utf8_lossy(&reply.body).into_owned(),
                Err(e) => format!("fetch failed: {e}"),
            };
            (200, seen)
        }
        "/put" => {
            let key = query(path, "key").unwrap_or("k");
            let body = read_body(request, MAX_BODY);
            storage::put(key, &body)?;
            (200, body.len().to_string())
        }
        "/put-many" => {
            let n: usize = query(path, "n").and_then(|v| v.parse().ok()).unwrap_or(2);
            let bytes: usize = query(path, "bytes")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1);
            let big: Option<usize> = query(path, "big").and_then(|v| v.parse().ok());
            let entries: Vec<(String, Vec<u8>)> = (0..n)
                .map(|i| {
                    let key = format!("many:{i}");
                    let size = if big == Some(i) {
                        actor::MAX_ENTRY_BYTES + 1 - key.len()
                    } else {
                        bytes
                    };
                    (key, vec![b'm'; size])
                })
                .collect();
            storage::put_many(&entries)?;
            (200, n.to_string())
        }
        "/write-then-trap" => {
            storage::put("trapped", &1u64)?;
            panic!("trap after a write");
        }
        "/sync-then-trap" => {
            storage::put("before", &1u64)?;
            storage::sync()?;
            storage::put("after", &1u64)?;
            panic!("trap after a sync");
        }
        "/store-then-trap" => {
            let key = query(path, "key").unwrap_or("from-actor");
            storage::put("store-mark", &"before".to_string())?;
            let stored = if let Some(store) = query(path, "kv") {
                weir_guest::keyvalue::store::open(store)
                    .and_then(|bucket| bucket.set(key, b"stored"))
                    .map_err(|e| format!("{e:?}"))
            } else {
                let db = query(path, "sql").unwrap_or("app");
                weir_guest::sql::batch(
                    db,
                    &[
                        weir_guest::sql::stmt("CREATE TABLE IF NOT EXISTS from_actor (v TEXT)", []),
                        weir_guest::sql::stmt(
                            "INSERT INTO from_actor VALUES (?1)",
                            [weir_guest::sql::Value::Text(key.to_string())],
                        ),
                    ],
                )
                .map(|_| ())
                .map_err(|e| format!("{e:?}"))
            };
            if let Err(e) = stored {
                return Ok((500, e));
            }
            storage::put("store-after", &"after".to_string())?;
            panic!("trap after a store write");
        }
        "/store-read" => {
            let key = query(path, "key").unwrap_or("from-actor");
            let read = if let Some(store) = query(path, "kv") {
                weir_guest::keyvalue::store::open(store)
                    .and_then(|bucket| bucket.get(key))
                    .map(|v| match v {
                        Some(v) => (200, String::from_utf8_lossy(&v).into_owned()),
                        None => (404, String::new()),
                    })
                    .map_err(|e| format!("{e:?}"))
            } else {
                let db = query(path, "sql").unwrap_or("app");
                weir_guest::sql::batch(
                    db,
                    &[
                        weir_guest::sql::stmt("CREATE TABLE IF NOT EXISTS from_actor (v TEXT)", []),
                        weir_guest::sql::stmt(
                            "SELECT count(*) FROM from_actor WHERE v = ?1",
                            [weir_guest::sql::Value::Text(key.to_string())],
                        ),
                    ],
                )
                .map(|results| {
                    let n = results[1].rows[0][0].as_i64().unwrap_or(-1);
                    (200, n.to_string())
                })
                .map_err(|e| format!("{e:?}"))
            };
            match read {
                Ok(answer) => answer,
                Err(e) => (500, e),
            }
        }
        "/fk-violation" => {
            storage::exec(
                "CREATE TABLE IF NOT EXISTS parent (id INTEGER PRIMARY KEY)",
                &[],
            )?;
            storage::exec(
                "CREATE TABLE IF NOT EXISTS child (p INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)",
                &[],
            )?;
            storage::put("fk", &1u64)?;
            storage::exec("INSERT INTO child (p) VALUES (42)", &[])?;
            (200, "written".into())
        }
        "/sql" => {
            let sql = String::from_utf8(read_body(request, MAX_BODY)).unwrap_or_default();
            let r = storage::exec(&sql, &[])?;
            let rows: Vec<Vec<serde_json::Value>> = r
                .rows
                .iter()
                .map(|row| row.iter().map(value_json).collect())
                .collect();
            (
                200,
                serde_json::json!({
                    "columns": r.columns,
                    "rows": rows,
                    "rows_read": r.rows_read,
                    "rows_written": r.rows_written,
                })
                .to_string(),
            )
        }
        "/whoami" => {
            let me = actor::me();
            (
                200,
                serde_json::json!({
                    "class": me.class,
                    "name": me.name,
                    "incarnation": me.incarnation,
                    "pid_base": me.pid_base,
                    // `actor-probe` or `actor-probe-next`: the same source
                    // built twice, for class deploys.
                    "build": env!("CARGO_PKG_NAME"),
                })
                .to_string(),
            )
        }
        "/sleep" => {
            let ms: u64 = query(path, "ms").and_then(|v| v.parse().ok()).unwrap_or(10);
            // Said on stderr, so that a test knows the turn holds the actor.
            eprintln!("sleeping {ms} ms");
            wasi::clocks::monotonic_clock::subscribe_duration(ms * 1_000_000).block();
            storage::put("slept", &ms)?;
            (200, ms.to_string())
        }
        "/schedule" => {
            // The reason is the body's when it has one (any text a guest
            // may choose), else the query's.
            let body = read_body(request, MAX_BODY);
            let reason = if body.is_empty() {
                query(path, "reason").unwrap_or("tick").to_string()
            } else {
                String::from_utf8_lossy(&body).into_owned()
            };
            let reason = reason.as_str();
            let in_ms: i64 = query(path, "in_ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let at = (timers::now_ms() as i64 + in_ms).max(0) as u64;
            timers::schedule(reason, at)?;
            (200, at.to_string())
        }
        "/flaky" => {
            let for_ms: u64 = query(path, "for_ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1000);
            storage::put("flaky-until", &(timers::now_ms() + for_ms))?;
            timers::schedule("flaky", timers::now_ms())?;
            (200, String::new())
        }
        "/callout" => {
            let port: u64 = query(path, "port").and_then(|v| v.parse().ok()).unwrap_or(80);
            let for_ms: u64 = query(path, "for_ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1000);
            storage::put("callout-port", &port)?;
            storage::put("callout-until", &(timers::now_ms() + for_ms))?;
            timers::schedule("callout", timers::now_ms())?;
            (200, String::new())
        }
        "/commit-fails" => {
            let for_ms: u64 = query(path, "for_ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1000);
            storage::put("commit-fails-until", &(timers::now_ms() + for_ms))?;
            timers::schedule("commit-fails", timers::now_ms())?;
            timers::schedule("tick", timers::now_ms() + 50)?;
            (200, String::new())
        }
        "/dispatch" => {
            let first = query(path, "first").unwrap_or("cancels-victim");
            let now = timers::now_ms();
            timers::schedule(first, now - 20)?;
            timers::schedule("victim", now - 10)?;
            (200, String::new())
        }
        "/timers" => {
            let list: Vec<serde_json::Value> = timers::list()?
                .into_iter()
                .map(|t| serde_json::json!({"reason": t.reason, "at_ms": t.at_ms, "attempt": t.attempt}))
                .collect();
            (200, serde_json::Value::from(list).to_string())
        }
        "/log" => {
            let lines: Vec<String> = storage::list_prefix("log:")?
                .into_iter()
                .map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
                .collect();
            (200, serde_json::Value::from(lines).to_string())
        }
        "/large" => {
            let bytes: usize = query(path, "bytes")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1);
            storage::put("large", &bytes)?;
            (200, "x".repeat(bytes))
        }
        "/memory" => {
            let n = IN_MEMORY.with(|c| {
                c.set(c.get() + 1);
                c.get()
            });
            (200, n.to_string())
        }
        "/grow" => {
            let mb: usize = query(path, "mb").and_then(|v| v.parse().ok()).unwrap_or(1);
            HOARD.with(|h| h.borrow_mut().push(vec![1u8; mb << 20]));
            (200, mb.to_string())
        }
        "/loop" => loop {
            std::hint::black_box(0);
        },
        _ => (404, "no such path".into()),
    })
}

impl wasi::exports::http::incoming_handler::Guest for Probe {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        if path == "/no-response" {
            // Returns without setting a response.
            drop(out);
            return;
        }
        if path.split('?').next() == Some("/echo") {
            echo(&request, &path, out);
            return;
        }
        match handle(&request, &path) {
            Ok((200, body)) if body.starts_with('{') || body.starts_with('[') => {
                json(out, serde_json::from_str(&body).unwrap_or_default())
            }
            Ok((status, body)) => text(out, status, &body),
            Err(e) => text(out, error_status(&e), &e.to_string()),
        }
    }
}

wasi::http::proxy::export!(Probe);

/// The request as the actor saw it, and how many times `/echo` ran.
fn echo(request: &IncomingRequest, path: &str, out: ResponseOutparam) {
    let count = (|| -> Result<u64, Error> {
        let n: u64 = storage::get("echoes")?.unwrap_or(0) + 1;
        storage::put("echoes", &n)?;
        Ok(n)
    })();
    let count = match count {
        Ok(n) => n,
        Err(e) => return text(out, error_status(&e), &e.to_string()),
    };
    let method = match request.method() {
        wasi::http::types::Method::Get => "GET".to_string(),
        wasi::http::types::Method::Post => "POST".to_string(),
        wasi::http::types::Method::Put => "PUT".to_string(),
        wasi::http::types::Method::Delete => "DELETE".to_string(),
        wasi::http::types::Method::Patch => "PATCH".to_string(),
        wasi::http::types::Method::Head => "HEAD".to_string(),
        wasi::http::types::Method::Options => "OPTIONS".to_string(),
        wasi::http::types::Method::Connect => "CONNECT".to_string(),
        wasi::http::types::Method::Trace => "TRACE".to_string(),
        wasi::http::types::Method::Other(o) => o,
    };
    let headers: Vec<(String, Vec<u8>)> = request.headers().entries();
    let body = read_body(request, MAX_BODY);
    let status: u16 = query(path, "status")
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let seen = serde_json::json!({
        "method": method,
        "path": path,
        "headers": headers,
        "body": body,
        "count": count,
    });
    let count = count.to_string();
    respond(
        out,
        status,
        &[
            ("content-type", b"application/json"),
            ("x-echo-count", count.as_bytes()),
            ("set-cookie", b"a=1"),
            ("set-cookie", b"b=2"),
        ],
        seen.to_string().as_bytes(),
    );
}

fn tick() -> Result<Option<u64>, String> {
    log(&format!("tick@{}", timers::now_ms())).map_err(|e| e.to_string())?;
    Ok(None)
}

fn rearm() -> Result<Option<u64>, String> {
    let n: u64 = storage::get("rearm-count")
        .map_err(|e| e.to_string())?
        .unwrap_or(0)
        + 1;
    storage::put("rearm-count", &n).map_err(|e| e.to_string())?;
    log(&format!("rearm#{n}")).map_err(|e| e.to_string())?;
    Ok((n < 3).then(|| timers::now_ms() + Duration::from_millis(150).as_millis() as u64))
}

fn self_now() -> Result<Option<u64>, String> {
    let n: u64 = storage::get("self-now-count")
        .map_err(|e| e.to_string())?
        .unwrap_or(0)
        + 1;
    storage::put("self-now-count", &n).map_err(|e| e.to_string())?;
    log(&format!(
        "self-now#{n}@incarnation{}",
        actor::me().incarnation
    ))
    .map_err(|e| e.to_string())?;
    if n < 2 {
        // Due at once, but not part of the dispatch that is running now.
        timers::schedule("self-now", timers::now_ms()).map_err(|e| e.to_string())?;
    }
    Ok(None)
}

fn flaky() -> Result<Option<u64>, String> {
    let until: u64 = storage::get("flaky-until")
        .map_err(|e| e.to_string())?
        .unwrap_or(0);
    if timers::now_ms() < until {
        panic!("flaky alarm traps until its window ends");
    }
    log(&format!("flaky@{}", timers::now_ms())).map_err(|e| e.to_string())?;
    Ok(None)
}

fn always_fails() -> Result<Option<u64>, String> {
    Err("always-fails never succeeds".into())
}

/// Counts its run, calls out (which commits the turn's writes so far, its
/// timer's taking among them), then fails until its window ends.
fn callout() -> Result<Option<u64>, String> {
    let e = |e: Error| e.to_string();
    let runs: u64 = storage::get("callout-runs").map_err(e)?.unwrap_or(0) + 1;
    storage::put("callout-runs", &runs).map_err(e)?;
    let port: u64 = storage::get("callout-port").map_err(e)?.unwrap_or(80);
    weir_guest::http::send("GET", &format!("127.0.0.1:{port}"), "/", b"")
        .map_err(|e| format!("the call out failed: {e}"))?;
    let until: u64 = storage::get("callout-until").map_err(e)?.unwrap_or(0);
    if timers::now_ms() < until {
        return Err(format!("run {runs} fails after calling out"));
    }
    log(&format!("callout@{}", timers::now_ms())).map_err(e)?;
    Ok(None)
}

/// Leaves a deferred foreign key broken, so its turn's commit fails, until
/// its window ends.
fn commit_fails() -> Result<Option<u64>, String> {
    let e = |e: Error| e.to_string();
    let until: u64 = storage::get("commit-fails-until").map_err(e)?.unwrap_or(0);
    if timers::now_ms() < until {
        storage::exec(
            "CREATE TABLE IF NOT EXISTS parent (id INTEGER PRIMARY KEY)",
            &[],
        )
        .map_err(e)?;
        storage::exec(
            "CREATE TABLE IF NOT EXISTS child (p INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)",
            &[],
        )
        .map_err(e)?;
        storage::exec("INSERT INTO child (p) VALUES (42)", &[]).map_err(e)?;
        return Ok(None);
    }
    log(&format!("commit-fails@{}", timers::now_ms())).map_err(e)?;
    Ok(None)
}

fn cancels_victim() -> Result<Option<u64>, String> {
    timers::cancel("victim").map_err(|e| e.to_string())?;
    log("cancels-victim").map_err(|e| e.to_string())?;
    Ok(None)
}

fn moves_victim() -> Result<Option<u64>, String> {
    timers::cancel("victim").map_err(|e| e.to_string())?;
    timers::schedule("victim", timers::now_ms() + 3_600_000).map_err(|e| e.to_string())?;
    log("moves-victim").map_err(|e| e.to_string())?;
    Ok(None)
}

fn victim() -> Result<Option<u64>, String> {
    log(&format!("victim@{}", timers::now_ms())).map_err(|e| e.to_string())?;
    Ok(None)
}

weir_guest::alarms! {
    "tick" => tick,
    "rearm" => rearm,
    "self-now" => self_now,
    "flaky" => flaky,
    "always-fails" => always_fails,
    "callout" => callout,
    "commit-fails" => commit_fails,
    "cancels-victim" => cancels_victim,
    "moves-victim" => moves_victim,
    "victim" => victim,
}
