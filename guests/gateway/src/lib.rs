//! A worker that forwards `/<class>/<name>/<rest>` to actor `name` of
//! `class` (`http://<name>.<class>.actor.internal/<rest>`), with the method,
//! query and body, and answers with the actor's status, content type and
//! body. Tests and benchmarks reach actors through it, as an app would.

use wasi::http::types::{IncomingRequest, Method, ResponseOutparam};
use weir_guest::http::{read_body, respond};

/// Bodies forwarded to actors are bounded by the server's own request limit;
/// this only bounds what the gateway reads.
const MAX_BODY: usize = 8 << 20;

/// Response headers passed back from the actor.
const FORWARDED: &[&str] = &["content-type", "cache-control", "x-content-type-options"];

struct Gateway;

fn method_name(m: &Method) -> String {
    match m {
        Method::Get => "GET".into(),
        Method::Post => "POST".into(),
        Method::Put => "PUT".into(),
        Method::Delete => "DELETE".into(),
        Method::Head => "HEAD".into(),
        Method::Patch => "PATCH".into(),
        Method::Options => "OPTIONS".into(),
        Method::Connect => "CONNECT".into(),
        Method::Trace => "TRACE".into(),
        Method::Other(o) => o.clone(),
    }
}

impl wasi::exports::http::incoming_handler::Guest for Gateway {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let mut parts = path.trim_start_matches('/').splitn(3, '/');
        let (Some(class), Some(name)) = (parts.next(), parts.next()) else {
            respond(out, 404, &[], b"use /<class>/<name>/<path>\n");
            return;
        };
        let rest = format!("/{}", parts.next().unwrap_or(""));
        let method = method_name(&request.method());
        let body = read_body(&request, MAX_BODY);
        match weir_guest::actor::call(class, name, &method, &rest, &body) {
            Ok(reply) => {
                let headers: Vec<(&str, &[u8])> = reply
                    .headers
                    .iter()
                    .filter(|(k, _)| FORWARDED.contains(&k.as_str()))
                    .map(|(k, v)| (k.as_str(), v.as_slice()))
                    .collect();
                respond(out, reply.status, &headers, &reply.body)
            }
            Err(e) => respond(out, 502, &[("x-call-error", e.as_bytes())], e.as_bytes()),
        }
    }
}

wasi::http::proxy::export!(Gateway);
