//! The `weir` command: CLI parsing and config loading over the library
//! crates; `weir serve` hands a checked configuration to
//! `weir_server::Server`. Nothing here decides how an event runs.

// The doc comments of this crate's argument structs are clap's `--help`
// text, written for a terminal (`[limits]`, `scheme://host[:port]`,
// `<path>`), not rustdoc links or HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

mod actors_cli;
mod admin_client;
mod apps_cli;
mod async_runtime;
mod config;
mod logging;
mod processes_cli;
mod programs_cli;
mod table;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use weir_build::BuildRequest;
use weir_runtime::WeirEngine;
use weir_runtime::compiled_code::{self, CompileError, Compiler};
use weir_runtime::engine::EngineKind;
use weir_runtime::memory_budget::MemoryBudget;
use weir_server::{DEFAULT_LISTEN, Server, ServerConfig};

use crate::config::{Config, Overrides, UsageError};

/// The process's allocator. Every request allocates and frees on the
/// worker thread that serves it, and often frees what another worker
/// allocated (a connection moves between workers). glibc's malloc takes
/// an arena lock for that, and the two workers met on it: 0.157 futex
/// calls per hello request, against 0.069 with mimalloc, which frees into
/// per-thread pages without a lock (`bench/RESULTS.md`). `no_thp` keeps
/// its arenas off transparent huge pages, which would make each touched
/// page of an idle server cost 2 MiB of resident memory.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code for a usage or configuration error, as clap uses.
pub(crate) const EXIT_USAGE: u8 = 2;

/// `weir --version`: the build, and the versions of calls and socket
/// relays between cluster nodes it speaks (a cluster upgrades node by
/// node between builds that share one). A literal, checked against
/// `call_versions` and `socket_relay` by the CLI's tests.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (cluster calls: versions 2 to 3; socket relays: version 1)"
);

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    long_version = LONG_VERSION,
    about = "A self-hosted runtime for Wasm programs that serve events"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a wasi:http/proxy component.
    Serve(Box<ServeArgs>),
    /// Build a guest crate into a wasi:http component.
    Build(BuildArgs),
    /// List, inspect or delete the actors of a running server (through its
    /// admin address).
    Actors(actors_cli::ActorsArgs),
    /// Run a command component (wasi:cli) to completion under Weir's
    /// limits; exits with its exit code.
    Run(programs_cli::RunArgs),
    /// Push, list, remove or sweep the images of a data dir's image store.
    Images(programs_cli::ImagesArgs),
    /// List, inspect or kill the resident processes of a running server
    /// (through its admin address).
    Processes(processes_cli::ProcessesArgs),
    /// List the apps of a running server: versions, routes, lanes, queue
    /// (through its admin address).
    Apps(apps_cli::AppsArgs),
    /// Install new code for an app of a running server with no request
    /// dropped, or roll it back (through its admin address).
    Deploy(apps_cli::DeployArgs),
    /// Compile a component read from stdin into a code-cache artifact
    /// (what `weir serve` runs so that it never compiles in-process).
    #[command(name = "compile-artifact", hide = true)]
    CompileArtifact(CompileArgs),
}

#[derive(clap::Args)]
struct CompileArgs {
    /// The engine to compile for, as `weir serve` names it.
    #[arg(long)]
    engine: String,
    /// Where the artifact goes.
    #[arg(long)]
    out: PathBuf,
}

