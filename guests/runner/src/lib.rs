//! An actor that runs programs, for the tests:
//!
//! | path | behaviour |
//! |---|---|
//! | `POST /run/<digest>?arg=A&env=K=V` | runs the command with the body as stdin: `{exit_code, stopped, stdout, stderr}` |
//! | `POST /spawn/<digest>?arg=A&env=K=V&secret=K=NAME&start=S&slot=N&durable=1&on_crash=report&contract=lifetime` | spawns a process (with storage slot N, durable or not): `{pid, payload}`; `pad=N` (here and for `/run`) adds a variable `PAD` of N bytes |
//! | `POST /wait/<pid>?timeout=MS` | `{exited: null}` or `{exited: {exit_code, stopped, stdout, stderr}}` |
//! | `POST /stdin/<pid>` | hands the body to its stdin: `{taken}` |
//! | `POST /close/<pid>` | closes its stdin: `{closed: true}` |
//! | `GET /output/<pid>?stream=stderr&offset=N&max=M&timeout=MS` | `{offset, data, bytes, closed}` |
//! | `GET /recovered` | what `weir:process/supervisor.recovered` told it, in order: `[{old, new, outcome}]` |
//! | `POST /remove-storage/<name>` | `{removed}` |
//! | `POST /broken-spawn/<digest>` | leaves a deferred foreign key broken in its turn, then spawns (the journal's commit fails) |
//! | `ANY /proc/<pid>/<path>` | forwards the request (method, path, headers, body) to `<pid>.process.internal` and answers with its response as it came |
//! | `POST /kill/<pid>?after_ms=N` | `{killed}` (after sleeping N ms in the turn) |
//! | `POST /sleep?ms=N` | sleeps N ms in the turn: `{slept}` |
//! | `GET /status/<pid>`, `GET /list` | the process(es): `{pid, image, slot, state, requests}` |
//! | `POST /count` | counts in the actor's storage |
//!
//! A failed call answers its error's status and `{error, message}`.

use wasi::http::types::{IncomingRequest, ResponseOutparam};
use weir_guest::actor::storage;
use weir_guest::http::{forward, read_body, respond};
use weir_guest::process::{
    self, processes, Contract, Error, OutputStream, ProcessInfo, RecoveryOutcome, SpawnSpec, State,
    StorageSlot,
};

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
        Error::Ended(m) => (410, "ended", m),
        Error::WrongContract(m) => (409, "wrong-contract", m),
        Error::NotAnActor => (400, "not-an-actor", String::new()),
        Error::Failed(m) => (500, "failed", m),
    };
    (
        status,
        serde_json::json!({ "error": kind, "message": message }),
    )
}

fn info(p: &ProcessInfo) -> serde_json::Value {
    serde_json::json!({
        "pid": p.pid,
        "image": p.image,
        "contract": match p.contract {
            Contract::Boot => "boot",
            Contract::Lifetime => "lifetime",
        },
        "slot": p.slot,
        "state": match &p.state {
            State::Running => "running".to_string(),
            State::Ended(why) => format!("ended: {why}"),
        },
        "requests": p.requests,
    })
}

fn args_and_env(query: &str) -> (Vec<String>, Vec<(String, String)>, Vec<u8>) {
    let mut args = Vec::new();
    let mut env = Vec::new();
    let mut start = Vec::new();
    for (k, v) in query.split('&').filter_map(|p| p.split_once('=')) {
        match k {
            "arg" => args.push(decode(v)),
            "env" => {
                let v = decode(v);
                if let Some((name, value)) = v.split_once('=') {
                    env.push((name.to_string(), value.to_string()));
                }
            }
            "start" => start = decode(v).into_bytes(),
            // A variable `PAD` of N bytes: a spec larger than a URL.
            "pad" => env.push(("PAD".to_string(), "x".repeat(v.parse().unwrap_or(0)))),
            _ => {}
        }
    }
    (args, env, start)
}

