//! The SQL test guest: runs a JSON-described batch through `weir:sql` and
//! answers the results as JSON, so tests drive batches from outside.
//!
//! `POST /batch` with `{"db": "...", "statements": [{"sql": "...", "params": [...]}]}`;
//! a parameter is `null`, an integer, a float, a string, `{"real": 2.0}` or
//! `{"blob": [bytes]}`. The answer is `{"results": [...]}` or `{"error": "..."}`.

use serde_json::{json, Value as Json};
use wasi::http::types::{IncomingRequest, ResponseOutparam};
use weir_guest::sql::{self, Statement, Value};

struct SqlProbe;

fn param(v: &Json) -> Value {
    match v {
        Json::Null => Value::Null,
        Json::Number(n) if n.is_i64() => Value::Integer(n.as_i64().unwrap_or_default()),
        Json::Number(n) => Value::Real(n.as_f64().unwrap_or_default()),
        Json::String(s) => Value::Text(s.clone()),
        Json::Object(o) if o.contains_key("real") => {
            Value::Real(o["real"].as_f64().unwrap_or_default())
        }
        Json::Object(o) if o.contains_key("blob") => Value::Blob(
            o["blob"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|b| b.as_u64().unwrap_or_default() as u8)
                        .collect()
                })
                .unwrap_or_default(),
        ),
        other => Value::Text(other.to_string()),
    }
}

fn value(v: &Value) -> Json {
    match v {
        Value::Null => Json::Null,
        Value::Integer(i) => json!(i),
        Value::Real(r) => json!({ "real": r }),
        Value::Text(t) => json!(t),
        Value::Blob(b) => json!({ "blob": b }),
    }
}

fn respond(out: ResponseOutparam, status: u16, body: &[u8]) {
    weir_guest::http::respond(out, status, &[("content-type", b"application/json")], body);
}

impl wasi::exports::http::incoming_handler::Guest for SqlProbe {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let input: Json =
            match serde_json::from_slice(&weir_guest::http::read_body(&request, usize::MAX)) {
                Ok(v) => v,
                Err(e) => {
                    return respond(
                        out,
                        400,
                        json!({ "bad_input": e.to_string() }).to_string().as_bytes(),
                    )
                }
            };
        let db = input["db"].as_str().unwrap_or_default().to_string();
        let statements: Vec<Statement> = input["statements"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| {
                        sql::stmt(
                            s["sql"].as_str().unwrap_or_default(),
                            s["params"]
                                .as_array()
                                .map(|p| p.iter().map(param).collect::<Vec<_>>())
                                .unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let answer = match sql::batch(&db, &statements) {
            Ok(results) => json!({
                "results": results.iter().map(|r| json!({
                    "columns": r.columns,
                    "rows": r.rows.iter().map(|row| row.iter().map(value).collect::<Vec<_>>()).collect::<Vec<_>>(),
                    "rows_read": r.rows_read,
                    "rows_written": r.rows_written,
                    "last_insert_id": r.last_insert_id,
                })).collect::<Vec<_>>()
            }),
            Err(e) => json!({ "error": format!("{e:?}") }),
        };
        respond(out, 200, answer.to_string().as_bytes());
    }
}

wasi::http::proxy::export!(SqlProbe);
