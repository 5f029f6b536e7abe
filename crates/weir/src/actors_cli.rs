//! `weir actors list|inspect|delete`: the operators' view of a running
//! server's actors, through its admin address (the server owns the actors'
//! databases; nothing here opens them). The admin token comes from
//! `--token`, `WEIR_ADMIN_TOKEN`, or the server's data dir.

use weir_actors::operators::ActorSummary;

use crate::admin_client::{self, AdminArgs};
use crate::table::{self, Table};

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
    /// size, next timer, and in cluster mode the node that owns each.
    List {
        class: Option<String>,
        /// The server's JSON answer instead of a table.
        #[arg(long)]
        json: bool,
    },
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

/// What `GET /actors` answers (its `status` is not shown in the table).
#[derive(serde::Deserialize)]
struct Listed {
    actors: Vec<ActorSummary>,
}

/// The list as a table, and a line of totals.
fn render(actors: &[ActorSummary], now_ms: i64) -> String {
    let clustered = actors.iter().any(|a| a.owner.is_some());
    let mut headers = vec![
        "CLASS",
        "NAME",
        "STATE",
        "WAITING>",
        "STORAGE>",
        "NEXT TIMER",
    ];
    if clustered {
        headers.push("OWNER");
    }
    let mut t = Table::new(&headers);
    for a in actors {
        let mut row = vec![
            a.class.clone(),
            a.name.clone(),
            if a.live { "live" } else { "hibernated" }.to_string(),
            a.waiting.to_string(),
            table::bytes(a.storage_bytes),
            a.next_timer_ms
                .map_or_else(|| "-".to_string(), |at| table::relative(at, now_ms)),
        ];
        if clustered {
            row.push(a.owner.clone().unwrap_or_else(|| "-".to_string()));
        }
        t.row(row);
    }
    let live = actors.iter().filter(|a| a.live).count();
    let storage: u64 = actors.iter().map(|a| a.storage_bytes).sum();
    let totals = format!(
        "{}, {live} live, {} of storage{}",
        table::count(actors.len(), "actor"),
        table::bytes(storage),
        if clustered { " on this node" } else { "" }
    );
    if t.is_empty() {
        format!("{totals}\n")
    } else {
        format!("{}{totals}\n", t.render())
    }
}

pub fn run(args: ActorsArgs) -> anyhow::Result<()> {
    if let ActorsCommand::List { class, json: false } = &args.command {
        let path = match class {
            None => "/actors".to_string(),
            Some(c) => format!("/actors/{c}"),
        };
        let listed: Listed = admin_client::get(&args.admin, &path)?;
        print!("{}", render(&listed.actors, table::now_ms()));
        return Ok(());
    }
    let (method, path) = match &args.command {
        ActorsCommand::List { class: None, .. } => ("GET", "/actors".to_string()),
        ActorsCommand::List { class: Some(c), .. } => ("GET", format!("/actors/{c}")),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(name: &str, live: bool, timer: Option<i64>, owner: Option<&str>) -> ActorSummary {
        ActorSummary {
            class: "bucket".into(),
            name: name.into(),
            live,
            waiting: 0,
            storage_bytes: 2048,
            next_timer_ms: timer,
            owner: owner.map(str::to_string),
        }
    }

    #[test]
    fn one_row_per_actor_then_totals_and_the_owner_only_in_cluster_mode() {
        let one = render(
            &[
                actor("alice", true, Some(61_000), None),
                actor("bob", false, None, None),
            ],
            1_000,
        );
        assert_eq!(
            one,
            "CLASS   NAME   STATE       WAITING  STORAGE  NEXT TIMER\n\
             bucket  alice  live              0  2.0 KiB  in 1m\n\
             bucket  bob    hibernated        0  2.0 KiB  -\n\
             2 actors, 1 live, 4.0 KiB of storage\n"
        );
        let clustered = render(&[actor("alice", false, None, Some("n2"))], 0);
        assert!(
            clustered
                .starts_with("CLASS   NAME   STATE       WAITING  STORAGE  NEXT TIMER  OWNER\n")
        );
        assert!(clustered.ends_with("1 actor, 0 live, 2.0 KiB of storage on this node\n"));
        assert_eq!(render(&[], 0), "0 actors, 0 live, 0 B of storage\n");
    }
}
