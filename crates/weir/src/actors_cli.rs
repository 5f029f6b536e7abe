//! `weir actors list|inspect|delete`: the operators' view of a running
//! server's actors, through its admin address (the server owns the actors'
//! databases; nothing here opens them). The admin token comes from
//! `--token`, `WEIR_ADMIN_TOKEN`, or the server's data dir.

use std::fmt::Write as _;

use weir_actors::operators::{
    ActorDetail, ActorSummary, EntryView, MAX_INSPECT_ENTRIES, MAX_LIST_PAGE,
};

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
    /// The table holds every actor (read a page at a time); with
    /// `--limit`, one page.
    List {
        class: Option<String>,
        /// The server's JSON answer instead of a table: one page, whose
        /// `next` is the `--after` of the page after it.
        #[arg(long)]
        json: bool,
        /// Start after this actor (`NAME`, or `CLASS/NAME` without CLASS).
        #[arg(long, value_name = "ACTOR")]
        after: Option<String>,
        /// One page of at most this many actors (1 to 10,000).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
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
        /// The server's JSON answer instead of the view.
        #[arg(long)]
        json: bool,
    },
    /// Delete an actor: its instance, database and timers.
    Delete { class: String, name: String },
}

/// One page of what `GET /actors` answers (its `status` is not shown in
/// the table).
#[derive(serde::Deserialize)]
struct Listed {
    actors: Vec<ActorSummary>,
    /// Where the next page starts, when there is one.
    next: Option<String>,
}

