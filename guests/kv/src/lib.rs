//! The key-value test guest: exposes `wasi:keyvalue` over HTTP so tests can
//! drive stores from outside.
//!
//! | path | behaviour |
//! |---|---|
//! | `PUT /kv/set?store=S&key=K` | sets K to the request body |
//! | `GET /kv/get?store=S&key=K` | the value, or 404 |
//! | `POST /kv/incr?store=S&key=K&delta=D` | atomic increment; answers the new value |
//! | `GET /kv/list?store=S&cursor=C` | one page of keys, one per line; `x-cursor` names the next page |
//! | `GET /kv/open?store=S` | `ok`, or the error |
//!
//! Query values are percent-decoded, so keys may hold any UTF-8. A key too
//! long for a URI may come in an `x-key` header instead.

use wasi::http::types::{IncomingRequest, ResponseOutparam};
use weir_guest::http::respond;
use weir_guest::keyvalue::{atomics, store};

struct Kv;

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(path: &str, name: &str) -> Option<String> {
    let (_, q) = path.split_once('?')?;
    q.split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| percent_decode(v))
}

fn read_body(request: &IncomingRequest) -> Vec<u8> {
    weir_guest::http::read_body(request, usize::MAX)
}

impl wasi::exports::http::incoming_handler::Guest for Kv {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let route = path.split('?').next().unwrap_or("").to_string();
        let store_name = query(&path, "store").unwrap_or_default();
        let key = request
            .headers()
            .get("x-key")
            .first()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .or_else(|| query(&path, "key"))
            .unwrap_or_default();
        let bucket = match store::open(&store_name) {
            Ok(bucket) => bucket,
            Err(e) => return respond(out, 500, &[], format!("{e:?}").as_bytes()),
        };
        let result: Result<(u16, Vec<(String, Vec<u8>)>, Vec<u8>), store::Error> =
            match route.as_str() {
                "/kv/open" => Ok((200, vec![], b"ok".to_vec())),
                "/kv/set" => {
                    let value = read_body(&request);
                    bucket
                        .set(&key, &value)
                        .map(|()| (200, vec![], b"ok".to_vec()))
                }
                "/kv/get" => bucket.get(&key).map(|v| match v {
                    Some(v) => (200, vec![], v),
                    None => (404, vec![], b"no such key".to_vec()),
                }),
                "/kv/incr" => {
                    let delta = query(&path, "delta")
                        .and_then(|d| d.parse().ok())
                        .unwrap_or(1);
                    atomics::increment(&bucket, &key, delta)
                        .map(|n| (200, vec![], n.to_string().into_bytes()))
                }
                "/kv/list" => {
                    let cursor = query(&path, "cursor").and_then(|c| c.parse().ok());
                    bucket.list_keys(cursor).map(|page| {
                        let mut headers = vec![];
                        if let Some(c) = page.cursor {
                            headers.push(("x-cursor".to_string(), c.to_string().into_bytes()));
                        }
                        (200, headers, page.keys.join("\n").into_bytes())
                    })
                }
                _ => Ok((404, vec![], b"no such route".to_vec())),
            };
        match result {
            Ok((status, headers, body)) => {
                let headers: Vec<(&str, &[u8])> = headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_slice()))
                    .collect();
                respond(out, status, &headers, &body)
            }
            Err(e) => respond(out, 500, &[], format!("{e:?}").as_bytes()),
        }
    }
}

wasi::http::proxy::export!(Kv);
