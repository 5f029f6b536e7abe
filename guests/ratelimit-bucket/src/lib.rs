//! The example's actor class: one token bucket per client (the actor's
//! name). Each `POST /take` refills the bucket for the time that passed,
//! then takes a token if there is one. State lives in the actor's storage,
//! so a restart of the server forgets nothing; a `forget` timer clears a
//! bucket that has been left alone long enough to be full again.

use wasi::http::types::{IncomingRequest, ResponseOutparam};
use weir_guest::actor::{storage, timers};
use weir_guest::http::respond;

/// Tokens a bucket holds when full.
const CAPACITY: f64 = 5.0;
/// Tokens added per second: five a minute.
const REFILL_PER_SECOND: f64 = 5.0 / 60.0;
/// A bucket untouched this long is full again; its storage is cleared.
const FORGET_AFTER_MS: u64 = 60_000;

struct Bucket;

fn take() -> Result<(u16, serde_json::Value), weir_guest::actor::Error> {
    let now = timers::now_ms();
    let tokens: f64 = storage::get("tokens")?.unwrap_or(CAPACITY);
    let last: u64 = storage::get("last_ms")?.unwrap_or(now);
    let refilled =
        (tokens + (now.saturating_sub(last) as f64 / 1000.0) * REFILL_PER_SECOND).min(CAPACITY);
    let (allowed, left) = if refilled >= 1.0 {
        (true, refilled - 1.0)
    } else {
        (false, refilled)
    };
    storage::put("tokens", &left)?;
    storage::put("last_ms", &now)?;
    // Earliest-wins keeps an existing deadline; move it later explicitly.
    timers::cancel("forget")?;
    timers::schedule("forget", now + FORGET_AFTER_MS)?;
    let body = if allowed {
        serde_json::json!({ "allowed": true, "remaining": left.floor() as u64 })
    } else {
        let wait_ms = ((1.0 - left) / REFILL_PER_SECOND * 1000.0).ceil() as u64;
        serde_json::json!({ "allowed": false, "retry_after_ms": wait_ms })
    };
    Ok((if allowed { 200 } else { 429 }, body))
}

impl wasi::exports::http::incoming_handler::Guest for Bucket {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let (status, body) = match path.as_str() {
            "/take" => match take() {
                Ok(answer) => answer,
                Err(e) => (500, serde_json::json!({ "error": format!("{e:?}") })),
            },
            _ => (404, serde_json::json!({ "error": "no such path" })),
        };
        respond(
            out,
            status,
            &[("content-type", b"application/json")],
            body.to_string().as_bytes(),
        );
    }
}

wasi::http::proxy::export!(Bucket);

fn forget() -> Result<Option<u64>, String> {
    storage::delete_all().map_err(|e| format!("{e:?}"))?;
    Ok(None)
}

weir_guest::alarms! {
    "forget" => forget,
}
