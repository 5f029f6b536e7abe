//! Typed access to Weir's host interfaces for Rust guests — `weir:sql` and
//! `wasi:keyvalue` — so a guest needs no hand-written bindings.
//!
//! ```ignore
//! use weir_guest::sql::{self, stmt};
//! let results = sql::batch("links", &[
//!     stmt("INSERT INTO links (code, url) VALUES (?1, ?2)", ["abc".into(), url.into()]),
//!     stmt("SELECT count(*) FROM links", []),
//! ])?;
//! ```

mod bindings {
    wit_bindgen::generate!({
        path: "../../wit/weir-sql",
        world: "weir:sql/imports",
    });
}

mod kv_bindings {
    wit_bindgen::generate!({
        path: "../../wit/deps/keyvalue",
        world: "wasi:keyvalue/imports",
    });
}

/// `wasi:keyvalue` (0.2.0-draft): stores declared in `weir.toml`
/// (`[keyvalue] stores = [...]`).
pub mod keyvalue {
    pub use crate::kv_bindings::wasi::keyvalue::{atomics, batch, store};
}

/// `weir:sql/batch`: statements run in one transaction against a database
/// declared in `weir.toml` (`[sql] databases = [...]`).
pub mod sql {
    pub use crate::bindings::weir::sql::batch::{
        Error, Statement, StatementError, StatementResult, Value,
    };

    /// Most statements a batch may hold.
    pub const MAX_BATCH_STATEMENTS: usize = 128;
    /// Most parameters a statement may take.
    pub const MAX_STATEMENT_PARAMS: usize = 100;

    /// Runs `statements` in order in one transaction: all take effect or
    /// none does.
    pub fn batch(database: &str, statements: &[Statement]) -> Result<Vec<StatementResult>, Error> {
        crate::bindings::weir::sql::batch::run(database, statements)
    }

    /// A statement with positional parameters.
    pub fn stmt(sql: &str, params: impl IntoIterator<Item = Value>) -> Statement {
        Statement {
            sql: sql.to_string(),
            params: params.into_iter().collect(),
        }
    }

    impl From<i64> for Value {
        fn from(v: i64) -> Self {
            Value::Integer(v)
        }
    }

    impl From<f64> for Value {
        fn from(v: f64) -> Self {
            Value::Real(v)
        }
    }

    impl From<&str> for Value {
        fn from(v: &str) -> Self {
            Value::Text(v.to_string())
        }
    }

    impl From<String> for Value {
        fn from(v: String) -> Self {
            Value::Text(v)
        }
    }

    impl From<Vec<u8>> for Value {
        fn from(v: Vec<u8>) -> Self {
            Value::Blob(v)
        }
    }

    impl<T: Into<Value>> From<Option<T>> for Value {
        fn from(v: Option<T>) -> Self {
            v.map_or(Value::Null, Into::into)
        }
    }

    impl Value {
        pub fn as_i64(&self) -> Option<i64> {
            match self {
                Value::Integer(i) => Some(*i),
                _ => None,
            }
        }

        pub fn as_str(&self) -> Option<&str> {
            match self {
                Value::Text(t) => Some(t),
                _ => None,
            }
        }
    }
}

/// Small helpers for `wasi:http` handlers.
pub mod http {
    use wasi::http::types::{
        Fields, IncomingRequest, OutgoingBody, OutgoingResponse, ResponseOutparam,
    };

    /// Bytes `blocking-write-and-flush` accepts per call.
    const WRITE_CHUNK: usize = 4096;

    /// Sends a whole response: status, headers, body.
    pub fn respond(out: ResponseOutparam, status: u16, headers: &[(&str, &[u8])], body: &[u8]) {
        let list: Vec<(String, Vec<u8>)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect();
        let response = OutgoingResponse::new(Fields::from_list(&list).expect("valid headers"));
        response.set_status_code(status).expect("valid status");
        let out_body = response.body().expect("body once");
        ResponseOutparam::set(out, Ok(response));
        let stream = out_body.write().expect("stream once");
        for chunk in body.chunks(WRITE_CHUNK) {
            stream
                .blocking_write_and_flush(chunk)
                .expect("client accepts");
        }
        drop(stream);
        OutgoingBody::finish(out_body, None).expect("complete");
    }

    /// Reads a request's whole body, up to `limit` bytes (more is cut off).
    pub fn read_body(request: &IncomingRequest, limit: usize) -> Vec<u8> {
        let body = request.consume().expect("body once");
        let stream = body.stream().expect("stream once");
        let mut bytes = Vec::new();
        while bytes.len() < limit {
            match stream.blocking_read(65536) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(_) => break,
            }
        }
        bytes.truncate(limit);
        bytes
    }
}
