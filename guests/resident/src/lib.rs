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
//! | `POST /fill?how=H&n=N` | tries to fill `/data`: `write` appends N chunks of 1 MiB to `big`, `files` makes N empty files, `dirs` N directories (numbered from `from`, 0 unless given), `sparse` sets `sparse`'s length to N MiB, `rewrite` writes `big`'s first N MiB over again in place, `churn` runs N rounds of every way to grow and shrink files (positional and stream writes over and past the end, appends, a rename over a file, a hard link, a file made through a dangling link, sizes set down and up, a file unlinked while open), each round leaving nothing, `orphans` writes N files of 1 MiB, unlinking each and keeping it open, `let-go` closes those, `clear` removes everything; answers `{done, error}`: how many steps worked and the first error's kind |
//! | `/call?authority=A&path=P` | GETs `http://A/P` (P without its leading `/`): `ok STATUS BODY`, or `refused ERROR` |
//! | `/spin` | never answers |
//! | `/trap` | traps |
//! | `/grow` | allocates 1 MiB after 1 MiB until refused |
//!
//! `start` fails when its argument is `fail`. With a storage slot, each
//! start appends a line to `/data/starts.log` (what the crash tests count);
//! with the argument `slow-redrive`, a start that finds lines there already
//! (a re-drive) then sleeps 3 s; with `slow-first`, only a start that
//! finds none (the first) does; with `slow`, every start does.

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
    /// Files `/fill?how=orphans` unlinked and keeps open.
    static ORPHANS: RefCell<Vec<std::fs::File>> = const { RefCell::new(Vec::new()) };
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
            if (args == "slow-redrive" && !before.is_empty())
                || (args == "slow-first" && before.is_empty())
                || args == "slow"
            {
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
            "/fill" => {
                let query = path.split_once('?').map_or("", |(_, q)| q);
                let param = |k: &str| {
                    query
                        .split('&')
                        .filter_map(|p| p.split_once('='))
                        .find(|(key, _)| *key == k)
                        .map(|(_, v)| v.to_string())
                };
                let n: u64 = param("n").and_then(|v| v.parse().ok()).unwrap_or(1);
                let how = param("how").unwrap_or_default();
                let from: u64 = param("from").and_then(|v| v.parse().ok()).unwrap_or(0);
                let (done, error) = fill(&how, n, from);
                let body = format!("{{\"done\":{done},\"error\":{}}}", match error {
                    Some(e) => format!("\"{e}\""),
                    None => "null".to_string(),
                });
                respond(out, 200, &[("content-type", b"application/json")], body.as_bytes());
            }
            "/call" => {
                let arg = |name: &str| {
                    query
                        .split('&')
                        .find_map(|p| p.strip_prefix(name)?.strip_prefix('='))
                        .unwrap_or_default()
                        .to_string()
                };
                let said = match weir_guest::http::send(
                    "GET",
                    &arg("authority"),
                    &format!("/{}", arg("path")),
                    b"",
                ) {
                    Ok(reply) => format!(
                        "ok {} {}",
                        reply.status,
                        String::from_utf8_lossy(&reply.body)
                    ),
                    Err(e) => format!("refused {e}"),
                };
                respond(out, 200, &[], said.as_bytes());
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

/// One way of filling `/data`, N steps: how many worked, and the first
/// error's kind.
fn fill(how: &str, n: u64, from: u64) -> (u64, Option<String>) {
    use std::io::{Seek, SeekFrom, Write};
    let kind = |e: std::io::Error| Some(format!("{:?}", e.kind()));
    let chunk = vec![7u8; 1 << 20];
    match how {
        "write" => {
            let mut file = match std::fs::OpenOptions::new().create(true).append(true).open("/data/big") {
                Ok(f) => f,
                Err(e) => return (0, kind(e)),
            };
            for i in 0..n {
                if let Err(e) = file.write_all(&chunk).and_then(|()| file.flush()) {
                    return (i, kind(e));
                }
            }
            (n, None)
        }
        "rewrite" => {
            let mut file = match std::fs::OpenOptions::new().write(true).open("/data/big") {
                Ok(f) => f,
                Err(e) => return (0, kind(e)),
            };
            for i in 0..n {
                let done = file
                    .seek(SeekFrom::Start(i << 20))
                    .and_then(|_| file.write_all(&chunk));
                if let Err(e) = done {
                    return (i, kind(e));
                }
            }
            (n, None)
        }
        "files" | "dirs" => {
            for i in 0..n {
                let path = format!("/data/{how}-{}", from + i);
                let made = if how == "files" {
                    std::fs::File::create(&path).map(drop)
                } else {
                    std::fs::create_dir(&path)
                };
                if let Err(e) = made {
                    return (i, kind(e));
                }
            }
            (n, None)
        }
        "sparse" => {
            let file = match std::fs::File::create("/data/sparse") {
                Ok(f) => f,
                Err(e) => return (0, kind(e)),
            };
            match file.set_len(n << 20) {
                Ok(()) => (1, None),
                Err(e) => (0, kind(e)),
            }
        }
        "churn" => {
            for i in 0..n {
                if let Err(e) = churn() {
                    return (i, Some(format!("{e:?}")));
                }
            }
            (n, None)
        }
        // Fill, unlink, keep open: each step writes 1 MiB into a new file,
        // unlinks it and keeps it open (its bytes stay on the disk);
        // `let-go` closes them all.
        "orphans" => {
            for i in 0..n {
                let path = format!("/data/orphan-{i}");
                let kept = std::fs::File::create(&path).and_then(|mut file| {
                    let written = file.write_all(&chunk).and_then(|()| file.flush());
                    std::fs::remove_file(&path)?;
                    written.map(|()| file)
                });
                match kept {
                    Ok(file) => ORPHANS.with(|o| o.borrow_mut().push(file)),
                    Err(e) => return (i, kind(e)),
                }
            }
            (n, None)
        }
        "let-go" => {
            let held = ORPHANS.with(|o| std::mem::take(&mut *o.borrow_mut()));
            (held.len() as u64, None)
        }
        "clear" => {
            let mut removed = 0;
            for entry in std::fs::read_dir("/data").into_iter().flatten().flatten() {
                let path = entry.path();
                let gone = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                if let Err(e) = gone {
                    return (removed, kind(e));
                }
                removed += 1;
            }
            (removed, None)
        }
        _ => (0, Some("unknown".to_string())),
    }
}

/// One round of `churn`, through `wasi:filesystem` directly: what it
/// makes, it removes.
fn churn() -> Result<(), wasi::filesystem::types::ErrorCode> {
    use wasi::filesystem::types::{DescriptorFlags as D, OpenFlags as O, PathFlags as P};
    let data = wasi::filesystem::preopens::get_directories()
        .into_iter()
        .find(|(_, path)| path == "/data")
        .map(|(dir, _)| dir)
        .ok_or(wasi::filesystem::types::ErrorCode::NoEntry)?;
    let rw = D::READ | D::WRITE;
    let stream_write = |stream: wasi::io::streams::OutputStream, bytes: &[u8]| {
        for chunk in bytes.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|_| wasi::filesystem::types::ErrorCode::Io)?;
        }
        Ok::<(), wasi::filesystem::types::ErrorCode>(())
    };
    let a = data.open_at(P::empty(), "a", O::CREATE, rw)?;
    a.write(&[1; 65536], 0)?;
    a.write(&[1; 65536], 32768)?;
    stream_write(a.write_via_stream(0)?, &[2; 65536])?;
    stream_write(a.write_via_stream(90000)?, &[2; 20000])?;
    let b = data.open_at(P::empty(), "b", O::CREATE, rw)?;
    stream_write(b.append_via_stream()?, &[3; 65536])?;
    data.rename_at("b", &data, "a")?;
    data.link_at(P::empty(), "a", &data, "c")?;
    data.unlink_file_at("a")?;
    data.symlink_at("d", "l")?;
    let d = data.open_at(P::SYMLINK_FOLLOW, "l", O::CREATE, rw)?;
    d.write(&[4; 4096], 0)?;
    let c = data.open_at(P::empty(), "c", O::empty(), rw)?;
    c.set_size(0)?;
    c.set_size(100_000)?;
    c.set_size(10)?;
    let x = data.open_at(P::empty(), "x", O::CREATE, rw)?;
    x.write(&[5; 50_000], 0)?;
    data.unlink_file_at("x")?;
    x.set_size(0)?;
    let t = data.open_at(P::empty(), "t", O::CREATE | O::TRUNCATE, rw)?;
    t.write(&[6; 30_000], 0)?;
    drop(t);
    data.open_at(P::empty(), "t", O::TRUNCATE, rw)?;
    data.create_directory_at("e")?;
    data.remove_directory_at("e")?;
    for name in ["c", "d", "l", "t"] {
        data.unlink_file_at(name)?;
    }
    Ok(())
}

wasi::http::proxy::export!(Resident);
