//! The envelope: how a call travels between nodes. A forwarded request
//! carries the whole of the caller's request — method, URI, every header
//! in order (repeated ones kept apart), body — and its target; the answer
//! carries the whole response, or says that the call did not run there.
//!
//! Invariant owned here: the envelope is Weir's, not the guest's. Nothing a
//! guest or a client can put in a header or a body can make one answer
//! look like another (a response that says "not owner" is a different
//! envelope, not a header a guest could set), and decoding refuses
//! anything truncated, oversized or left over.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use weir_actors::OperatorCall;
use weir_actors::call_chain::MAX_CALL_DEPTH;

/// Headers one envelope carries at most: far more than any request's head
/// limit lets through.
pub const MAX_HEADERS: usize = 4096;

/// What a forwarded call is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A call to actor `name` of `class` of `app`, with the actors whose
    /// turns wait on it, outermost first (`weir_actors::call_chain`).
    Actor {
        app: String,
        class: String,
        name: String,
        chain: Vec<(String, String)>,
    },
    /// A key-value call to store `store` of `app` (the request's body is
    /// the call, see [`crate::store_wire`]).
    Kv { app: String, store: String },
    /// A SQL batch for database `database` of `app`.
    Sql { app: String, database: String },
    /// An operator's call about actor `name` of `class` of `app` (the
    /// request is empty; the answer is a `weir_actors::OperatorAnswer`).
    Operator {
        app: String,
        class: String,
        name: String,
        call: OperatorCall,
    },
}

impl Target {
    /// The oldest call version ([`crate::call_versions`]) that carries
    /// this target.
    pub fn since(&self) -> u32 {
        match self {
            Target::Actor { .. } | Target::Kv { .. } | Target::Sql { .. } => 2,
            Target::Operator { .. } => 3,
        }
    }
}

const ACTOR: u8 = 1;
const KV: u8 = 2;
const SQL: u8 = 3;
const OPERATOR: u8 = 4;
const INSPECT: u8 = 1;
const INSPECT_FROM: u8 = 2;
const DELETE: u8 = 3;
const DROP_COPY: u8 = 4;
const ANSWERED: u8 = 0;
const NOT_RUN: u8 = 1;

