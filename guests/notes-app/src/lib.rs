//! A notes server with its own files: `PUT /notes/<name>` keeps the body as
//! `/data/<name>`, `GET /notes/<name>` gives it back, `GET /notes` lists
//! them. It boots once (`start` makes sure `/data` is there and says how
//! many notes it found); run it as a resident process with a durable
//! storage slot and its notes outlive the process.

use wasi::http::types::{IncomingRequest, Method, ResponseOutparam};
use weir_guest::http::{read_body, respond};

mod boot_bindings {
    wit_bindgen::generate!({
        path: "../../wit/weir-process",
        world: "weir:process/resident",
    });
}

/// Largest note kept.
const MAX_NOTE_BYTES: usize = 1 << 20;

struct Notes;

fn valid(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/data")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

impl boot_bindings::exports::weir::process::boot::Guest for Notes {
    fn start(_args: Vec<u8>) -> Result<Vec<u8>, String> {
        std::fs::read_dir("/data").map_err(|e| format!("no storage slot at /data: {e}"))?;
        Ok(format!("{} notes", names().len()).into_bytes())
    }
}

boot_bindings::export!(Notes with_types_in boot_bindings);

impl wasi::exports::http::incoming_handler::Guest for Notes {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let text = [("content-type", b"text/plain".as_slice())];
        if path == "/notes" {
            let list = names().join("\n");
            return respond(out, 200, &text, list.as_bytes());
        }
        let Some(name) = path.strip_prefix("/notes/").filter(|n| valid(n)) else {
            return respond(out, 404, &text, b"no such path\n");
        };
        let file = format!("/data/{name}");
        match request.method() {
            Method::Put => {
                let body = read_body(&request, MAX_NOTE_BYTES);
                match std::fs::write(&file, &body) {
                    Ok(()) => respond(out, 201, &text, b"kept\n"),
                    Err(e) => respond(out, 500, &text, format!("{e}\n").as_bytes()),
                }
            }
            Method::Get => match std::fs::read(&file) {
                Ok(note) => respond(out, 200, &text, &note),
                Err(_) => respond(out, 404, &text, b"no such note\n"),
            },
            _ => respond(out, 405, &text, b"GET or PUT\n"),
        }
    }
}

wasi::http::proxy::export!(Notes);
