//! An actor that runs stored commands: `POST /run/<digest>?arg=A&arg=B&env=K=V`
//! runs the image with those arguments and environment and the request body
//! as its stdin, and answers `{exit_code, stopped, stdout, stderr}` (output
//! as text, lossy). A failed call answers its error's status and
//! `{error, message}`. `POST /count` counts in the actor's storage (to show
//! the actor's own work goes on around its runs).

use wasi::http::types::{IncomingRequest, ResponseOutparam};
use weir_guest::actor::storage;
use weir_guest::http::{read_body, respond};
use weir_guest::process::{self, Error};

struct Runner;

const MAX_BODY: usize = 4 << 20;

fn json(out: ResponseOutparam, status: u16, value: serde_json::Value) {
    respond(
        out,
        status,
        &[("content-type", b"application/json")],
        value.to_string().as_bytes(),
    );
}

fn decode(s: &str) -> String {
    s.replace("%20", " ").replace("%3D", "=")
}

fn failure(e: Error) -> (u16, serde_json::Value) {
    let (status, kind, message) = match e {
        Error::Image(m) => (404, "image", m),
        Error::NotRunnable(m) => (422, "not-runnable", m),
        Error::Limit(m) => (429, "limit", m),
        Error::NoSuchProcess => (404, "no-such-process", String::new()),
        Error::NotAnActor => (400, "not-an-actor", String::new()),
        Error::Failed(m) => (500, "failed", m),
    };
    (status, serde_json::json!({ "error": kind, "message": message }))
}

impl wasi::exports::http::incoming_handler::Guest for Runner {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let (route, query) = path.split_once('?').unwrap_or((&path, ""));
        if route == "/count" {
            let n: u64 = storage::get("n").ok().flatten().unwrap_or(0) + 1;
            let _ = storage::put("n", &n);
            return json(out, 200, serde_json::json!({ "n": n }));
        }
        let Some(image) = route.strip_prefix("/run/") else {
            return json(out, 404, serde_json::json!({ "error": "no such path" }));
        };
        let mut args = Vec::new();
        let mut env = Vec::new();
        for (k, v) in query.split('&').filter_map(|p| p.split_once('=')) {
            match k {
                "arg" => args.push(decode(v)),
                "env" => {
                    let v = decode(v);
                    if let Some((name, value)) = v.split_once('=') {
                        env.push((name.to_string(), value.to_string()));
                    }
                }
                _ => {}
            }
        }
        let stdin = read_body(&request, MAX_BODY);
        match process::run(image, &args, &env, &stdin) {
            Ok(result) => json(
                out,
                200,
                serde_json::json!({
                    "exit_code": result.exit_code,
                    "stopped": result.stopped,
                    "stdout": String::from_utf8_lossy(&result.stdout),
                    "stdout_bytes": result.stdout.len(),
                    "stderr": String::from_utf8_lossy(&result.stderr),
                }),
            ),
            Err(e) => {
                let (status, body) = failure(e);
                json(out, status, body)
            }
        }
    }
}

wasi::http::proxy::export!(Runner);
