//! Weir's composition root: one checked configuration in, a running server
//! out. `weir serve` parses its arguments into a [`ServerConfig`] and calls
//! [`Server::build`]; tests do the same in-process.
//!
//! Invariants owned here:
//! - one server per data directory: its lock is taken before anything in
//!   it is touched, and held until the server is dropped;
//! - the listeners are bound before any guest code is loaded, and every
//!   guest's outbound rules deny their addresses: a guest never reaches
//!   the server it runs in;
//! - one guest memory budget and one storage pool for every instance of
//!   every layer (workers and actors alike), and one metrics registry;
//! - the layers above the runtime are joined only through its extension
//!   points: the actors' host interfaces in every linker, their internal
//!   router bound once the apps exist, their idle instances as the
//!   budget's reclaimer;
//! - components are compiled by `config.compiler` into the data dir's code
//!   cache, and the cache keeps only what this server loaded.

pub mod limits;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpListener;
use weir_actors::{ActorClass, ActorDirectory, ActorHost, ActorInterfaces, ActorMetrics};
use weir_http::websocket::{ActorSockets, SocketHub, SocketInterfaces};
use weir_http::{ActorRoute, AdminState, ServeOptions};
use weir_programs::host::{ProgramInterfaces, ProgramsConfig, ProgramsHost};
use weir_programs::image_store::IMAGES_DIR;
use weir_programs::metrics::ProgramMetrics;
use weir_programs::process_router::ProcessRouter;
use weir_programs::{ImageStore, RunLimits};
use weir_runtime::code::HostInterfaces;
use weir_runtime::compiled_code::{CodeCache, Compiler};
use weir_runtime::engine::EngineError;
use weir_runtime::extension::{InternalRouter, InternalRoutes};
use weir_runtime::memory_budget::{MemoryBudget, Reclaim};
use weir_runtime::metrics::Metrics;
use weir_runtime::outbound::OutboundRules;
use weir_runtime::receipt::{ReceiptBook, ReceiptSink};
use weir_runtime::sql_pool::{PoolError, SqlPool};
use weir_runtime::{App, AppCode, EngineSizing, LoadError, Stores, WeirEngine};
use weir_store::data_dir::{DataDir, DataDirError};
use weir_store::sql::SqlDatabases;
use weir_store::{Durability, KvStores, StoreError};

pub use limits::ServerLimits;

/// Memory SQLite may hold for the whole process before it frees its caches
/// first: thousands of small actor page caches fit well under it.
pub const SQLITE_SOFT_HEAP_BYTES: u64 = 512 << 20;

/// Memory SQLite may hold for the whole process at most; past it a
/// statement fails (`SQLITE_NOMEM`) instead of the process growing. Guest
/// SQL cannot get near it: values are bounded by `SQLITE_LIMIT_LENGTH`,
/// results by `max_sql_result_bytes`, page caches per connection.
pub const SQLITE_HARD_HEAP_BYTES: u64 = 2 << 30;

/// The data dir's subdirectory of compiled code (see
/// [`weir_runtime::compiled_code`]).
pub const CODE_DIR: &str = "code";

/// The app name the metrics of programs run from actors are counted under.
pub const PROGRAMS_METRICS_APP: &str = "programs";

/// Where `weir serve` listens unless told otherwise.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);

/// Everything a server is built from, already checked.
pub struct ServerConfig {
    /// The app's component (a `.wasm` file).
    pub app: PathBuf,
    pub listen: SocketAddr,
    /// Where `/healthz`, `/status`, `/metrics` and `/actors` are served.
    pub admin: Option<SocketAddr>,
    pub receipt_headers: bool,
    pub limits: ServerLimits,
    pub outbound: OutboundRules,
    pub data_dir: PathBuf,
    pub kv_stores: Vec<String>,
    pub sql_databases: Vec<String>,
    pub durability: Durability,
    /// Actor classes: name and component file.
    pub actors: Vec<(String, PathBuf)>,
    /// Classes exposed to clients directly: (path prefix, class).
    pub actor_routes: Vec<(String, String)>,
    /// Each class's secrets, by name: what a process spawn's `secret-env`
    /// resolves to, at every launch.
    pub secrets: weir_programs::host::Secrets,
    /// Where receipts go, if anywhere.
    pub receipts: Option<Arc<dyn ReceiptSink>>,
    /// What compiles components that are not in the data dir's code cache.
    pub compiler: Compiler,
}

impl ServerConfig {
    /// A configuration with every default: `app` served on `listen`, its
    /// data under `data_dir`, no stores, no actors, receipts not logged.
    pub fn new(app: impl Into<PathBuf>, listen: SocketAddr, data_dir: impl Into<PathBuf>) -> Self {
        ServerConfig {
            app: app.into(),
            listen,
            admin: None,
            receipt_headers: false,
            limits: ServerLimits::default(),
            outbound: OutboundRules::new(Vec::new()),
            data_dir: data_dir.into(),
            kv_stores: Vec::new(),
            sql_databases: Vec::new(),
            durability: Durability::Process,
            actors: Vec::new(),
            actor_routes: Vec::new(),
            secrets: Default::default(),
            receipts: None,
            compiler: Compiler::InProcess,
        }
    }
}