/// The query's `name=` values, decoded.
fn values<'a>(query: &'a str, name: &'a str) -> impl Iterator<Item = String> + 'a {
    query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .filter(move |(k, _)| *k == name)
        .map(|(_, v)| decode(v))
}

fn number(query: &str, name: &str) -> u64 {
    values(query, name)
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Recovery's news, kept in order in the actor's storage.
fn recovered(old: u64, new: Option<u64>, outcome: RecoveryOutcome) -> Result<(), String> {
    let mut told: Vec<serde_json::Value> = storage::get::<String>("recovered")
        .map_err(|e| e.to_string())?
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    told.push(serde_json::json!({
        "old": old,
        "new": new,
        "outcome": match outcome {
            RecoveryOutcome::Restarted => "restarted".to_string(),
            RecoveryOutcome::Lost(why) => format!("lost: {why}"),
        },
    }));
    storage::put("recovered", &serde_json::Value::Array(told).to_string())
        .map_err(|e| e.to_string())
}

weir_guest::supervisor!(recovered);

fn answer(out: ResponseOutparam, result: Result<serde_json::Value, Error>) {
    match result {
        Ok(value) => json(out, 200, value),
        Err(e) => {
            let (status, body) = failure(e);
            json(out, status, body)
        }
    }
}

impl wasi::exports::http::incoming_handler::Guest for Runner {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let (route, query) = path.split_once('?').unwrap_or((&path, ""));
        if let Some(rest) = route.strip_prefix("/proc/") {
            let (pid, tail) = rest.split_once('/').unwrap_or((rest, ""));
            let tail = if query.is_empty() {
                format!("/{tail}")
            } else {
                format!("/{tail}?{query}")
            };
            return forward(
                &request,
                out,
                &format!("{pid}.process.internal"),
                &tail,
                MAX_BODY,
            );
        }
        if let Some(image) = route.strip_prefix("/broken-spawn/") {
            for sql in [
                "CREATE TABLE IF NOT EXISTS parent (id INTEGER PRIMARY KEY)",
                "CREATE TABLE IF NOT EXISTS child (p INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)",
                "INSERT INTO child (p) VALUES (42)",
            ] {
                let _ = storage::exec(sql, &[]);
            }
            let spec = SpawnSpec {
                image: image.to_string(),
                contract: None,
                args: Vec::new(),
                env: Vec::new(),
                secret_env: Vec::new(),
                start_args: Vec::new(),
                storage: None,
                on_crash: None,
            };
            return answer(
                out,
                processes::spawn(&spec).map(|s| serde_json::json!({ "pid": s.pid })),
            );
        }
        if let Some(image) = route.strip_prefix("/spawn/") {
            let (args, env, start_args) = args_and_env(query);
            let pairs: Vec<(&str, &str)> =
                query.split('&').filter_map(|p| p.split_once('=')).collect();
            let storage = pairs
                .iter()
                .find(|(k, _)| *k == "slot")
                .map(|(_, name)| StorageSlot {
                    name: name.to_string(),
                    durable: pairs.iter().any(|(k, v)| *k == "durable" && *v == "1"),
                });
            let contract = values(query, "contract").next().map(|c| match c.as_str() {
                "lifetime" => Contract::Lifetime,
                _ => Contract::Boot,
            });
            let secret_env = values(query, "secret")
                .filter_map(|v| {
                    v.split_once('=')
                        .map(|(k, n)| (k.to_string(), n.to_string()))
                })
                .collect();
            let on_crash = pairs
                .iter()
                .find(|(k, _)| *k == "on_crash")
                .map(|(_, v)| match *v {
                    "report" => processes::OnCrash::Report,
                    _ => processes::OnCrash::RestartOnce,
                });
            let spec = SpawnSpec {
                image: image.to_string(),
                contract,
                args,
                env,
                secret_env,
                start_args,
                storage,
                on_crash,
            };
            return answer(
                out,
                processes::spawn(&spec).map(|s| {
                    serde_json::json!({
                        "pid": s.pid,
                        "payload": String::from_utf8_lossy(&s.payload),
                    })
                }),
            );
        }
        if let Some(pid) = route.strip_prefix("/kill/") {
            let pid = pid.parse().unwrap_or(0);
            // Most of the turn spent first, so the kill meets its deadline.
            let after = number(query, "after_ms");
            if after > 0 {
                wasi::clocks::monotonic_clock::subscribe_duration(after * 1_000_000).block();
            }
            return answer(
                out,
                processes::kill(pid).map(|k| serde_json::json!({ "killed": k })),
            );
        }
        if let Some(pid) = route.strip_prefix("/status/") {
            let pid = pid.parse().unwrap_or(0);
            return answer(out, processes::status(pid).map(|p| info(&p)));
        }
        if let Some(name) = route.strip_prefix("/remove-storage/") {
            return answer(
                out,
                processes::remove_storage(name).map(|r| serde_json::json!({ "removed": r })),
            );
        }
        if let Some(pid) = route.strip_prefix("/wait/") {
            let pid = pid.parse().unwrap_or(0);
            let timeout = number(query, "timeout") as u32;
            return answer(
                out,
                processes::wait(pid, timeout).map(|exited| {
                    serde_json::json!({ "exited": exited.map(|e| serde_json::json!({
                        "exit_code": e.exit_code,
                        "stopped": e.stopped,
                        "stdout": String::from_utf8_lossy(&e.stdout_tail),
                        "stderr": String::from_utf8_lossy(&e.stderr_tail),
                    })) })
                }),
            );
        }
        if let Some(pid) = route.strip_prefix("/stdin/") {
            let pid = pid.parse().unwrap_or(0);
            let body = read_body(&request, MAX_BODY);
            return answer(
                out,
                processes::write_stdin(pid, &body).map(|n| serde_json::json!({ "taken": n })),
            );
        }
        if let Some(pid) = route.strip_prefix("/close/") {
            let pid = pid.parse().unwrap_or(0);
            return answer(
                out,
                processes::close_stdin(pid).map(|()| serde_json::json!({ "closed": true })),
            );
        }
        if let Some(pid) = route.strip_prefix("/output/") {
            let pid = pid.parse().unwrap_or(0);
            let which = match values(query, "stream").next().as_deref() {
                Some("stderr") => OutputStream::Stderr,
                _ => OutputStream::Stdout,
            };
            let max = values(query, "max")
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1 << 20);
            let read = processes::read_output(
                pid,
                which,
                number(query, "offset"),
                max,
                number(query, "timeout") as u32,
            );
            return answer(
                out,
                read.map(|c| {
                    serde_json::json!({
                        "offset": c.offset,
                        "data": String::from_utf8_lossy(&c.data),
                        "bytes": c.data.len(),
                        "closed": c.closed,
                    })
                }),
            );
        }
        if route == "/recovered" {
            let told = storage::get::<String>("recovered")
                .ok()
                .flatten()
                .unwrap_or_else(|| "[]".into());
            return respond(
                out,
                200,
                &[("content-type", b"application/json")],
                told.as_bytes(),
            );
        }
        if route == "/list" {
            return answer(
                out,
                processes::list().map(|ps| serde_json::Value::Array(ps.iter().map(info).collect())),
            );
        }
        if route == "/sleep" {
            let ms = number(query, "ms");
            wasi::clocks::monotonic_clock::subscribe_duration(ms * 1_000_000).block();
            return json(out, 200, serde_json::json!({ "slept": ms }));
        }
        if route == "/count" {
            let n: u64 = storage::get("n").ok().flatten().unwrap_or(0) + 1;
            let _ = storage::put("n", &n);
            return json(out, 200, serde_json::json!({ "n": n }));
        }
        let Some(image) = route.strip_prefix("/run/") else {
            return json(out, 404, serde_json::json!({ "error": "no such path" }));
        };
        let (args, env, _) = args_and_env(query);
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
