//! `weir processes list|inspect|kill`: the operators' view of a running
//! server's resident processes, through its admin address.

use serde_json::Value;

use crate::admin_client::{self, AdminArgs};
use crate::table::{self, Table};

#[derive(clap::Args)]
pub struct ProcessesArgs {
    #[command(flatten)]
    admin: AdminArgs,
    #[command(subcommand)]
    command: ProcessesCommand,
}

#[derive(clap::Subcommand)]
enum ProcessesCommand {
    /// Every running process: owner, pid, contract, state, requests,
    /// memory, image; `--json` adds per owner its slots, peak and images.
    List {
        /// The server's JSON answer instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One process of actor NAME of CLASS: image, slot, requests, memory.
    Inspect {
        class: String,
        name: String,
        pid: u64,
        /// The server's JSON answer instead of the view.
        #[arg(long)]
        json: bool,
    },
    /// End a process (idempotent); returns once it is gone.
    Kill {
        class: String,
        name: String,
        pid: u64,
        /// The server's JSON answer instead of a line.
        #[arg(long)]
        json: bool,
    },
}

/// `GET /processes` as a table, and a line of totals.
fn render(listed: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let number = |v: &Value| {
        v.as_u64()
            .map_or_else(|| "-".to_string(), |n| n.to_string())
    };
    let mut t = Table::new(&[
        "CLASS",
        "NAME",
        "PID>",
        "CONTRACT",
        "STATE",
        "REQUESTS>",
        "MEMORY>",
        "IMAGE",
    ]);
    let processes = listed["processes"].as_array().map_or(&[][..], |p| p);
    for p in processes {
        t.row(vec![
            text(&p["owner"]["class"]),
            text(&p["owner"]["name"]),
            number(&p["pid"]),
            text(&p["contract"]),
            text(&p["state"]),
            number(&p["requests"]),
            p["memory_bytes"]
                .as_u64()
                .map_or_else(|| "-".to_string(), table::bytes),
            table::short_digest(p["image"].as_str().unwrap_or("-")),
        ]);
    }
    let slots = listed["slots"].as_u64().unwrap_or(0) as usize;
    let totals = format!(
        "{} running, {} held",
        table::count(processes.len(), "process"),
        table::count(slots, "slot")
    );
    if t.is_empty() {
        format!("{totals}\n")
    } else {
        format!("{}{totals}\n", t.render())
    }
}

/// One process: a fact a line, its image digest whole.
fn render_one(p: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let facts = [
        (
            "process",
            format!(
                "{}/{} {}",
                text(&p["owner"]["class"]),
                text(&p["owner"]["name"]),
                p["pid"]
            ),
        ),
        ("contract", text(&p["contract"])),
        ("state", text(&p["state"])),
        ("image", text(&p["image"])),
        ("slot", p["slot"].to_string()),
        ("requests", p["requests"].to_string()),
        (
            "memory",
            p["memory_bytes"]
                .as_u64()
                .map_or_else(|| "-".to_string(), table::bytes),
        ),
    ];
    facts
        .iter()
        .map(|(label, value)| format!("{label:<9} {}\n", table::shown(value)))
        .collect()
}

/// What a kill did, in a line.
fn render_kill(class: &str, name: &str, answer: &Value) -> String {
    let pid = &answer["pid"];
    if answer["killed"] == true {
        format!("process {class}/{name} {pid} killed\n")
    } else {
        format!("process {class}/{name} {pid} was not running (nothing to kill)\n")
    }
}

pub fn run(args: ProcessesArgs) -> anyhow::Result<()> {
    let (class, name, pid, json, method) = match &args.command {
        ProcessesCommand::List { json: true } => {
            return admin_client::call(&args.admin, "GET", "/processes");
        }
        ProcessesCommand::List { json: false } => {
            let listed: Value = admin_client::get(&args.admin, "/processes")?;
            print!("{}", render(&listed));
            return Ok(());
        }
        ProcessesCommand::Inspect {
            class,
            name,
            pid,
            json,
        } => (class, name, pid, *json, "GET"),
        ProcessesCommand::Kill {
            class,
            name,
            pid,
            json,
        } => (class, name, pid, *json, "DELETE"),
    };
    let path = format!("/processes/{class}/{name}/{pid}");
    if json {
        return admin_client::call(&args.admin, method, &path);
    }
    let answer: Value = admin_client::send(&args.admin, method, &path)?;
    match method {
        "GET" => print!("{}", render_one(&answer)),
        _ => print!("{}", render_kill(class, name, &answer)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One process as the server describes it.
    fn sample() -> Value {
        serde_json::json!({
            "contract": "boot",
            "image": "sha256:6db19a4e192ff3ac98d379c04e6ff93b9926a217fb4510586019bcbbbb716a21",
            "memory_bytes": 1376256,
            "owner": {"class": "runner", "name": "owner"},
            "pid": 1000001, "requests": 3, "slot": 0, "state": "running"
        })
    }

    #[test]
    fn one_row_per_process_then_totals() {
        let listed = serde_json::json!({
            "live": 1, "slots": 2, "holders": [], "processes": [sample()]
        });
        assert_eq!(
            render(&listed),
            "CLASS   NAME       PID  CONTRACT  STATE    REQUESTS   MEMORY  IMAGE\n\
             runner  owner  1000001  boot      running         3  1.3 MiB  6db19a4e192f\n\
             1 process running, 2 slots held\n"
        );
        assert_eq!(
            render(&serde_json::json!({"slots": 0, "processes": []})),
            "0 processes running, 0 slots held\n"
        );
    }

    #[test]
    fn one_process_a_fact_a_line_and_a_kill_in_a_line() {
        assert_eq!(
            render_one(&sample()),
            "process   runner/owner 1000001\n\
             contract  boot\n\
             state     running\n\
             image     sha256:6db19a4e192ff3ac98d379c04e6ff93b9926a217fb4510586019bcbbbb716a21\n\
             slot      0\n\
             requests  3\n\
             memory    1.3 MiB\n"
        );
        let killed = serde_json::json!({"pid": 7, "killed": true});
        assert_eq!(
            render_kill("runner", "owner", &killed),
            "process runner/owner 7 killed\n"
        );
        let gone = serde_json::json!({"pid": 7, "killed": false});
        assert_eq!(
            render_kill("runner", "owner", &gone),
            "process runner/owner 7 was not running (nothing to kill)\n"
        );
    }
}
