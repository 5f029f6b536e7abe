//! The `weir` command: CLI parsing and config loading over the library
//! crates. Nothing here decides how an event runs.

mod actors_cli;
mod config;
mod logging;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use weir_actors::{ActorClass, ActorDirectory, ActorHost};
use weir_build::BuildRequest;
use weir_http::{ActorRoute, AdminState, ServeOptions};
use weir_runtime::memory_budget::{MemoryBudget, Reclaim};
use weir_runtime::metrics::Metrics;
use weir_runtime::outbound::{ActorCalls, ActorLink};
use weir_runtime::receipt::ReceiptBook;
use weir_runtime::sql_pool::SqlPool;
use weir_runtime::{App, AppCode, EngineSizing, Stores, WeirEngine};

use crate::config::{Config, Overrides, UsageError};
use weir_store::KvStores;
use weir_store::data_dir::DataDir;
use weir_store::sql::SqlDatabases;

/// Exit code for a usage or configuration error, as clap uses.
const EXIT_USAGE: u8 = 2;

/// Memory SQLite may hold for the whole process before it frees its caches
/// first: thousands of small actor page caches fit well under it.
const SQLITE_SOFT_HEAP_BYTES: u64 = 512 << 20;

/// Memory SQLite may hold for the whole process at most; past it a
/// statement fails (`SQLITE_NOMEM`) instead of the process growing. Guest
/// SQL cannot get near it: values are bounded by `SQLITE_LIMIT_LENGTH`,
/// results by `max_sql_result_bytes`, page caches per connection.
const SQLITE_HARD_HEAP_BYTES: u64 = 2 << 30;

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "A self-hosted runtime for Wasm programs that serve events"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a wasi:http/proxy component.
    Serve(ServeArgs),
    /// Build a guest crate into a wasi:http component.
    Build(BuildArgs),
    /// List, inspect or delete the actors of a running server (through its
    /// admin address).
    Actors(actors_cli::ActorsArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// A .wasm component, or a guest crate directory (built first).
    app: Option<PathBuf>,
    /// Address to serve the app on.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Address for GET /healthz, /status and /metrics; off unless given.
    #[arg(long, value_name = "ADDR")]
    admin: Option<SocketAddr>,
    /// weir.toml with [limits] and the app path.
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

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version
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
        Command::Serve(args) => serve(args),
        Command::Build(args) => build(args),
        Command::Actors(args) => actors_cli::run(args),
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

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = Config::resolve(
        args.config.as_deref(),
        args.app.as_deref(),
        Overrides {
            limits: &args.limits,
            allow_outbound: &args.allow_outbound,
            data_dir: args.data_dir.as_deref(),
            kv_stores: &args.kv_stores,
            sql_databases: &args.sql_databases,
            durability: args.durability.as_deref(),
            actors: &args.actors,
            actor_routes: &args.actor_routes,
        },
    )?;
    logging::init();
    // One server per data dir: taken before anything in it is touched.
    let data_dir = DataDir::open(&config.data_dir)?;
    let token = data_dir.admin_token()?;
    let app_path = config::prepare_app(&config.app)?;
    let actor_paths = config
        .actors
        .iter()
        .map(|(class, path)| Ok((class.clone(), config::prepare_app(path)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        // The listeners are bound first: guests must never reach them, so
        // their addresses are known before any guest code is loaded.
        let listen = args
            .listen
            .or(config.listen)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let admin_listener = match args.admin.or(config.admin) {
            Some(admin) => Some(
                tokio::net::TcpListener::bind(admin)
                    .await
                    .with_context(|| format!("cannot listen on {admin}"))?,
            ),
            None => None,
        };
        let mut own = vec![listener.local_addr()?];
        if let Some(admin) = &admin_listener {
            own.push(admin.local_addr()?);
        }
        config.outbound.deny_own(own);
        // One budget for the linear memory of every instance, workers' and
        // actors' alike, and one pool for every guest's storage work.
        let budget = MemoryBudget::new(config.limits.total_guest_memory());
        let pool = Arc::new(SqlPool::new(config.limits.sql_threads)?);
        weir_store::confinement::bound_sqlite_heap(SQLITE_SOFT_HEAP_BYTES, SQLITE_HARD_HEAP_BYTES);
        let engine = WeirEngine::new(
            EngineSizing {
                lanes: config.limits.max_concurrent as u32,
                memory_limit_bytes: config.limits.memory_limit_bytes,
            },
            budget.clone(),
        )?;
        let shown = app_path.display().to_string();
        let kv = KvStores::open(&config.data_dir, &config.kv_stores, config.durability)
            .with_context(|| format!("cannot open stores under {}", config.data_dir.display()))?;
        let sql = SqlDatabases::open(&config.data_dir, &config.sql_databases, config.durability)
            .with_context(|| {
                format!("cannot open databases under {}", config.data_dir.display())
            })?;
        let stores = Stores {
            kv: Arc::new(kv),
            sql: Arc::new(sql),
            pool,
            actors: ActorLink::default(),
        };
        let code = AppCode::load(
            &engine,
            &app_path,
            config.limits.clone(),
            config.outbound.clone(),
            stores.clone(),
        )?;
        let metrics = Arc::new(Metrics::new());
        metrics.watch_budget(budget.clone());
        // Actor classes run on an engine of their own: many mostly idle
        // instances, allocated on demand and freed when they hibernate.
        let actor_engine = if actor_paths.is_empty() {
            None
        } else {
            Some(WeirEngine::for_actors(
                config.limits.memory_limit_bytes,
                budget.clone(),
            )?)
        };
        let actor_host = match &actor_engine {
            None => None,
            Some(actor_engine) => {
                let mut classes = Vec::new();
                for (class, path) in &actor_paths {
                    let code = AppCode::load(
                        actor_engine,
                        path,
                        config.limits.clone(),
                        config.outbound.clone(),
                        stores.clone(),
                    )
                    .with_context(|| format!("actor class `{class}`"))?;
                    let class_metrics = metrics.for_app(&format!("actor:{class}"));
                    classes.push(ActorClass::new(
                        class.clone(),
                        code,
                        class_metrics,
                        metrics.for_actor_class(class),
                    ));
                }
                let directory = ActorDirectory::new(&config.data_dir, config.durability);
                let host = ActorHost::new(classes, directory, logging::receipt_sink())
                    .with_context(|| {
                        format!("cannot index actors under {}", config.data_dir.display())
                    })?;
                let calls: Arc<dyn ActorCalls> = host.clone();
                stores.actors.connect(&calls);
                let reclaim: Arc<dyn Reclaim> = host.clone();
                budget.set_reclaimer(&reclaim);
                host.start();
                for (class, path) in &actor_paths {
                    eprintln!("weir: actor class {class} from {}", path.display());
                }
                Some(host)
            }
        };
        let name = shown_name(&app_path);
        let receipts = ReceiptBook::new(
            name.clone().into(),
            metrics.for_app(&name),
            logging::receipt_sink(),
        );
        let app = App::start(name, code, receipts, &shown).await?;

        if let Some(admin_listener) = admin_listener {
            let admin = admin_listener.local_addr()?;
            if !admin.ip().is_loopback() {
                tracing::warn!(%admin, "the admin address is not a loopback address: anyone who can reach it can read /status and /metrics (/actors needs the admin token)");
                eprintln!("weir: warning: admin address {admin} is reachable beyond this machine");
            }
            eprintln!(
                "weir: admin on http://{admin} (token in {})",
                data_dir.token_path().display()
            );
            let state = Arc::new(AdminState {
                apps: vec![app.clone()],
                metrics: metrics.clone(),
                actors: actor_host.clone(),
                token,
            });
            tokio::spawn(weir_http::serve_admin(admin_listener, state));
        }
        eprintln!(
            "weir: serving {} on http://{}",
            shown,
            listener.local_addr()?
        );
        let options = ServeOptions {
            receipt_headers: args.receipt_headers || config.receipt_headers,
            actor_routes: config
                .actor_routes
                .iter()
                .map(|(prefix, class)| ActorRoute {
                    prefix: prefix.clone(),
                    class: class.clone(),
                })
                .collect(),
            actors: actor_host.clone(),
        };
        weir_http::serve(listener, app, options, async {
            shutdown_signal().await;
            eprintln!("weir: shutting down");
        })
        .await;
        // Keep the engines (and their tickers) alive until serving stops,
        // and the data dir held until the end.
        drop(actor_host);
        drop(actor_engine);
        drop(engine);
        drop(data_dir);
        Ok(())
    })
}

fn shown_name(path: &std::path::Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "app".into())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
