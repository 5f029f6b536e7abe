//! `weir actors list|inspect|delete`: the operators' view of a running
//! server's actors, through its admin address (the server owns the actors'
//! databases; nothing here opens them). The admin token comes from
//! `--token`, `WEIR_ADMIN_TOKEN`, or the server's data dir.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

use crate::config::UsageError;

#[derive(clap::Args)]
pub struct ActorsArgs {
    /// The server's admin address (`weir serve --admin ADDR`).
    #[arg(
        long,
        value_name = "ADDR",
        global = true,
        default_value = "127.0.0.1:9090"
    )]
    admin: SocketAddr,
    /// The server's data dir, where its admin token is (`admin-token`).
    #[arg(long, value_name = "DIR", global = true, default_value = ".weir")]
    data_dir: PathBuf,
    /// The admin token itself (else `WEIR_ADMIN_TOKEN`, else the data dir's).
    #[arg(
        long,
        value_name = "TOKEN",
        global = true,
        env = "WEIR_ADMIN_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    #[command(subcommand)]
    command: ActorsCommand,
}

#[derive(clap::Subcommand)]
enum ActorsCommand {
    /// Actors of every class (or of CLASS): live or hibernated, storage
    /// size, next timer.
    List { class: Option<String> },
    /// One actor: incarnation, entries, timers; `--keys` dumps its entries.
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
    let token = match args.token {
        Some(token) => token,
        None => weir_store::data_dir::read_admin_token(&args.data_dir).map_err(|e| {
            UsageError(format!(
                "no admin token: cannot read {}/{} ({e}); pass --data-dir, --token or WEIR_ADMIN_TOKEN",
                args.data_dir.display(),
                weir_store::data_dir::TOKEN_FILE
            ))
        })?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (status, body) = runtime.block_on(request(args.admin, method, &path, &token))?;
    let text = String::from_utf8_lossy(&body);
    let pretty = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| text.to_string());
    if status >= 400 {
        if status == 404 || status == 400 || status == 401 {
            return Err(UsageError(pretty).into());
        }
        bail!("{status}: {pretty}");
    }
    println!("{pretty}");
    Ok(())
}

async fn request(
    admin: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
) -> anyhow::Result<(u16, Bytes)> {
    let stream = tokio::net::TcpStream::connect(admin)
        .await
        .with_context(|| {
            format!(
                "cannot reach the admin address {admin} (is `weir serve --admin {admin}` running?)"
            )
        })?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, admin.to_string())
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body))
}
