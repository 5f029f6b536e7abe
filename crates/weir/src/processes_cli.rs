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
    },
    /// End a process (idempotent); returns once it is gone.
    Kill {
        class: String,
        name: String,
        pid: u64,
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

pub fn run(args: ProcessesArgs) -> anyhow::Result<()> {
    if let ProcessesCommand::List { json: false } = &args.command {
        let listed: Value = admin_client::get(&args.admin, "/processes")?;
        print!("{}", render(&listed));
        return Ok(());
    }
    let (method, path) = match &args.command {
        ProcessesCommand::List { .. } => ("GET", "/processes".to_string()),
        ProcessesCommand::Inspect { class, name, pid } => {
            ("GET", format!("/processes/{class}/{name}/{pid}"))
        }
        ProcessesCommand::Kill { class, name, pid } => {
            ("DELETE", format!("/processes/{class}/{name}/{pid}"))
        }
    };
    admin_client::call(&args.admin, method, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_per_process_then_totals() {
        let listed = serde_json::json!({
            "live": 1, "slots": 2, "holders": [],
            "processes": [{
                "contract": "boot",
                "image": "sha256:6db19a4e192ff3ac98d379c04e6ff93b9926a217fb4510586019bcbbbb716a21",
                "memory_bytes": 1376256,
                "owner": {"class": "runner", "name": "owner"},
                "pid": 1000001, "requests": 3, "slot": 0, "state": "running"
            }]
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
}