/// Why an envelope could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed envelope: {0}")]
pub struct Malformed(pub &'static str);

fn put_str16(out: &mut BytesMut, s: &[u8]) -> Result<(), Malformed> {
    let len = u16::try_from(s.len()).map_err(|_| Malformed("a name over 64 KiB"))?;
    out.put_u16(len);
    out.put_slice(s);
    Ok(())
}

fn put_bytes32(out: &mut BytesMut, s: &[u8]) -> Result<(), Malformed> {
    let len = u32::try_from(s.len()).map_err(|_| Malformed("a value over 4 GiB"))?;
    out.put_u32(len);
    out.put_slice(s);
    Ok(())
}

fn put_headers(out: &mut BytesMut, headers: &HeaderMap) -> Result<(), Malformed> {
    if headers.len() > MAX_HEADERS {
        return Err(Malformed("too many headers"));
    }
    out.put_u32(headers.len() as u32);
    for (name, value) in headers {
        put_str16(out, name.as_str().as_bytes())?;
        put_bytes32(out, value.as_bytes())?;
    }
    Ok(())
}

fn take(buf: &mut Bytes, n: usize) -> Result<Bytes, Malformed> {
    if buf.remaining() < n {
        return Err(Malformed("truncated"));
    }
    Ok(buf.split_to(n))
}

fn get_u8(buf: &mut Bytes) -> Result<u8, Malformed> {
    Ok(take(buf, 1)?[0])
}

fn get_u16(buf: &mut Bytes) -> Result<u16, Malformed> {
    Ok(take(buf, 2)?.get_u16())
}

fn get_u32(buf: &mut Bytes) -> Result<u32, Malformed> {
    Ok(take(buf, 4)?.get_u32())
}

fn get_str16(buf: &mut Bytes) -> Result<Bytes, Malformed> {
    let n = get_u16(buf)? as usize;
    take(buf, n)
}

fn get_string(buf: &mut Bytes) -> Result<String, Malformed> {
    String::from_utf8(get_str16(buf)?.to_vec()).map_err(|_| Malformed("a name is not UTF-8"))
}

fn get_headers(buf: &mut Bytes) -> Result<HeaderMap, Malformed> {
    let n = get_u32(buf)? as usize;
    if n > MAX_HEADERS {
        return Err(Malformed("too many headers"));
    }
    let mut headers = HeaderMap::with_capacity(n);
    for _ in 0..n {
        let name =
            HeaderName::from_bytes(&get_str16(buf)?).map_err(|_| Malformed("a header name"))?;
        let len = get_u32(buf)? as usize;
        let value = HeaderValue::from_maybe_shared(take(buf, len)?)
            .map_err(|_| Malformed("a header value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

fn get_operator_call(buf: &mut Bytes) -> Result<OperatorCall, Malformed> {
    let keys = |buf: &mut Bytes| match get_u8(buf)? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Malformed("an inspection's keys flag")),
    };
    Ok(match get_u8(buf)? {
        INSPECT => OperatorCall::Inspect {
            keys: keys(buf)?,
            start: None,
        },
        INSPECT_FROM => OperatorCall::Inspect {
            keys: keys(buf)?,
            start: Some({
                let len = get_u32(buf)? as usize;
                String::from_utf8(take(buf, len)?.to_vec())
                    .map_err(|_| Malformed("a key is not UTF-8"))?
            }),
        },
        DELETE => OperatorCall::Delete,
        DROP_COPY => OperatorCall::DropCopy,
        _ => return Err(Malformed("an unknown operator's call")),
    })
}

/// Encodes a call to `target`.
pub fn encode_request(target: &Target, request: &http::Request<Bytes>) -> Result<Bytes, Malformed> {
    let body = request.body();
    let mut out = BytesMut::with_capacity(256 + body.len());
    match target {
        Target::Actor {
            app,
            class,
            name,
            chain,
        } => {
            out.put_u8(ACTOR);
            put_str16(&mut out, app.as_bytes())?;
            put_str16(&mut out, class.as_bytes())?;
            put_str16(&mut out, name.as_bytes())?;
            if chain.len() > MAX_CALL_DEPTH {
                return Err(Malformed("a call chain too long"));
            }
            out.put_u16(chain.len() as u16);
            for (class, name) in chain {
                put_str16(&mut out, class.as_bytes())?;
                put_str16(&mut out, name.as_bytes())?;
            }
        }
        Target::Kv { app, store } => {
            out.put_u8(KV);
            put_str16(&mut out, app.as_bytes())?;
            put_str16(&mut out, store.as_bytes())?;
        }
        Target::Sql { app, database } => {
            out.put_u8(SQL);
            put_str16(&mut out, app.as_bytes())?;
            put_str16(&mut out, database.as_bytes())?;
        }
        Target::Operator {
            app,
            class,
            name,
            call,
        } => {
            out.put_u8(OPERATOR);
            put_str16(&mut out, app.as_bytes())?;
            put_str16(&mut out, class.as_bytes())?;
            put_str16(&mut out, name.as_bytes())?;
            match call {
                OperatorCall::Inspect { keys, start: None } => {
                    out.put_u8(INSPECT);
                    out.put_u8(u8::from(*keys));
                }
                OperatorCall::Inspect {
                    keys,
                    start: Some(start),
                } => {
                    out.put_u8(INSPECT_FROM);
                    out.put_u8(u8::from(*keys));
                    put_bytes32(&mut out, start.as_bytes())?;
                }
                OperatorCall::Delete => out.put_u8(DELETE),
                OperatorCall::DropCopy => out.put_u8(DROP_COPY),
            }
        }
    }
    put_str16(&mut out, request.method().as_str().as_bytes())?;
    put_bytes32(&mut out, request.uri().to_string().as_bytes())?;
    put_headers(&mut out, request.headers())?;
    out.put_slice(body);
    Ok(out.freeze())
}

/// Decodes a call.
pub fn decode_request(
    mut buf: Bytes,
    version: u32,
) -> Result<(Target, http::Request<Bytes>), Malformed> {
    let target = match get_u8(&mut buf)? {
        ACTOR => Target::Actor {
            app: get_string(&mut buf)?,
            class: get_string(&mut buf)?,
            name: get_string(&mut buf)?,
            chain: {
                let n = get_u16(&mut buf)? as usize;
                if n > MAX_CALL_DEPTH {
                    return Err(Malformed("a call chain too long"));
                }
                (0..n)
                    .map(|_| Ok((get_string(&mut buf)?, get_string(&mut buf)?)))
                    .collect::<Result<_, Malformed>>()?
            },
        },
        KV => Target::Kv {
            app: get_string(&mut buf)?,
            store: get_string(&mut buf)?,
        },
        SQL => Target::Sql {
            app: get_string(&mut buf)?,
            database: get_string(&mut buf)?,
        },
        OPERATOR => Target::Operator {
            app: get_string(&mut buf)?,
            class: get_string(&mut buf)?,
            name: get_string(&mut buf)?,
            call: get_operator_call(&mut buf)?,
        },
        _ => return Err(Malformed("an unknown target")),
    };
    if target.since() > version {
        return Err(Malformed("a target its call's version does not carry"));
    }
    let method = Method::from_bytes(&get_str16(&mut buf)?).map_err(|_| Malformed("a method"))?;
    let len = get_u32(&mut buf)? as usize;
    let uri = Uri::from_maybe_shared(take(&mut buf, len)?).map_err(|_| Malformed("a URI"))?;
    let headers = get_headers(&mut buf)?;
    let mut request = http::Request::new(buf);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Ok((target, request))
}

/// A storage call as the request an envelope carries: its body is the
/// call.
pub fn store_call(body: Bytes) -> http::Request<Bytes> {
    let mut request = http::Request::new(body);
    *request.method_mut() = Method::POST;
    request
}

/// What came back from a forwarded call.
#[derive(Debug)]
pub enum Answer {
    Answered(http::Response<Bytes>),
    /// The node did not run the call.
    NotRun,
}

/// Encodes an answer.
pub fn encode_answer(answer: &Answer) -> Result<Bytes, Malformed> {
    match answer {
        Answer::NotRun => Ok(Bytes::from_static(&[NOT_RUN])),
        Answer::Answered(response) => {
            let body = response.body();
            let mut out = BytesMut::with_capacity(64 + body.len());
            out.put_u8(ANSWERED);
            out.put_u16(response.status().as_u16());
            put_headers(&mut out, response.headers())?;
            out.put_slice(body);
            Ok(out.freeze())
        }
    }
}

/// Decodes an answer.
pub fn decode_answer(mut buf: Bytes) -> Result<Answer, Malformed> {
    match get_u8(&mut buf)? {
        NOT_RUN if buf.is_empty() => Ok(Answer::NotRun),
        ANSWERED => {
            let status =
                StatusCode::from_u16(get_u16(&mut buf)?).map_err(|_| Malformed("a status"))?;
            let headers = get_headers(&mut buf)?;
            let mut response = http::Response::new(buf);
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            Ok(Answer::Answered(response))
        }
        _ => Err(Malformed("an unknown answer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call_versions::{CALL_VERSION, OLDEST_CALL_VERSION};

    #[test]
    fn a_request_and_its_answer_survive_the_trip_whole() {
        let mut request = http::Request::new(Bytes::from_static(b"\x00body\xff"));
        *request.method_mut() = Method::from_bytes(b"PATCH").unwrap();
        *request.uri_mut() = "http://n.c.actor.internal/p/a?q=1&r=%20".parse().unwrap();
        request
            .headers_mut()
            .append("set-cookie", HeaderValue::from_static("a=1"));
        request
            .headers_mut()
            .append("set-cookie", HeaderValue::from_static("b=2"));
        request.headers_mut().append(
            "x-bin",
            HeaderValue::from_bytes(b"\xe2\x82\xac tab\t").unwrap(),
        );
        let target = Target::Actor {
            app: "shop".into(),
            class: "cart".into(),
            name: "n".into(),
            chain: vec![("room".into(), "a".into()), ("cart".into(), "m".into())],
        };
        let (t, back) =
            decode_request(encode_request(&target, &request).unwrap(), CALL_VERSION).unwrap();
        assert_eq!(t, target);
        assert_eq!(back.method(), request.method());
        assert_eq!(back.uri(), request.uri());
        assert_eq!(back.headers(), request.headers());
        let cookies: Vec<_> = back.headers().get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(back.body(), request.body());

        let mut response = http::Response::new(Bytes::from_static(b"ok"));
        *response.status_mut() = StatusCode::IM_A_TEAPOT;
        response
            .headers_mut()
            .append("set-cookie", HeaderValue::from_static("x"));
        response
            .headers_mut()
            .append("set-cookie", HeaderValue::from_static("y"));
        let Answer::Answered(back) =
            decode_answer(encode_answer(&Answer::Answered(response.clone())).unwrap()).unwrap()
        else {
            panic!("answered");
        };
        assert_eq!(back.status(), StatusCode::IM_A_TEAPOT);
        assert_eq!(back.headers(), response.headers());
        assert_eq!(back.body(), response.body());
        assert!(matches!(
            decode_answer(encode_answer(&Answer::NotRun).unwrap()),
            Ok(Answer::NotRun)
        ));
    }

    #[test]
    fn operators_calls_survive_the_trip_and_unknown_ones_are_refused() {
        let request = http::Request::new(Bytes::new());
        for call in [
            OperatorCall::Delete,
            OperatorCall::DropCopy,
            OperatorCall::Inspect {
                keys: false,
                start: None,
            },
            OperatorCall::Inspect {
                keys: true,
                start: Some("k\u{e9}y/2".into()),
            },
        ] {
            let target = Target::Operator {
                app: "shop".into(),
                class: "cart".into(),
                name: "n".into(),
                call,
            };
            let whole = encode_request(&target, &request).unwrap();
            let (back, _) = decode_request(whole.clone(), CALL_VERSION).unwrap();
            assert_eq!(back, target);
            // Version 2 carries no operators' calls.
            assert_eq!(
                decode_request(whole.clone(), 2).unwrap_err(),
                Malformed("a target its call's version does not carry")
            );
            // The request is empty: every cut is inside the head.
            for cut in 0..whole.len() {
                assert!(
                    decode_request(whole.slice(..cut), CALL_VERSION).is_err(),
                    "cut at {cut}"
                );
            }
        }
        let mut forged = BytesMut::new();
        forged.put_u8(OPERATOR);
        for part in ["a", "c", "n"] {
            put_str16(&mut forged, part.as_bytes()).unwrap();
        }
        let mut unknown = forged.clone();
        unknown.put_u8(9);
        assert_eq!(
            decode_request(unknown.freeze(), CALL_VERSION).unwrap_err(),
            Malformed("an unknown operator's call")
        );
        forged.put_u8(INSPECT);
        forged.put_u8(2);
        assert_eq!(
            decode_request(forged.freeze(), CALL_VERSION).unwrap_err(),
            Malformed("an inspection's keys flag")
        );
    }

    #[test]
    fn truncated_or_forged_envelopes_are_refused() {
        let request = http::Request::new(Bytes::from_static(b"b"));
        let target = Target::Actor {
            app: "a".into(),
            class: "c".into(),
            name: "n".into(),
            chain: vec![("c".into(), "x".into())],
        };
        let whole = encode_request(&target, &request).unwrap();
        // The oldest version served reads an actor's call as this one does.
        assert_eq!(
            decode_request(whole.clone(), OLDEST_CALL_VERSION)
                .unwrap()
                .0,
            target
        );
        // Every cut inside the head is refused (a cut in the body is just
        // a shorter body, which the outer transport's length guards).
        let head = whole.len() - 1;
        for cut in 0..head {
            assert!(
                decode_request(whole.slice(..cut), CALL_VERSION).is_err(),
                "cut at {cut}"
            );
        }
        assert_eq!(
            decode_request(Bytes::from_static(&[9]), CALL_VERSION).unwrap_err(),
            Malformed("an unknown target")
        );
        // A chain longer than any node makes is refused both ways.
        let long: Vec<(String, String)> = (0..=MAX_CALL_DEPTH)
            .map(|i| ("c".to_string(), format!("n{i}")))
            .collect();
        let too_long = Target::Actor {
            app: "a".into(),
            class: "c".into(),
            name: "n".into(),
            chain: long,
        };
        assert_eq!(
            encode_request(&too_long, &request).unwrap_err(),
            Malformed("a call chain too long")
        );
        let mut forged = BytesMut::new();
        forged.put_u8(ACTOR);
        for part in ["a", "c", "n"] {
            put_str16(&mut forged, part.as_bytes()).unwrap();
        }
        forged.put_u16(MAX_CALL_DEPTH as u16 + 1);
        assert_eq!(
            decode_request(forged.freeze(), CALL_VERSION).unwrap_err(),
            Malformed("a call chain too long")
        );
        // A "not run" answer with anything after it is not one.
        assert!(decode_answer(Bytes::from_static(&[NOT_RUN, 0])).is_err());
        let mut many = BytesMut::new();
        many.put_u8(ANSWERED);
        many.put_u16(200);
        many.put_u32(u32::MAX);
        assert_eq!(
            decode_answer(many.freeze()).unwrap_err(),
            Malformed("too many headers")
        );
    }
}