#[derive(clap::Args, Clone)]
struct ServeArgs {
    /// A .wasm component, or a guest crate directory (built first).
    app: Option<PathBuf>,
    /// Address to serve the app on.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Address for GET /healthz, /status and /metrics; off unless given.
    #[arg(long, value_name = "ADDR")]
    admin: Option<SocketAddr>,
    /// weir.toml: the app (or [apps.NAME] sections), [limits] and more;
    /// re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// NAME=VALUE; repeatable; overrides the config file.
    #[arg(long = "limit", value_name = "NAME=VALUE", action = clap::ArgAction::Append)]
    limits: Vec<String>,
    /// Add `x-weir-generation: <number>` to every response the guest produced.
    #[arg(long)]
    receipt_headers: bool,
    /// Let guests reach scheme://host[:port] (port `*` for any); repeatable.
    /// Outbound HTTP is denied unless allowed here or in the config file.
    #[arg(long = "allow-outbound", value_name = "PATTERN", action = clap::ArgAction::Append)]
    allow_outbound: Vec<String>,
    /// Where stores live; default ./.weir (or `data_dir` in the config file).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Declare a wasi:keyvalue store; repeatable (adds to [keyvalue] stores).
    #[arg(long = "kv-store", value_name = "NAME", action = clap::ArgAction::Append)]
    kv_stores: Vec<String>,
    /// Declare a weir:sql database; repeatable (adds to [sql] databases).
    #[arg(long = "sql-database", value_name = "NAME", action = clap::ArgAction::Append)]
    sql_databases: Vec<String>,
    /// "process" (survives a crash; default) or "fsync" (survives power loss).
    #[arg(long, value_name = "MODE")]
    durability: Option<String>,
    /// Declare an actor class: CLASS=PATH (a .wasm component or a guest
    /// crate directory); repeatable (adds to [actors.CLASS] sections).
    #[arg(long = "actor", value_name = "CLASS=PATH", action = clap::ArgAction::Append)]
    actors: Vec<String>,
    /// Expose an actor class to clients: CLASS=/PREFIX serves actor NAME at
    /// /PREFIX/NAME/<path>, without going through the app; repeatable.
    #[arg(long = "actor-route", value_name = "CLASS=/PREFIX", action = clap::ArgAction::Append)]
    actor_routes: Vec<String>,
    /// Cluster mode: the PostgreSQL database every node shares
    /// (postgres://…); the secret every node shares is read from
    /// WEIR_CLUSTER_SECRET unless [cluster] names its source.
    #[arg(long, value_name = "URL")]
    cluster: Option<String>,
    /// This node's name in its cluster (unique, the same across restarts).
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// Where this node listens for the other nodes of its cluster
    /// (default 127.0.0.1:7070).
    #[arg(long, value_name = "ADDR")]
    cluster_listen: Option<SocketAddr>,
    /// Where the other nodes reach this one, if not its --cluster-listen.
    #[arg(long, value_name = "HOST:PORT")]
    cluster_advertise: Option<String>,
}

#[derive(clap::Args)]
struct BuildArgs {
    /// The guest crate's Cargo.toml.
    #[arg(long, value_name = "Cargo.toml", default_value = "Cargo.toml")]
    manifest: PathBuf,
    /// The package to build, in a workspace.
    #[arg(long)]
    package: Option<String>,
    /// Where the component is copied.
    #[arg(long, value_name = "DIR", default_value = ".")]
    out_dir: PathBuf,
    /// Cargo features, comma separated.
    #[arg(long, value_delimiter = ',')]
    features: Vec<String>,
}

/// What a command line that names no command (or a command without one
/// of its own) is told, in one line: the commands it may name.
fn missing_command() -> String {
    use clap::CommandFactory;
    let top = Cli::command();
    let named = std::env::args().nth(1).unwrap_or_default();
    let (within, path) = match top.find_subcommand(&named) {
        Some(command) => (command.clone(), format!("weir {named}")),
        None => (top, "weir".to_string()),
    };
    let commands: Vec<&str> = within
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name())
        .filter(|name| *name != "help")
        .collect();
    format!(
        "`{path}` needs one of its commands: {} (see `{path} --help`)",
        commands.join(", ")
    )
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                    | clap::error::ErrorKind::MissingSubcommand
            ) =>
        {
            eprintln!("weir: {}", missing_command());
            return ExitCode::from(EXIT_USAGE);
        }
        Err(e) => {
            // One clear line, like every other usage error.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("weir: {first} (see `weir --help`)");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let result = match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Build(args) => build(args),
        Command::Actors(args) => actors_cli::run(args),
        Command::Run(args) => return programs_cli::run(args),
        Command::Images(args) => programs_cli::images(args),
        Command::Processes(args) => processes_cli::run(args),
        Command::Apps(args) => apps_cli::list(args),
        Command::Deploy(args) => apps_cli::deploy(args),
        Command::CompileArtifact(args) => {
            // Its stderr is the reason `weir serve` gives, so no prefix;
            // its exit code says whose fault it was.
            return match compile_artifact(args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{e:#}");
                    match e.downcast_ref::<CompileError>() {
                        Some(CompileError::NotKept(_)) => {
                            ExitCode::from(compiled_code::EXIT_ARTIFACT_NOT_WRITTEN)
                        }
                        _ => ExitCode::FAILURE,
                    }
                }
            };
        }
    };
    logging::flush();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(usage) = e.downcast_ref::<UsageError>() {
                eprintln!("weir: {usage}");
                return ExitCode::from(EXIT_USAGE);
            }
            eprintln!("weir: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn build(args: BuildArgs) -> anyhow::Result<()> {
    if !args.manifest.is_file() {
        return Err(UsageError(format!(
            "manifest {} does not exist",
            args.manifest.display()
        ))
        .into());
    }
    let out = weir_build::build(&BuildRequest {
        manifest: args.manifest,
        package: args.package,
        out_dir: args.out_dir,
        features: args.features,
    })?;
    eprintln!("weir: built {}", out.display());
    Ok(())
}