/// The listing's path for the page after `after`, of at most `limit`.
fn list_path(class: Option<&str>, after: Option<&str>, limit: Option<usize>) -> String {
    let mut path = match class {
        None => "/actors".to_string(),
        Some(c) => format!("/actors/{c}"),
    };
    let mut query = Vec::new();
    if let Some(after) = after {
        query.push(format!("after={}", admin_client::encode(after)));
    }
    if let Some(limit) = limit {
        query.push(format!("limit={limit}"));
    }
    if !query.is_empty() {
        path = format!("{path}?{}", query.join("&"));
    }
    path
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

/// Characters of a value the view shows; the rest is cut (`--json` has
/// it whole): a line stays readable at a terminal.
const VALUE_CHARS: usize = 60;

/// A value as the view shows it: text quoted and escaped, bytes as hex,
/// cut to [`VALUE_CHARS`].
fn value(entry: &EntryView) -> String {
    let shown = match (&entry.text, &entry.hex) {
        (Some(text), _) => format!("{text:?}"),
        (None, Some(hex)) => format!("0x{hex}"),
        (None, None) => "-".to_string(),
    };
    if shown.chars().count() > VALUE_CHARS {
        let cut: String = shown.chars().take(VALUE_CHARS - 1).collect();
        format!("{cut}…")
    } else {
        shown
    }
}

/// One actor: its facts, then its timers, its launch journal and (when
/// asked for) its entries, each a table.
fn render_detail(d: &ActorDetail, now_ms: i64) -> String {
    let s = &d.summary;
    let mut out = String::new();
    let mut fact = |label: &str, value: String| {
        let _ = writeln!(out, "{label:<12} {}", table::shown(&value));
    };
    fact("actor", format!("{}/{}", s.class, s.name));
    fact(
        "state",
        format!(
            "{}, {} waiting",
            if s.live { "live" } else { "hibernated" },
            s.waiting
        ),
    );
    if let Some(owner) = &s.owner {
        fact("owner", owner.clone());
    }
    fact("incarnation", d.incarnation.to_string());
    fact("entries", d.entries.to_string());
    fact("storage", table::bytes(s.storage_bytes));
    let mut timers = Table::new(&["TIMER", "DUE", "RETRIES>"]);
    for t in &d.timers {
        timers.row(vec![
            t.reason.clone(),
            table::relative(t.at_ms, now_ms),
            t.attempt.to_string(),
        ]);
    }
    let mut launches = Table::new(&["PID>", "CONTRACT", "IMAGE", "ON CRASH", "RE-DRIVES>"]);
    for l in &d.launches {
        let field = |name: &str| l.spec[name].as_str().unwrap_or("-").to_string();
        launches.row(vec![
            l.pid.to_string(),
            field("contract"),
            table::short_digest(&field("image")),
            field("on_crash").replace('_', " "),
            l.attempt.to_string(),
        ]);
    }
    // Each table, what stands in for it when empty, and a line after it.
    let mut sections = vec![
        (timers, "no timers", None),
        (launches, "no launches journaled", None),
    ];
    if let Some(keys) = &d.keys {
        let mut entries = Table::new(&["KEY", "BYTES>", "VALUE"]);
        for e in keys {
            entries.row(vec![format!("{:?}", e.key), e.bytes.to_string(), value(e)]);
        }
        let more = (keys.len() as u32 >= MAX_INSPECT_ENTRIES).then(|| {
            format!(
                "the first {} keys from the start asked for; --start KEY shows those from KEY on",
                keys.len()
            )
        });
        sections.push((entries, "no entries", more));
    }
    for (table, empty, after) in sections {
        out.push('\n');
        if table.is_empty() {
            let _ = writeln!(out, "{empty}");
        } else {
            out.push_str(&table.render());
        }
        if let Some(after) = after {
            let _ = writeln!(out, "{after}");
        }
    }
    out
}

pub fn run(args: ActorsArgs) -> anyhow::Result<()> {
    let (method, path) = match &args.command {
        ActorsCommand::List {
            class,
            json,
            after,
            limit,
        } => {
            let class = class.as_deref();
            if *json {
                ("GET", list_path(class, after.as_deref(), *limit))
            } else {
                // Every page, each as large as the server allows: a page
                // reads its class's directory of names, so fewer pages are
                // fewer reads of it.
                let page_limit = limit.unwrap_or(MAX_LIST_PAGE);
                let mut actors = Vec::new();
                let mut after = after.clone();
                let more = loop {
                    let path = list_path(class, after.as_deref(), Some(page_limit));
                    let page: Listed = admin_client::get(&args.admin, &path)?;
                    actors.extend(page.actors);
                    match page.next {
                        Some(next) if limit.is_none() => after = Some(next),
                        more => break more,
                    }
                };
                print!("{}", render(&actors, table::now_ms()));
                if let Some(next) = more {
                    println!("more after {next} (--after {next})");
                }
                return Ok(());
            }
        }
        ActorsCommand::Inspect {
            class,
            name,
            keys,
            start,
            json,
        } => {
            let mut path = format!("/actors/{class}/{name}");
            if *keys {
                path.push_str("?keys=1");
                if let Some(start) = start {
                    path.push_str(&format!("&start={}", admin_client::encode(start)));
                }
            }
            if !json {
                let detail: ActorDetail = admin_client::get(&args.admin, &path)?;
                print!("{}", render_detail(&detail, table::now_ms()));
                return Ok(());
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

    #[test]
    fn one_actor_as_facts_then_its_timers_launches_and_entries() {
        use weir_actors::operators::{LaunchView, TimerView};
        let mut detail = ActorDetail {
            summary: actor("alice", false, Some(61_000), Some("n2")),
            incarnation: 3,
            entries: 2,
            timers: vec![TimerView {
                reason: "alarm".into(),
                at_ms: 61_000,
                attempt: 1,
            }],
            launches: vec![LaunchView {
                pid: 3_000_001,
                attempt: 0,
                spec: serde_json::json!({
                    "image": "sha256:6db19a4e192ff3ac98d379c04e6ff93b9926a217fb4510586019bcbbbb716a21",
                    "contract": "boot",
                    "on_crash": "restart_once",
                }),
            }],
            keys: Some(vec![
                EntryView {
                    key: "greeting".into(),
                    text: Some("hi\n".into()),
                    hex: None,
                    bytes: 3,
                },
                EntryView {
                    key: "blob".into(),
                    text: None,
                    hex: Some("ff".repeat(40)),
                    bytes: 40,
                },
            ]),
        };
        assert_eq!(
            render_detail(&detail, 1_000),
            format!(
                "actor        bucket/alice\n\
                 state        hibernated, 0 waiting\n\
                 owner        n2\n\
                 incarnation  3\n\
                 entries      2\n\
                 storage      2.0 KiB\n\
                 \n\
                 TIMER  DUE    RETRIES\n\
                 alarm  in 1m        1\n\
                 \n\
                 \x20   PID  CONTRACT  IMAGE         ON CRASH      RE-DRIVES\n\
                 3000001  boot      6db19a4e192f  restart once          0\n\
                 \n\
                 KEY         BYTES  VALUE\n\
                 \"greeting\"      3  \"hi\\n\"\n\
                 \"blob\"         40  0x{}…\n",
                "f".repeat(57)
            )
        );
        detail.summary.owner = None;
        detail.timers.clear();
        detail.launches.clear();
        detail.keys = None;
        assert_eq!(
            render_detail(&detail, 0),
            "actor        bucket/alice\n\
             state        hibernated, 0 waiting\n\
             incarnation  3\n\
             entries      2\n\
             storage      2.0 KiB\n\
             \n\
             no timers\n\
             \n\
             no launches journaled\n"
        );
    }
}
