//! The operators' commands' one way to a running server: through its admin
//! address, with its admin token (`--token-file`, `WEIR_ADMIN_TOKEN`, or
//! the data dir's `admin-token`), printing the JSON answer, or reading it
//! for a command that shows it as a table ([`crate::table`]). `weir
//! actors`, `weir processes`, `weir apps` and `weir deploy` are its
//! callers; nothing here opens the server's data.
//!
//! Invariant owned here: the token goes only where a Weir server said it
//! listens (`--admin`, or the address the server holding the data dir
//! recorded there), never to an address merely guessed, and it is never
//! taken from the command line, where every user reads it.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::config::UsageError;

/// Where the server is and how to prove the caller is its operator.
#[derive(clap::Args)]
pub struct AdminArgs {
    /// The server's admin address (`weir serve --admin ADDR`); else the
    /// one the server running on `--data-dir` recorded there.
    #[arg(long, value_name = "ADDR", global = true)]
    admin: Option<SocketAddr>,
    /// The server's data dir, where its admin token is (`admin-token`).
    #[arg(long, value_name = "DIR", global = true, default_value = ".weir")]
    data_dir: PathBuf,
    /// A file that holds the admin token (else `WEIR_ADMIN_TOKEN`, else
    /// the data dir's `admin-token`).
    #[arg(long, value_name = "FILE", global = true)]
    token_file: Option<PathBuf>,
    /// Refused: a token on the command line is visible to every user.
    #[arg(long, value_name = "TOKEN", global = true, hide = true)]
    token: Option<String>,
    /// On a server of several apps: the app whose actors or processes are
    /// meant.
    #[arg(long, value_name = "NAME", global = true)]
    app: Option<String>,
}

/// `value` encoded for a query string (as the admin address decodes it:
/// a space is `+`, and a `+` of the value's own is `%2B`).
pub fn encode(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// Sends `method path` to the admin address and prints the answer;
/// a 400, 401 or 404 is a usage error (exit 2), another failure exits 1.
pub fn call(args: &AdminArgs, method: &str, path: &str) -> anyhow::Result<()> {
    call_with(args, method, path, Bytes::new())
}

/// [`call`] with a request body.
pub fn call_with(args: &AdminArgs, method: &str, path: &str, body: Bytes) -> anyhow::Result<()> {
    let answer = answer(args, method, path, body)?;
    println!("{}", pretty(&answer));
    Ok(())
}

/// `GET path`, its answer read as a `T` (for a command that shows it its
/// own way); fails as [`call`] does.
pub fn get<T: serde::de::DeserializeOwned>(args: &AdminArgs, path: &str) -> anyhow::Result<T> {
    send(args, "GET", path)
}

/// `method path` with no body, its answer read as a `T`; fails as
/// [`call`] does.
pub fn send<T: serde::de::DeserializeOwned>(
    args: &AdminArgs,
    method: &str,
    path: &str,
) -> anyhow::Result<T> {
    let answer = answer(args, method, path, Bytes::new())?;
    serde_json::from_slice(&answer).with_context(|| {
        format!(
            "the server's answer to {method} {path} is not what this build reads (is it a build of another version?): {}",
            String::from_utf8_lossy(&answer)
        )
    })
}

/// The answer's body, indented if it is JSON.
fn pretty(body: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
    {
        Some(json) => crate::table::shown_json(&json),
        None => crate::table::shown(&String::from_utf8_lossy(body)),
    }
}

/// Sends `method path` with the admin token; the body of a success, or
/// the error the answer names.
fn answer(args: &AdminArgs, method: &str, path: &str, body: Bytes) -> anyhow::Result<Bytes> {
    let path = match &args.app {
        Some(app) if path.contains('?') => format!("{path}&app={app}"),
        Some(app) => format!("{path}?app={app}"),
        None => path.to_string(),
    };
    if args.token.is_some() {
        return Err(UsageError(
            "--token puts the admin token where every user of this machine reads it (/proc/*/cmdline): give --token-file FILE or WEIR_ADMIN_TOKEN instead".into(),
        )
        .into());
    }
    let token = match (&args.token_file, std::env::var("WEIR_ADMIN_TOKEN")) {
        (Some(file), _) => std::fs::read_to_string(file)
            .map(|t| t.trim().to_string())
            .map_err(|e| {
                UsageError(format!("cannot read the admin token in {}: {e}", file.display()))
            })?,
        (None, Ok(token)) if !token.trim().is_empty() => token.trim().to_string(),
        _ => weir_store::data_dir::read_admin_token(&args.data_dir).map_err(|e| {
            UsageError(format!(
                "no admin token: cannot read {}/{} ({e}); pass --data-dir, --token-file or WEIR_ADMIN_TOKEN",
                args.data_dir.display(),
                weir_store::data_dir::TOKEN_FILE
            ))
        })?,
    };
    let admin = match args.admin {
        Some(admin) => admin,
        None => weir_store::data_dir::admin_address(&args.data_dir).ok_or_else(|| {
            UsageError(format!(
                "no admin address: no server running on {} recorded one; pass --admin ADDR (the server's `--admin`)",
                args.data_dir.display()
            ))
        })?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (status, body) = runtime.block_on(request(admin, method, &path, &token, body))?;
    if status >= 400 {
        let pretty = pretty(&body);
        if status == 404 || status == 400 || status == 401 {
            return Err(UsageError(pretty).into());
        }
        bail!("{status}: {pretty}");
    }
    Ok(body)
}

async fn request(
    admin: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: Bytes,
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
        .body(Full::new(body))?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body))
}
