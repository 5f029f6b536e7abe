//! Typed access to Weir's host interfaces for Rust guests — `weir:sql`,
//! `wasi:keyvalue` and, for actors, `weir:actor` — so a guest needs no
//! hand-written bindings.
//!
//! ```ignore
//! use weir_guest::sql::{self, stmt};
//! let results = sql::batch("links", &[
//!     stmt("INSERT INTO links (code, url) VALUES (?1, ?2)", ["abc".into(), url.into()]),
//!     stmt("SELECT count(*) FROM links", []),
//! ])?;
//! ```

/// `From` conversions into a SQL value type (`weir:sql` and `weir:actor`
/// each have one, of the same shape).
#[doc(hidden)]
#[macro_export]
macro_rules! value_conversions {
    ($value:ident) => {
        impl From<i64> for $value {
            fn from(v: i64) -> Self {
                $value::Integer(v)
            }
        }

        impl From<f64> for $value {
            fn from(v: f64) -> Self {
                $value::Real(v)
            }
        }

        impl From<&str> for $value {
            fn from(v: &str) -> Self {
                $value::Text(v.to_string())
            }
        }

        impl From<String> for $value {
            fn from(v: String) -> Self {
                $value::Text(v)
            }
        }

        impl From<Vec<u8>> for $value {
            fn from(v: Vec<u8>) -> Self {
                $value::Blob(v)
            }
        }
    };
}

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

mod actor_bindings {
    wit_bindgen::generate!({
        path: "../../wit/weir-actor",
        world: "weir:actor/imports",
    });
}

mod process_bindings {
    wit_bindgen::generate!({
        path: "../../wit/weir-process",
        world: "weir:process/imports",
    });
}

mod websocket_bindings {
    wit_bindgen::generate!({
        path: "../../wit/weir-websocket",
        world: "weir:websocket/imports",
    });
}

/// `weir:websocket`: worker sockets and the sockets actors own.
pub mod websocket;

/// The generated export side of `weir:websocket/handler`; used by
/// [`socket_handler!`].
#[doc(hidden)]
pub mod socket_handler_bindings {
    wit_bindgen::generate!({
        path: "../../wit/weir-websocket",
        world: "weir:websocket/socket-handler",
        pub_export_macro: true,
        export_macro_name: "__weir_export_socket_handler",
        default_bindings_module: "weir_guest::socket_handler_bindings",
        with: {
            "weir:websocket/types@0.1.0": crate::websocket::types_module,
        },
    });
}

/// The generated export side of `weir:actor/alarm`; used by [`alarms!`].
#[doc(hidden)]
pub mod alarm_bindings {
    wit_bindgen::generate!({
        path: "../../wit/weir-actor",
        world: "weir:actor/alarm-handler",
        pub_export_macro: true,
        export_macro_name: "__weir_export_alarm",
        default_bindings_module: "weir_guest::alarm_bindings",
    });
}

/// The generated export side of `weir:process/supervisor`; used by
/// [`supervisor!`].
#[doc(hidden)]
pub mod supervisor_bindings {
    wit_bindgen::generate!({
        path: "../../wit/weir-process",
        world: "weir:process/supervised",
        pub_export_macro: true,
        export_macro_name: "__weir_export_supervisor",
        default_bindings_module: "weir_guest::supervisor_bindings",
    });
}

/// `wasi:keyvalue` (0.2.0-draft): stores declared in `weir.toml`
/// (`[keyvalue] stores = [...]`).
pub mod keyvalue {
    pub use crate::kv_bindings::wasi::keyvalue::{atomics, batch, store};
}

/// `weir:process`: programs an actor runs, and the resident processes it
/// owns.
pub mod process {
    pub use crate::process_bindings::weir::process::processes::{
        self, Contract, Exited, OutputChunk, OutputStream, ProcessInfo, SpawnSpec, Spawned, State,
        StorageSlot,
    };
    pub use crate::process_bindings::weir::process::programs::RunResult;
    pub use crate::process_bindings::weir::process::types::Error;
    pub use crate::supervisor_bindings::exports::weir::process::supervisor::RecoveryOutcome;

