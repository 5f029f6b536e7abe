//! Example app: a link shortener using all three of Weir's worker
//! capabilities — SQL for links, key-value for counters (the next code and
//! each link's hits), outbound HTTP to check a target before a link is made.
//!
//! | request | answer |
//! |---|---|
//! | `GET /` | 200, a one-line description |
//! | `POST /links` with a URL as body | 201 `{"code","url"}`; 422 if the target does not answer 2xx/3xx |
//! | `GET /<code>` | 302 to the link's URL (and one hit counted), or 404 |
//! | `GET /<code>/stats` | `{"code","url","hits"}`, or 404 |

use serde_json::json;
use wasi::http::outgoing_handler;
use wasi::http::types::{
    Fields, IncomingRequest, Method, OutgoingRequest, ResponseOutparam, Scheme,
};
use weir_guest::keyvalue::{atomics, store};
use weir_guest::sql::{self, stmt};

/// The SQL database and key-value store this app declares in weir.toml.
const DATABASE: &str = "links";
const COUNTERS: &str = "counters";

/// Longest URL accepted, in bytes.
const MAX_URL_BYTES: usize = 2048;

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS links (code TEXT PRIMARY KEY, url TEXT NOT NULL)";

struct Shortener;

fn respond(out: ResponseOutparam, status: u16, headers: &[(&str, &str)], body: &[u8]) {
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    weir_guest::http::respond(out, status, &headers, body);
}

fn json_response(out: ResponseOutparam, status: u16, value: serde_json::Value) {
    respond(
        out,
        status,
        &[("content-type", "application/json")],
        value.to_string().as_bytes(),
    );
}

/// Base-36 code of a row id.
fn code_of(mut id: i64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut code = Vec::new();
    loop {
        code.push(DIGITS[(id % 36) as usize]);
        id /= 36;
        if id == 0 {
            break;
        }
    }
    code.reverse();
    String::from_utf8(code).expect("ASCII digits")
}

/// Checks that `url` answers 2xx or 3xx to a HEAD request.
fn target_answers(url: &str) -> Result<u16, String> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (Scheme::Https, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (Scheme::Http, rest)
    } else {
        return Err("the URL must start with http:// or https://".into());
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let request = OutgoingRequest::new(Fields::new());
    request.set_method(&Method::Head).map_err(|_| "method")?;
    request.set_scheme(Some(&scheme)).map_err(|_| "scheme")?;
    request
        .set_authority(Some(authority))
        .map_err(|_| "bad host")?;
    request
        .set_path_with_query(Some(path))
        .map_err(|_| "bad path")?;
    let future = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    future.subscribe().block();
    match future.get() {
        Some(Ok(Ok(response))) if (200..400).contains(&response.status()) => Ok(response.status()),
        Some(Ok(Ok(response))) => Err(format!("the target answered {}", response.status())),
        Some(Ok(Err(e))) => Err(format!("{e:?}")),
        _ => Err("no answer".into()),
    }
}

fn create(request: &IncomingRequest, out: ResponseOutparam) {
    let url = String::from_utf8_lossy(&weir_guest::http::read_body(request, MAX_URL_BYTES + 1))
        .trim()
        .to_string();
    if url.is_empty() || url.len() > MAX_URL_BYTES {
        return json_response(out, 400, json!({ "error": "body must be a URL" }));
    }
    if let Err(reason) = target_answers(&url) {
        return json_response(
            out,
            422,
            json!({ "error": "target_unreachable", "reason": reason }),
        );
    }
    // A code is the base-36 form of the next value of an atomic counter, so
    // two concurrent creations never get the same code.
    let counters = match store::open(COUNTERS) {
        Ok(bucket) => bucket,
        Err(e) => return json_response(out, 500, json!({ "error": format!("{e:?}") })),
    };
    let code = match atomics::increment(&counters, "next-code", 1) {
        Ok(n) => code_of(n as i64),
        Err(e) => return json_response(out, 500, json!({ "error": format!("{e:?}") })),
    };
    if let Err(e) = sql::batch(
        DATABASE,
        &[
            stmt(SCHEMA, []),
            stmt(
                "INSERT INTO links (code, url) VALUES (?1, ?2)",
                [code.as_str().into(), url.as_str().into()],
            ),
        ],
    ) {
        return json_response(out, 500, json!({ "error": format!("{e:?}") }));
    }
    json_response(out, 201, json!({ "code": code, "url": url }))
}

fn lookup(code: &str) -> Result<Option<String>, String> {
    let results = sql::batch(
        DATABASE,
        &[
            stmt(SCHEMA, []),
            stmt("SELECT url FROM links WHERE code = ?1", [code.into()]),
        ],
    )
    .map_err(|e| format!("{e:?}"))?;
    Ok(results[1]
        .rows
        .first()
        .and_then(|row| row.first())
        .and_then(|v| v.as_str())
        .map(str::to_string))
}

impl wasi::exports::http::incoming_handler::Guest for Shortener {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let path = path.split('?').next().unwrap_or("").to_string();
        if matches!(request.method(), Method::Post) && path == "/links" {
            return create(&request, out);
        }
        if path == "/" {
            return respond(
                out,
                200,
                &[("content-type", "text/plain")],
                b"link shortener: POST /links\n",
            );
        }
        let (code, stats) = match path.trim_start_matches('/').split_once('/') {
            Some((code, "stats")) => (code.to_string(), true),
            None => (path.trim_start_matches('/').to_string(), false),
            Some(_) => return json_response(out, 404, json!({ "error": "not_found" })),
        };
        let url = match lookup(&code) {
            Ok(Some(url)) => url,
            Ok(None) => return json_response(out, 404, json!({ "error": "not_found" })),
            Err(e) => return json_response(out, 500, json!({ "error": e })),
        };
        let hits = match store::open(COUNTERS) {
            Ok(bucket) => bucket,
            Err(e) => return json_response(out, 500, json!({ "error": format!("{e:?}") })),
        };
        let key = format!("hits:{code}");
        if stats {
            let count = match hits.get(&key) {
                Ok(Some(bytes)) if bytes.len() == 8 => {
                    u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
                }
                Ok(_) => 0,
                Err(e) => return json_response(out, 500, json!({ "error": format!("{e:?}") })),
            };
            return json_response(out, 200, json!({ "code": code, "url": url, "hits": count }));
        }
        if let Err(e) = atomics::increment(&hits, &key, 1) {
            return json_response(out, 500, json!({ "error": format!("{e:?}") }));
        }
        respond(out, 302, &[("location", &url)], b"");
    }
}

wasi::http::proxy::export!(Shortener);