/// Why a server could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error("cannot open stores under {dir}: {source}")]
    Stores { dir: PathBuf, source: StoreError },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot use the code cache {dir}: {source}")]
    CodeCache {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("actor class `{class}`: {source}")]
    ActorClass { class: String, source: LoadError },
    #[error("cannot index actors under {dir}: {source}")]
    Actors {
        dir: PathBuf,
        source: weir_actors::AdminError,
    },
    #[error(transparent)]
    Images(#[from] weir_programs::ImageError),
}

/// A built server: listeners bound, stores open, the app's lanes and the
/// actor host ready. [`Server::serve`] runs it.
pub struct Server {
    listener: TcpListener,
    admin: Option<(TcpListener, Arc<AdminState>)>,
    app: Arc<App>,
    actors: Option<Arc<ActorHost>>,
    options: ServeOptions,
    metrics: Arc<Metrics>,
    /// Kept until serving stops: their epoch tickers bound every guest.
    engines: Vec<WeirEngine>,
    /// The router to resident processes (the runtime holds routers
    /// weakly).
    _process_router: Arc<dyn InternalRouter>,
    data_dir: DataDir,
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Listen { addr, source })
}

impl Server {
    /// Builds a server from `config`. Must run inside a Tokio runtime.
    pub async fn build(mut config: ServerConfig) -> Result<Server, ServerError> {
        // One server per data dir: taken before anything in it is touched.
        let data_dir = DataDir::open(&config.data_dir)?;
        let token = data_dir.admin_token()?;
        // Bound first: guests must never reach them, so their addresses
        // are known before any guest code is loaded.
        let listener = bind(config.listen).await?;
        let admin_listener = match config.admin {
            Some(admin) => Some(bind(admin).await?),
            None => None,
        };
        let mut own = vec![local_addr(&listener)];
        if let Some(admin) = &admin_listener {
            own.push(local_addr(admin));
        }
        config.outbound.deny_own(own);
        let limits = &config.limits.runtime;
        let budget = MemoryBudget::new(limits.total_guest_memory());
        let pool = Arc::new(SqlPool::new(limits.sql_threads)?);
        weir_store::confinement::bound_sqlite_heap(SQLITE_SOFT_HEAP_BYTES, SQLITE_HARD_HEAP_BYTES);
        let code_dir = config.data_dir.join(CODE_DIR);
        let code_cache = CodeCache::new(&code_dir, config.compiler.clone())
            .map(Arc::new)
            .map_err(|source| ServerError::CodeCache {
                dir: code_dir.clone(),
                source,
            })?;
        let engine = WeirEngine::new(
            EngineSizing {
                lanes: limits.max_concurrent as u32,
                memory_limit_bytes: limits.memory_limit_bytes,
            },
            budget.clone(),
        )?;
        let stores_error = |source| ServerError::Stores {
            dir: config.data_dir.clone(),
            source,
        };
        let kv = KvStores::open(&config.data_dir, &config.kv_stores, config.durability)
            .map_err(stores_error)?;
        let sql = SqlDatabases::open(&config.data_dir, &config.sql_databases, config.durability)
            .map_err(stores_error)?;
        let has_actors = !config.actors.is_empty();
        // In every linker, so that an app that imports `weir:actor` links
        // whether or not it runs as an actor (outside a turn, its calls
        // fail).
        let metrics = Arc::new(Metrics::new());
        // Programs run from actors' turns: on an engine of their own, made
        // at the first run, from the data dir's image store.
        let programs = ProgramsHost::new(ProgramsConfig {
            images_dir: config.data_dir.join(IMAGES_DIR),
            slots_dir: config.data_dir.join(weir_programs::storage_slot::SLOTS_DIR),
            compiler: config.compiler.clone(),
            limits: RunLimits {
                runtime: limits.clone(),
                programs: config.limits.programs.clone(),
            },
            outbound: config.outbound.clone(),
            budget: budget.clone(),
            metrics: metrics.for_app(PROGRAMS_METRICS_APP),
            program_metrics: ProgramMetrics::register(&metrics),
            receipts: config.receipts.clone(),
            secrets: config.secrets.clone(),
        });
        // Owners reach their processes at `<pid>.process.internal`.
        let process_router: Arc<dyn InternalRouter> = Arc::new(ProcessRouter {
            table: programs.table.clone(),
        });
        // Actors' sockets run their turns on the actor host, made below.
        let actor_sockets = ActorSockets::new();
        let interfaces: Vec<Arc<dyn HostInterfaces>> = vec![
            Arc::new(ActorInterfaces),
            Arc::new(SocketInterfaces(actor_sockets.clone())),
            Arc::new(ProgramInterfaces(programs.clone())),
        ];
        let stores = Stores {
            kv: Arc::new(kv),
            sql: Arc::new(sql),
            pool,
            routes: InternalRoutes::default(),
            interfaces,
        };
        let code = AppCode::load(
            &engine,
            &code_cache,
            &config.app,
            limits.clone(),
            config.outbound.clone(),
            stores.clone(),
        )?;
        metrics.watch_budget(budget.clone());
        let mut engines = vec![engine];
        let actors = if has_actors {
            // Actor classes run on an engine of their own: many mostly idle
            // instances, allocated on demand and freed when they hibernate.
            let engine = WeirEngine::on_demand(limits.memory_limit_bytes, budget.clone())?;
            let actor_metrics = ActorMetrics::register(&metrics);
            let mut classes = Vec::new();
            for (class, path) in &config.actors {
                let code = AppCode::load(
                    &engine,
                    &code_cache,
                    path,
                    limits.clone(),
                    config.outbound.clone(),
                    stores.clone(),
                )
                .map_err(|source| ServerError::ActorClass {
                    class: class.clone(),
                    source,
                })?;
                classes.push(ActorClass::new(
                    class.clone(),
                    code,
                    config.limits.actors.clone(),
                    metrics.for_app(&format!("actor:{class}")),
                    actor_metrics.for_class(class),
                ));
            }
            engines.push(engine);
            let directory = ActorDirectory::new(&config.data_dir, config.durability);
            let host =
                ActorHost::new(classes, directory, config.receipts.clone()).map_err(|source| {
                    ServerError::Actors {
                        dir: config.data_dir.clone(),
                        source,
                    }
                })?;
            actor_sockets.connect(&host);
            let router: Arc<dyn InternalRouter> = host.clone();
            stores.routes.connect(&[router, process_router.clone()]);
            let reclaim: Arc<dyn Reclaim> = host.clone();
            budget.set_reclaimer(&reclaim);
            host.start();
            // Owners whose processes the last run did not see end get them
            // back now, without waiting for a request.
            programs.recover(&host).await;
            Some(host)
        } else {
            None
        };
        let name = shown_name(&config.app);
        let receipts = ReceiptBook::new(
            name.clone().into(),
            metrics.for_app(&name),
            config.receipts.clone(),
        );
        let app = App::start(name, code, receipts, &config.app.display().to_string()).await?;
        // Everything this server runs is loaded: older artifacts go.
        match code_cache.prune() {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "pruned compiled code no longer served"),
            Err(e) => {
                tracing::warn!(dir = %code_dir.display(), error = %e, "cannot prune the code cache")
            }
        }
        let images = Arc::new(ImageStore::open(
            &config.data_dir.join(IMAGES_DIR),
            config.limits.programs.max_image_bytes,
        )?);
        let admin = admin_listener.map(|listener| {
            let state = Arc::new(AdminState {
                apps: vec![app.clone()],
                metrics: metrics.clone(),
                actors: actors.clone(),
                images: Some(images),
                processes: Some(programs.table.clone()),
                token,
            });
            (listener, state)
        });
        let options = ServeOptions {
            receipt_headers: config.receipt_headers,
            actor_routes: config
                .actor_routes
                .iter()
                .map(|(prefix, class)| ActorRoute {
                    prefix: prefix.clone(),
                    class: class.clone(),
                })
                .collect(),
            actors: actors.clone(),
            sockets: Some(SocketHub::new(
                config.limits.sockets.clone(),
                config.receipts.clone(),
                &metrics,
            )),
        };
        Ok(Server {
            listener,
            admin,
            app,
            actors,
            options,
            metrics,
            engines,
            _process_router: process_router,
            data_dir,
        })
    }

    /// Where the app is served.
    pub fn local_addr(&self) -> SocketAddr {
        local_addr(&self.listener)
    }

    /// Where the admin endpoints are served, if anywhere.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|(l, _)| local_addr(l))
    }

    /// The file that holds the admin token.
    pub fn token_path(&self) -> PathBuf {
        self.data_dir.token_path()
    }

    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    pub fn actors(&self) -> Option<&Arc<ActorHost>> {
        self.actors.as_ref()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Serves until `shutdown` completes, then lets open connections
    /// finish.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let Server {
            listener,
            admin,
            app,
            actors,
            options,
            engines,
            data_dir,
            ..
        } = self;
        let admin_task =
            admin.map(|(listener, state)| tokio::spawn(weir_http::serve_admin(listener, state)));
        weir_http::serve(listener, app, options, shutdown).await;
        if let Some(task) = admin_task {
            task.abort();
        }
        // The engines (and their tickers) live until serving stops, and
        // the data dir is held until the end.
        drop(actors);
        drop(engines);
        drop(data_dir);
    }
}

fn local_addr(listener: &TcpListener) -> SocketAddr {
    listener
        .local_addr()
        .expect("a bound TCP listener has an address")
}

/// The app's name: its component's file stem.
pub fn shown_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "app".into())
}