    /// Runs the stored command `image` (`sha256:…`) to completion with these
    /// arguments, environment and stdin; bounded by `run_time_limit_ms` and
    /// by this turn's deadline.
    pub fn run(
        image: &str,
        args: &[String],
        env: &[(String, String)],
        stdin: &[u8],
    ) -> Result<RunResult, Error> {
        crate::process_bindings::weir::process::programs::run(image, args, env, stdin)
    }
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

    crate::value_conversions!(Value);

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

    /// A whole response to [`send`].
    #[derive(Debug)]
    pub struct Reply {
        pub status: u16,
        pub headers: Vec<(String, Vec<u8>)>,
        pub body: Vec<u8>,
    }

    impl Reply {
        /// The first value of a header, by lowercase name.
        pub fn header(&self, name: &str) -> Option<&[u8]> {
            self.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_slice())
        }
    }

    /// Sends `method` `http://authority/path` with `body` and waits for the
    /// whole response, or says why it failed.
    pub fn send(method: &str, authority: &str, path: &str, body: &[u8]) -> Result<Reply, String> {
        send_with_headers(method, authority, path, &[], body)
    }

    /// [`send`] with request headers of the caller's (`content-length` is
    /// set from the body).
    pub fn send_with_headers(
        method: &str,
        authority: &str,
        path: &str,
        headers: &[(String, Vec<u8>)],
        body: &[u8],
    ) -> Result<Reply, String> {
        use wasi::http::types::{Method, Scheme};
        let mut list: Vec<(String, Vec<u8>)> = headers
            .iter()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("content-length"))
            .cloned()
            .collect();
        list.push((
            "content-length".to_string(),
            body.len().to_string().into_bytes(),
        ));
        let headers = Fields::from_list(&list).map_err(|e| format!("{e:?}"))?;
        let request = wasi::http::types::OutgoingRequest::new(headers);
        let method = match method {
            "GET" => Method::Get,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "HEAD" => Method::Head,
            "PATCH" => Method::Patch,
            other => Method::Other(other.to_string()),
        };
        request.set_method(&method).map_err(|_| "bad method")?;
        request
            .set_scheme(Some(&Scheme::Http))
            .map_err(|_| "bad scheme")?;
        request
            .set_authority(Some(authority))
            .map_err(|_| "bad authority")?;
        request
            .set_path_with_query(Some(path))
            .map_err(|_| "bad path")?;
        let out_body = request.body().map_err(|_| "body taken")?;
        let future =
            wasi::http::outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
        {
            let stream = out_body.write().map_err(|_| "stream taken")?;
            for chunk in body.chunks(WRITE_CHUNK) {
                stream
                    .blocking_write_and_flush(chunk)
                    .map_err(|e| format!("{e:?}"))?;
            }
        }
        OutgoingBody::finish(out_body, None).map_err(|e| format!("{e:?}"))?;
        future.subscribe().block();
        let response = match future.get() {
            Some(Ok(Ok(response))) => response,
            Some(Ok(Err(code))) => return Err(format!("{code:?}")),
            _ => return Err("no response".into()),
        };
        let status = response.status();
        let headers = response.headers().entries();
        let incoming = response.consume().map_err(|_| "body taken")?;
        let stream = incoming.stream().map_err(|_| "stream taken")?;
        let mut bytes = Vec::new();
        loop {
            match stream.blocking_read(65536) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(wasi::io::streams::StreamError::Closed) => break,
                Err(e) => return Err(format!("body failed: {e:?}")),
            }
        }
        Ok(Reply {
            status,
            headers,
            body: bytes,
        })
    }

    /// The name of a request's method, as [`send`] takes it.
    pub fn method_name(method: &wasi::http::types::Method) -> String {
        use wasi::http::types::Method;
        match method {
            Method::Get => "GET".into(),
            Method::Head => "HEAD".into(),
            Method::Post => "POST".into(),
            Method::Put => "PUT".into(),
            Method::Delete => "DELETE".into(),
            Method::Connect => "CONNECT".into(),
            Method::Options => "OPTIONS".into(),
            Method::Trace => "TRACE".into(),
            Method::Patch => "PATCH".into(),
            Method::Other(other) => other.clone(),
        }
    }

    /// Passes `request` on to `http://authority/path` (its method, headers
    /// but `host`, and body up to `max_body` bytes) and answers with the
    /// response as it came: status, every header (repeated ones too), body.
    /// How an owner reaches its resident process. A failed send answers
    /// 502 with the reason.
    pub fn forward(
        request: &IncomingRequest,
        out: ResponseOutparam,
        authority: &str,
        path: &str,
        max_body: usize,
    ) {
        let method = method_name(&request.method());
        let headers: Vec<(String, Vec<u8>)> = request
            .headers()
            .entries()
            .into_iter()
            .filter(|(k, _)| k != "host")
            .collect();
        let body = read_body(request, max_body);
        match send_with_headers(&method, authority, path, &headers, &body) {
            Ok(reply) => {
                let headers: Vec<(&str, &[u8])> = reply
                    .headers
                    .iter()
                    .filter(|(k, _)| k != "content-length" && k != "transfer-encoding")
                    .map(|(k, v)| (k.as_str(), v.as_slice()))
                    .collect();
                respond(out, reply.status, &headers, &reply.body);
            }
            Err(e) => respond(
                out,
                502,
                &[("content-type", b"text/plain")],
                format!("{e}\n").as_bytes(),
            ),
        }
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

pub mod actor;

/// Exports an actor's timer handlers, by reason. A reason without a handler
/// is ignored (its timer is consumed), so old timers of a class that no
/// longer handles them do not fail forever.
///
/// Each handler is `fn() -> Result<Option<u64>, String>`: `Ok(Some(t))`
/// re-arms the reason at `t` (ms since the Unix epoch), `Err` retries it
/// with backoff.
/// Exports `weir:process/supervisor`: `$handler(old_pid, new_pid,
/// outcome)` hears, in a turn of its own after a crash of the server, what
/// recovery did with each of this actor's processes — before any request
/// reaches the actor.
///
/// ```ignore
/// weir_guest::supervisor!(recovered);
/// fn recovered(old: u64, new: Option<u64>, outcome: weir_guest::process::RecoveryOutcome)
///     -> Result<(), String> { Ok(()) }
/// ```
#[macro_export]
macro_rules! supervisor {
    ($handler:path) => {
        struct __WeirSupervisor;
        impl $crate::supervisor_bindings::exports::weir::process::supervisor::Guest
            for __WeirSupervisor
        {
            fn recovered(
                old_pid: u64,
                new_pid: Option<u64>,
                outcome: $crate::process::RecoveryOutcome,
            ) -> Result<(), String> {
                $handler(old_pid, new_pid, outcome)
            }
        }
        $crate::supervisor_bindings::__weir_export_supervisor!(__WeirSupervisor with_types_in $crate::supervisor_bindings);
    };
}

/// Exports `weir:websocket/handler`: `$on_message(socket, message)` and
/// `$on_close(socket, close)` run as turns of the actor, one at a time per
/// socket, in order. An `Err` (or a trap) rolls the turn back.
///
/// ```ignore
/// weir_guest::socket_handler!(on_message, on_close);
/// fn on_message(socket: u64, m: weir_guest::websocket::Message) -> Result<(), String> { Ok(()) }
/// fn on_close(socket: u64, c: weir_guest::websocket::CloseFrame) -> Result<(), String> { Ok(()) }
/// ```
#[macro_export]
macro_rules! socket_handler {
    ($on_message:path, $on_close:path) => {
        struct __WeirSocketHandler;
        impl $crate::socket_handler_bindings::exports::weir::websocket::handler::Guest
            for __WeirSocketHandler
        {
            fn on_message(socket: u64, message: $crate::websocket::Message) -> Result<(), String> {
                $on_message(socket, message)
            }
            fn on_close(socket: u64, close: $crate::websocket::CloseFrame) -> Result<(), String> {
                $on_close(socket, close)
            }
        }
        $crate::socket_handler_bindings::__weir_export_socket_handler!(__WeirSocketHandler with_types_in $crate::socket_handler_bindings);
    };
}

#[macro_export]
macro_rules! alarms {
    ($($reason:literal => $handler:path),* $(,)?) => {
        struct __WeirAlarms;
        impl $crate::alarm_bindings::exports::weir::actor::alarm::Guest for __WeirAlarms {
            fn alarm(reason: String) -> Result<Option<u64>, String> {
                match reason.as_str() {
                    $($reason => $handler(),)*
                    _ => Ok(None),
                }
            }
        }
        $crate::alarm_bindings::__weir_export_alarm!(__WeirAlarms with_types_in $crate::alarm_bindings);
    };
}
