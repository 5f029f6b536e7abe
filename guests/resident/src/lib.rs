//! A resident server for the tests: it boots once (`start` counts its
//! evaluations in instance memory) and then serves:
//!
//! | path | behaviour |
//! |---|---|
//! | `/starts` | `{starts, start_args, requests, args, env}`: how often start ran in this instance, what it was given, requests served |
//! | `/echo?status=N` | answers N (default 200) with `x-method`, `x-path`, each request header as `x-echo-<name>`, two `set-cookie`s, and the request body |
//! | `PUT /files/<name>` | writes the body to `/data/<name>` (its storage slot) |
//! | `GET /files/<name>` | the file, or 404 with the error |
//! | `GET /escape` | tries to leave `/data` (`..`, absolute paths, a symlink out, the host's files): one line per try |
//! | `/spin` | never answers |
//! | `/trap` | traps |
//! | `/grow` | allocates 1 MiB after 1 MiB until refused |
//!
//! `start` fails when its argument is `fail`. With a storage slot, each
//! start appends a line to `/data/starts.log` (what the crash tests count);
//! with the argument `slow-redrive`, a start that finds lines there already
//! (a re-drive) then sleeps 3 s; with `slow`, every start does.

use std::cell::{Cell, RefCell};

use wasi::http::types::{IncomingRequest, ResponseOutparam};
use weir_guest::http::{read_body, respond};

mod boot_bindings {
    wit_bindgen::generate!({
        path: "../../wit/weir-process",
        world: "weir:process/resident",
    });
}

thread_local! {
    static STARTS: Cell<u64> = const { Cell::new(0) };
    static REQUESTS: Cell<u64> = const { Cell::new(0) };
    static START_ARGS: RefCell<String> = const { RefCell::new(String::new()) };
}

struct Resident;

impl boot_bindings::exports::weir::process::boot::Guest for Resident {
    fn start(args: Vec<u8>) -> Result<Vec<u8>, String> {
        STARTS.with(|s| s.set(s.get() + 1));
        let args = String::from_utf8_lossy(&args).into_owned();
        if args == "fail" {
            return Err("told to fail".into());
        }
        if std::fs::metadata("/data").is_ok() {
            let before = std::fs::read_to_string("/data/starts.log").unwrap_or_default();
            let mut log = before.clone();
            log.push_str("start\n");
            std::fs::write("/data/starts.log", log).map_err(|e| e.to_string())?;
            if (args == "slow-redrive" && !before.is_empty()) || args == "slow" {
                std::thread::sleep(std::time::Duration::from_secs(3));
            }
        }
        START_ARGS.with(|a| *a.borrow_mut() = args.clone());
        Ok(format!("booted with {args}").into_bytes())
    }
}

boot_bindings::export!(Resident with_types_in boot_bindings);

impl wasi::exports::http::incoming_handler::Guest for Resident {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        REQUESTS.with(|r| r.set(r.get() + 1));
        let path = request.path_with_query().unwrap_or_default();
        let (route, query) = path.split_once('?').unwrap_or((&path, ""));
        match route {
            "/starts" => {
                let body = serde_json::json!({
                    "starts": STARTS.with(Cell::get),
                    "start_args": START_ARGS.with(|a| a.borrow().clone()),
                    "requests": REQUESTS.with(Cell::get),
                    "args": std::env::args().collect::<Vec<_>>(),
                    "env": std::env::vars().collect::<Vec<_>>(),
                });
                respond(
                    out,
                    200,
                    &[("content-type", b"application/json")],
                    body.to_string().as_bytes(),
                );
            }
            "/echo" => {
                let status = query
                    .split('&')
                    .find_map(|p| p.strip_prefix("status="))
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(200);
                let method = format!("{:?}", request.method());
                let mut headers: Vec<(String, Vec<u8>)> = vec![
                    ("x-method".into(), method.into_bytes()),
                    ("x-path".into(), path.clone().into_bytes()),
                    ("set-cookie".into(), b"a=1; Path=/".to_vec()),
                    ("set-cookie".into(), b"b=2; Path=/".to_vec()),
                ];
                for (name, value) in request.headers().entries() {
                    headers.push((format!("x-echo-{name}"), value));
                }
                let body = read_body(&request, 1 << 20);
                let refs: Vec<(&str, &[u8])> = headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_slice()))
                    .collect();
                respond(out, status, &refs, &body);
            }
            "/escape" => {
                fn try_read(what: &str, path: &str) -> String {
                    match std::fs::read(path) {
                        Ok(b) => format!("{what}: read {} bytes", b.len()),
                        Err(e) => format!("{what}: {:?}", e.kind()),
                    }
                }
                let mut lines = vec![
                    try_read("parent", "/data/../../../../etc/passwd"),
                    try_read("absolute", "/etc/passwd"),
                    try_read("relative", "../etc/passwd"),
                ];
                let data = wasi::filesystem::preopens::get_directories()
                    .into_iter()
                    .find(|(_, path)| path == "/data")
                    .map(|(dir, _)| dir);
                for (name, target) in [("link-out", "/etc/passwd"), ("link-up", "../../..")] {
                    let made = data.as_ref().map(|d| d.symlink_at(target, name));
                    lines.push(format!("symlink {name}: {:?}", made.map(|r| r.is_ok())));
                }
                lines.push(try_read("through link-out", "/data/link-out"));
                lines.push(try_read("through link-up", "/data/link-up/etc/passwd"));
                lines.push(match std::fs::read_dir("/data/..") {
                    Ok(entries) => format!("list parent: {} entries", entries.count()),
                    Err(e) => format!("list parent: {:?}", e.kind()),
                });
                lines.push(match std::fs::write("/data/../escaped.txt", b"x") {
                    Ok(()) => "write parent: written".to_string(),
                    Err(e) => format!("write parent: {:?}", e.kind()),
                });
                let body = lines.join("\n") + "\n";
                respond(out, 200, &[], body.as_bytes());
            }
            other if other.starts_with("/files/") => {
                let name = &other["/files/".len()..];
                let path = format!("/data/{name}");
                let method = request.method();
                if matches!(method, wasi::http::types::Method::Put) {
                    let body = read_body(&request, 1 << 20);
                    match std::fs::write(&path, &body) {
                        Ok(()) => {
                            respond(out, 200, &[], format!("wrote {}", body.len()).as_bytes())
                        }
                        Err(e) => respond(out, 500, &[], format!("{:?}", e.kind()).as_bytes()),
                    }
                } else {
                    match std::fs::read(&path) {
                        Ok(bytes) => respond(out, 200, &[], &bytes),
                        Err(e) => respond(out, 404, &[], format!("{:?}", e.kind()).as_bytes()),
                    }
                }
            }
            "/spin" => loop {
                std::hint::black_box(0u64);
            },
            "/trap" => panic!("the resident was told to trap"),
            "/grow" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            _ => respond(out, 404, &[], b"no such path"),
        }
    }
}

wasi::http::proxy::export!(Resident);
