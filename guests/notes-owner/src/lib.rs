//! The owner of a durable app. `POST /deploy/<digest>` remembers the image
//! and starts it as a resident process with the durable storage slot
//! `notes`; every other request is routed to that process as it came.
//! After a crash of the server, Weir starts the app again by itself (its
//! launch was journaled) and tells the owner its new pid
//! (`weir:process/supervisor`) before any request arrives; if it is gone
//! otherwise (killed, failed), the next request starts it again over the
//! same slot. Either way the notes are still there.

use wasi::http::types::{IncomingRequest, ResponseOutparam};
use weir_guest::actor::storage;
use weir_guest::http::{forward, respond};
use weir_guest::process::{processes, RecoveryOutcome, SpawnSpec, State, StorageSlot};

const MAX_BODY: usize = 1 << 20;

struct Owner;

/// Starts the app from `image` over the `notes` slot; remembers its pid.
fn start(image: &str) -> Result<u64, String> {
    let spawned = processes::spawn(&SpawnSpec {
        image: image.to_string(),
        contract: None,
        args: Vec::new(),
        env: Vec::new(),
        secret_env: Vec::new(),
        start_args: Vec::new(),
        storage: Some(StorageSlot {
            name: "notes".into(),
            durable: true,
        }),
        on_crash: None,
    })
    .map_err(|e| format!("{e:?}"))?;
    storage::put("pid", &spawned.pid).map_err(|e| e.to_string())?;
    Ok(spawned.pid)
}

/// After a crash: the app is back under `new`, or lost (the next request
/// starts it again).
fn recovered(_old: u64, new: Option<u64>, outcome: RecoveryOutcome) -> Result<(), String> {
    match (outcome, new) {
        (RecoveryOutcome::Restarted, Some(pid)) => storage::put("pid", &pid),
        _ => storage::delete("pid").map(drop),
    }
    .map_err(|e| e.to_string())
}

weir_guest::supervisor!(recovered);

/// The running app's pid, starting it if it is not running.
fn running() -> Result<u64, String> {
    if let Some(pid) = storage::get::<u64>("pid").map_err(|e| e.to_string())? {
        // `status` also answers for a process that ended a moment ago
        // (killed, failed): only a running one is reached.
        if processes::status(pid).is_ok_and(|info| matches!(info.state, State::Running)) {
            return Ok(pid);
        }
    }
    // After a crash, Weir has started it again under a new pid.
    if let Some(process) = processes::list().map_err(|e| format!("{e:?}"))?.first() {
        storage::put("pid", &process.pid).map_err(|e| e.to_string())?;
        return Ok(process.pid);
    }
    let image: String = storage::get("image")
        .map_err(|e| e.to_string())?
        .ok_or("nothing deployed: POST /deploy/<digest> first")?;
    start(&image)
}

impl wasi::exports::http::incoming_handler::Guest for Owner {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = request.path_with_query().unwrap_or_default();
        let text = [("content-type", b"text/plain".as_slice())];
        if let Some(image) = path.strip_prefix("/deploy/") {
            let _ = storage::put("image", &image.to_string());
            if let Some(old) = storage::get::<u64>("pid").ok().flatten() {
                let _ = processes::kill(old);
            }
            return match start(image) {
                Ok(pid) => respond(
                    out,
                    200,
                    &text,
                    format!("deployed as pid {pid}\n").as_bytes(),
                ),
                Err(e) => respond(out, 502, &text, format!("{e}\n").as_bytes()),
            };
        }
        let pid = match running() {
            Ok(pid) => pid,
            Err(e) => return respond(out, 503, &text, format!("{e}\n").as_bytes()),
        };
        forward(
            &request,
            out,
            &format!("{pid}.process.internal"),
            &path,
            MAX_BODY,
        );
    }
}

wasi::http::proxy::export!(Owner);