/// The compiler process of `weir serve`: one component on stdin, one
/// artifact out, for an engine configured exactly as the server's.
fn compile_artifact(args: CompileArgs) -> anyhow::Result<()> {
    let kind = EngineKind::parse(&args.engine)
        .ok_or_else(|| UsageError(format!("unknown engine `{}`", args.engine)))?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
        .context("cannot read the component from stdin")?;
    // The budget bounds instances, and the compiler makes none.
    let engine = WeirEngine::of_kind(kind, MemoryBudget::new(u64::MAX))?;
    Ok(compiled_code::compile_to(
        engine.engine(),
        &bytes,
        &args.out,
    )?)
}

impl ServeArgs {
    fn overrides(&self) -> Overrides<'_> {
        Overrides {
            limits: &self.limits,
            allow_outbound: &self.allow_outbound,
            data_dir: self.data_dir.as_deref(),
            kv_stores: &self.kv_stores,
            sql_databases: &self.sql_databases,
            durability: self.durability.as_deref(),
            actors: &self.actors,
            actor_routes: &self.actor_routes,
            cluster: self.cluster.as_deref(),
            node: self.node.as_deref(),
            cluster_listen: self.cluster_listen,
            cluster_advertise: self.cluster_advertise.as_deref(),
        }
    }

    /// The configuration file and command line, checked, with every guest
    /// crate directory built into its component.
    fn configuration(&self) -> anyhow::Result<Config> {
        let mut config = Config::resolve(
            self.config.as_deref(),
            self.app.as_deref(),
            self.overrides(),
        )?;
        for app in &mut config.apps {
            app.component = config::prepare_app(&app.component)?;
            for (_, path) in &mut app.actors {
                *path = config::prepare_app(path)?;
            }
        }
        Ok(config)
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Checked before logging starts, so that a usage error is one line.
    Config::resolve(
        args.config.as_deref(),
        args.app.as_deref(),
        args.overrides(),
    )?;
    logging::init();
    let config = args.configuration()?;
    let apps = config.apps.clone();
    let server_config = ServerConfig {
        apps: config.apps,
        listen: args.listen.or(config.listen).unwrap_or(DEFAULT_LISTEN),
        admin: args.admin.or(config.admin),
        receipt_headers: args.receipt_headers || config.receipt_headers,
        limits: config.limits,
        data_dir: config.data_dir,
        durability: config.durability,
        receipts: logging::receipt_sink(),
        guest_output: logging::guest_sink(),
        compiler: Compiler::Process {
            program: std::env::current_exe().context("cannot find the weir executable")?,
            args: vec!["compile-artifact".into()],
        },
        cluster: config.cluster,
    };
    let runtime = async_runtime::build()?;
    runtime.block_on(async move {
        // Watched from before anything starts: the default action of
        // SIGTERM or SIGINT ends the process at once, with no graceful stop
        // (requests in flight dropped, a cluster lease left to lapse).
        let shutdown = shutdown_signal();
        let server = Server::build(server_config).await?;
        if let Some(admin) = server.admin_addr() {
            if !admin.ip().is_loopback() {
                tracing::warn!(%admin, "the admin address is not a loopback address: anyone who can reach it can read /status and /metrics (/actors and /apps need the admin token)");
                eprintln!("weir: warning: admin address {admin} is reachable beyond this machine");
            }
            eprintln!(
                "weir: admin on http://{admin} (token in {})",
                server.token_path().display()
            );
        }
        // Watched from before the server says it serves: a SIGHUP's default
        // action ends the process.
        let reloads = tokio::spawn(reload_on_hangup(server.apps().clone(), args));
        let addr = server.local_addr();
        for app in &apps {
            for (class, path) in &app.actors {
                eprintln!("weir: actor class {class} from {}", path.display());
            }
            if apps.len() == 1 && app.data_subdir.is_none() {
                eprintln!("weir: serving {} on http://{addr}", app.component.display());
            } else {
                let routes: Vec<String> = app.routes.iter().map(|r| r.to_string()).collect();
                eprintln!(
                    "weir: serving app {} ({}) at {} on http://{addr}",
                    app.name,
                    app.component.display(),
                    routes.join(", ")
                );
            }
        }
        server
            .serve(async {
                shutdown.await;
                eprintln!("weir: shutting down");
            })
            .await;
        reloads.abort();
        Ok(())
    })
}

