//! `weir processes list|inspect|kill`: the operators' view of a running
//! server's resident processes, through its admin address.

use crate::admin_client::{self, AdminArgs};

#[derive(clap::Args)]
pub struct ProcessesArgs {
    #[command(flatten)]
    admin: AdminArgs,
    #[command(subcommand)]
    command: ProcessesCommand,
}

#[derive(clap::Subcommand)]
enum ProcessesCommand {
    /// Every running process, and per owner its slots, pids, peak, memory
    /// and the images it holds.
    List,
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

pub fn run(args: ProcessesArgs) -> anyhow::Result<()> {
    let (method, path) = match &args.command {
        ProcessesCommand::List => ("GET", "/processes".to_string()),
        ProcessesCommand::Inspect { class, name, pid } => {
            ("GET", format!("/processes/{class}/{name}/{pid}"))
        }
        ProcessesCommand::Kill { class, name, pid } => {
            ("DELETE", format!("/processes/{class}/{name}/{pid}"))
        }
    };
    admin_client::call(&args.admin, method, &path)
}
