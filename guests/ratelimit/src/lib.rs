//! The example's worker: every request is rate limited per client (the
//! `x-client-id` header, or `anonymous`) by asking that client's `bucket`
//! actor for a token. Allowed requests are answered; the rest get 429 with
//! `retry-after`.

use wasi::http::types::{IncomingRequest, ResponseOutparam};
use weir_guest::http::respond;

struct RateLimit;

/// Client ids become actor names: lowercase letters, digits, `-`, `_`, `.`.
fn client_id(request: &IncomingRequest) -> String {
    let raw = request
        .headers()
        .get("x-client-id")
        .into_iter()
        .next()
        .map(|v| String::from_utf8_lossy(&v).to_ascii_lowercase())
        .unwrap_or_default();
    let clean: String = raw
        .chars()
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_'))
        .take(64)
        .collect();
    if clean.is_empty() {
        "anonymous".into()
    } else {
        clean
    }
}

impl wasi::exports::http::incoming_handler::Guest for RateLimit {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let client = client_id(&request);
        let reply = match weir_guest::actor::call("bucket", &client, "POST", "/take", b"") {
            Ok(reply) => reply,
            Err(e) => {
                respond(
                    out,
                    502,
                    &[],
                    format!("rate limiter unreachable: {e}\n").as_bytes(),
                );
                return;
            }
        };
        let verdict: serde_json::Value = serde_json::from_slice(&reply.body).unwrap_or_default();
        match reply.status {
            200 => {
                let body = format!(
                    "hello {client}: {} requests left\n",
                    verdict["remaining"].as_u64().unwrap_or(0)
                );
                respond(
                    out,
                    200,
                    &[("content-type", b"text/plain")],
                    body.as_bytes(),
                );
            }
            429 => {
                let wait_ms = verdict["retry_after_ms"].as_u64().unwrap_or(1000);
                let seconds = wait_ms.div_ceil(1000).to_string();
                respond(
                    out,
                    429,
                    &[
                        ("content-type", b"text/plain"),
                        ("retry-after", seconds.as_bytes()),
                    ],
                    format!("slow down, {client}\n").as_bytes(),
                );
            }
            // Weir's own errors (actor_overloaded, …) pass through as they are.
            status => respond(
                out,
                status,
                &[("content-type", b"application/json")],
                &reply.body,
            ),
        }
    }
}

wasi::http::proxy::export!(RateLimit);