/// On each `SIGHUP`, reads the configuration again and applies it as one
/// deploy of every app it changes: all of it, or, when any of it is
/// refused, none of it (logged with why). The signal is watched from the
/// call, before the returned future first runs.
fn reload_on_hangup(
    apps: Arc<weir_server::Apps>,
    args: ServeArgs,
) -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    async move {
        reload_loop(
            apps,
            args,
            #[cfg(unix)]
            hangups,
        )
        .await
    }
}

async fn reload_loop(
    apps: Arc<weir_server::Apps>,
    args: ServeArgs,
    #[cfg(unix)] hangups: std::io::Result<tokio::signal::unix::Signal>,
) {
    #[cfg(unix)]
    {
        let Ok(mut hangups) = hangups else {
            tracing::warn!("cannot watch for SIGHUP: the configuration is read only at start");
            return;
        };
        let args = Arc::new(args);
        while hangups.recv().await.is_some() {
            let read = {
                let args = args.clone();
                tokio::task::spawn_blocking(move || args.configuration()).await
            };
            let config = match read {
                Ok(Ok(config)) => config,
                Ok(Err(e)) => {
                    tracing::warn!(error = %format!("{e:#}"), "SIGHUP: the configuration is refused; nothing changed");
                    eprintln!("weir: SIGHUP: configuration refused, nothing changed: {e:#}");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "SIGHUP: reading the configuration failed; nothing changed");
                    continue;
                }
            };
            match apps.reconfigure(&config.apps, &config.limits).await {
                Ok(done) => {
                    tracing::info!(deployed = %done["deployed"], "SIGHUP: configuration applied");
                    eprintln!("weir: SIGHUP: configuration applied: {}", done["deployed"]);
                }
                Err(refused) => {
                    tracing::warn!(code = refused.code, error = %refused.message, "SIGHUP: the configuration is refused; nothing changed");
                    eprintln!(
                        "weir: SIGHUP: configuration refused, nothing changed: {}",
                        refused.message
                    );
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (apps, args);
    }
}

/// Resolves at the first `SIGTERM` or `SIGINT` (Ctrl-C). Both are watched
/// from the call, before the returned future first runs.
fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                (Ok(mut one), Err(e)) | (Err(e), Ok(mut one)) => {
                    tracing::warn!(error = %e, "cannot watch for one of SIGTERM and SIGINT");
                    one.recv().await;
                }
                (Err(e), Err(_)) => {
                    tracing::warn!(error = %e, "cannot watch for SIGTERM or SIGINT: stop the server with SIGKILL");
                    std::future::pending::<()>().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
