//! `weir actors list|inspect|delete`: the operators' view of a running
//! server's actors, through its admin address (the server owns the actors'
//! databases; nothing here opens them). The admin token comes from
//! `--token`, `WEIR_ADMIN_TOKEN`, or the server's data dir.

use crate::admin_client::{self, AdminArgs};

#[derive(clap::Args)]
pub struct ActorsArgs {
    #[command(flatten)]
    admin: AdminArgs,
    #[command(subcommand)]
    command: ActorsCommand,
}

#[derive(clap::Subcommand)]
enum ActorsCommand {
    /// Actors of every class (or of CLASS): live or hibernated, storage
    /// size, next timer.
    List { class: Option<String> },
    /// One actor: incarnation, entries, timers, launch journal; `--keys`
    /// dumps its entries.
    Inspect {
        class: String,
        name: String,
        /// Dump the actor's key-value entries (up to 1,000 from `--start`).
        #[arg(long)]
        keys: bool,
        /// First key of the dump.
        #[arg(long, value_name = "KEY")]
        start: Option<String>,
    },
    /// Delete an actor: its instance, database and timers.
    Delete { class: String, name: String },
}

/// Encodes a query value (keys may hold any character).
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

pub fn run(args: ActorsArgs) -> anyhow::Result<()> {
    let (method, path) = match &args.command {
        ActorsCommand::List { class: None } => ("GET", "/actors".to_string()),
        ActorsCommand::List { class: Some(c) } => ("GET", format!("/actors/{c}")),
        ActorsCommand::Inspect {
            class,
            name,
            keys,
            start,
        } => {
            let mut path = format!("/actors/{class}/{name}");
            if *keys {
                path.push_str("?keys=1");
                if let Some(start) = start {
                    path.push_str(&format!("&start={}", encode(start)));
                }
            }
            ("GET", path)
        }
        ActorsCommand::Delete { class, name } => ("DELETE", format!("/actors/{class}/{name}")),
    };
    admin_client::call(&args.admin, method, &path)
}
