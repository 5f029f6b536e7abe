//! The resident processes through the admin address: `GET /processes`
//! (every running process and the budgets ledger), `GET
//! /processes/<class>/<name>/<pid>` and `DELETE …` (kill, idempotent;
//! answers once the process is gone). A pid is unique within its owner,
//! so a process is named by its owner and its pid. The admin token is checked before
//! any of these is reached ([`crate::admin`]).

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use weir_programs::process::Process;
use weir_programs::process_table::{Owner, ProcessTable};

use crate::admin::{error, json_response};
use crate::response_body::ServeBody;

fn describe(r: &Process) -> serde_json::Value {
    json!({
        "pid": r.pid,
        "owner": r.owner,
        "image": r.image,
        "contract": r.contract().as_str(),
        "slot": r.slot,
        "requests": r.requests(),
        "memory_bytes": r.memory_bytes(),
        "state": r.ended().map_or_else(|| "running".to_string(), |why| format!("ended: {why}")),
    })
}

fn owner(class: &str, name: &str) -> Owner {
    Owner {
        class: class.to_string(),
        name: name.to_string(),
    }
}

/// Serves `/processes…`; `rest` is the path after `/processes`.
pub async fn route(
    table: &ProcessTable,
    req: Request<Incoming>,
    rest: &str,
) -> Response<ServeBody> {
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    let pid = |s: &str| s.parse::<u64>().ok();
    match (req.method().clone(), parts.as_slice()) {
        (Method::GET, []) => {
            let (live, slots) = table.counts();
            let processes: Vec<_> = table.all().iter().map(|r| describe(r)).collect();
            json_response(&json!({
                "live": live,
                "slots": slots,
                "holders": table.ledger(),
                "processes": processes,
            }))
        }
        (Method::GET, [class, name, p]) => {
            match pid(p).and_then(|p| table.get(&owner(class, name), p)) {
                Some(r) => json_response(&describe(&r)),
                None => error(
                    StatusCode::NOT_FOUND,
                    "process_not_found",
                    "no running process with that owner and pid",
                ),
            }
        }
        (Method::DELETE, [class, name, p]) => match pid(p) {
            Some(p) => {
                let killed = match table.get(&owner(class, name), p) {
                    Some(r) => r.kill().await,
                    None => false,
                };
                json_response(&json!({ "pid": p, "killed": killed }))
            }
            None => error(StatusCode::BAD_REQUEST, "bad_request", "a pid is a number"),
        },
        (Method::GET | Method::DELETE, _) => {
            error(StatusCode::NOT_FOUND, "not_found", "no such process path")
        }
        _ => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "processes are read with GET and killed with DELETE",
        ),
    }
}
