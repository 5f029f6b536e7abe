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
//!   every app and layer (workers and actors alike), and one metrics
//!   registry; each app's stores, actors and processes are its own
//!   (`tenant`), and its versions are [`versions`]'s;
//! - the worker engine reserves instance slots for every app's lanes
//!   [`VERSIONS_AT_ONCE`] times over, so a deploy never waits for the
//!   version it replaces to give its slots back;
//! - the layers above the runtime are joined only through its extension
//!   points: the actors' host interfaces in every linker, their internal
//!   router bound once the apps exist, their idle instances as the
//!   budget's reclaimer;
//! - components are compiled by `config.compiler` into the data dir's code
//!   cache, and the cache keeps only what this server loaded.

pub mod app_spec;
pub mod limits;
pub mod recipe;
pub(crate) mod tenant;
pub mod versions;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpListener;
use weir_actors::{ActorHost, ActorMetrics};
use weir_cluster::{Cluster, ClusterConfig};
use weir_http::websocket::SocketHub;
use weir_http::websocket::relay::RelayDoor;
use weir_http::{AdminState, ServeOptions, Tenant as AdminTenant};
use weir_programs::ImageStore;
use weir_programs::image_store::IMAGES_DIR;
use weir_programs::metrics::ProgramMetrics;
use weir_programs::shared_images::ImageMirror;
use weir_runtime::App;
use weir_runtime::compiled_code::{CodeCache, Compiler};
use weir_runtime::compute_share::{self, ComputeShare, ShareError};
use weir_runtime::engine::EngineError;
use weir_runtime::memory_budget::{MemoryBudget, Reclaim};
use weir_runtime::metrics::Metrics;
use weir_runtime::receipt::ReceiptSink;
use weir_runtime::sql_pool::{PoolError, SqlPool};
use weir_runtime::{EngineSizing, LoadError, WeirEngine};
use weir_store::data_dir::{DataDir, DataDirError};
use weir_store::{Durability, StoreError};

pub use app_spec::{AppSpec, SpecError};
pub use limits::ServerLimits;
pub use versions::Apps;

/// SQLite's soft heap limit is this part of `max_sql_memory_bytes`: past
/// it SQLite frees its page caches before it allocates, so a statement
/// that sorts in memory takes cache from idle connections before it takes
/// the rest of the bound (512 MiB of the default 2 GiB: thousands of small
/// actor page caches fit under it).
pub const SQLITE_SOFT_HEAP_DIVISOR: u64 = 4;

/// The data dir's subdirectory of compiled code (see
/// [`weir_runtime::compiled_code`]).
pub const CODE_DIR: &str = "code";

/// The app name the metrics of programs run from actors are counted under.
pub const PROGRAMS_METRICS_APP: &str = "programs";

/// Versions of one app whose lanes may hold instances at once: the one
/// serving and the one it replaced, finishing what it runs.
pub const VERSIONS_AT_ONCE: usize = 2;

/// Where `weir serve` listens unless told otherwise.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);

/// Everything a server is built from, already checked.
pub struct ServerConfig {
    /// The apps it serves.
    pub apps: Vec<AppSpec>,
    pub listen: SocketAddr,
    /// Where `/healthz`, `/status`, `/metrics`, `/actors` and `/apps` are
    /// served.
    pub admin: Option<SocketAddr>,
    pub receipt_headers: bool,
    /// The server's limits: every app's, unless the app sets its own.
    pub limits: ServerLimits,
    pub data_dir: PathBuf,
    pub durability: Durability,
    /// Where receipts go, if anywhere.
    pub receipts: Option<Arc<dyn ReceiptSink>>,
    /// Where guests' stdout and stderr go, as records naming their app
    /// (`weir_runtime::guest_log`), if anywhere.
    pub guest_output: Option<Arc<dyn ReceiptSink>>,
    /// What compiles components that are not in the data dir's code cache.
    pub compiler: Compiler,
    /// Cluster mode: the node's settings (its lease is `cluster_lease_ms`
    /// of [`ServerConfig::limits`]).
    pub cluster: Option<ClusterConfig>,
}

impl ServerConfig {
    /// A configuration with every default: `app` served on `listen` (on
    /// every host and path), its data under `data_dir`, no stores, no
    /// actors, receipts and guest output not logged.
    pub fn new(app: impl Into<PathBuf>, listen: SocketAddr, data_dir: impl Into<PathBuf>) -> Self {
        ServerConfig {
            apps: vec![AppSpec::single(app)],
            listen,
            admin: None,
            receipt_headers: false,
            limits: ServerLimits::default(),
            data_dir: data_dir.into(),
            durability: Durability::Process,
            receipts: None,
            guest_output: None,
            compiler: Compiler::InProcess,
            cluster: None,
        }
    }
}

/// The operators' view of the resident processes' take-overs: how many
/// owners' launches are owed a re-drive on this node, or being re-driven
/// (0: every launch it was handed runs, or was reported lost).
fn processes_section(
    programs: Vec<Arc<weir_programs::host::ProgramsHost>>,
) -> (&'static str, weir_http::admin::StatusSection) {
    let section: weir_http::admin::StatusSection = Arc::new(move || {
        let pending: usize = programs.iter().map(|p| p.take_overs_pending()).sum();
        serde_json::json!({ "pending": pending })
    });
    ("take_overs", section)
}

/// The operators' view of the SQL pool: its threads, and how many run a
/// statement or a storage call now (all of them busy is what queues the
/// next SQL call).
fn sql_pool_section(pool: Arc<SqlPool>) -> (&'static str, weir_http::admin::StatusSection) {
    let section: weir_http::admin::StatusSection =
        Arc::new(move || serde_json::json!({ "threads": pool.threads(), "busy": pool.busy() }));
    ("sql_pool", section)
}

/// The operators' view of the compute share: how many slices long
/// computations may start per tick, how many they were given, and how
/// many wait for one now, in all and per app.
fn share_section(share: Arc<ComputeShare>) -> (&'static str, weir_http::admin::StatusSection) {
    let section: weir_http::admin::StatusSection = Arc::new(move || {
        let status = share.status();
        let apps: serde_json::Map<_, _> = status
            .apps
            .iter()
            .map(|(app, granted, waiting)| {
                (
                    app.to_string(),
                    serde_json::json!({ "slices_granted": granted, "waiting": waiting }),
                )
            })
            .collect();
        serde_json::json!({
            "slices_per_tick": status.slices_per_tick,
            "slices_granted": status.slices_granted,
            "waiting": status.waiting,
            "apps": apps,
        })
    });
    ("compute_share", section)
}

/// Why a server could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error("cannot listen on {addr}: {cause}")]
    Listen {
        addr: SocketAddr,
        cause: std::io::Error,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error(transparent)]
    Share(#[from] ShareError),
    #[error("cannot open stores under {dir}: {cause}")]
    Stores { dir: PathBuf, cause: StoreError },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot use the code cache {dir}: {cause}")]
    CodeCache { dir: PathBuf, cause: std::io::Error },
    #[error("actor class `{class}`: {cause}")]
    ActorClass { class: String, cause: LoadError },
    #[error("cannot index actors under {dir}: {cause}")]
    Actors {
        dir: PathBuf,
        cause: weir_actors::AdminError,
    },
    #[error("storage slots: {0}")]
    Slots(String),
    #[error(transparent)]
    Images(#[from] weir_programs::ImageError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// Says its cause in its own words (so it hands on no source).
    #[error("cluster: {0}")]
    Cluster(weir_cluster::ClusterError),
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Deploy(String),
}

impl From<weir_cluster::ClusterError> for ServerError {
    fn from(e: weir_cluster::ClusterError) -> Self {
        ServerError::Cluster(e)
    }
}

/// Every app's actor host, asked in turn for memory when the budget runs
/// short.
struct Reclaimers(Vec<Arc<ActorHost>>);

impl Reclaim for Reclaimers {
    fn reclaim(&self, bytes: u64) -> u64 {
        let mut freed = 0;
        for host in &self.0 {
            if freed >= bytes {
                break;
            }
            freed += host.reclaim(bytes - freed);
        }
        freed
    }
}

/// A built server: listeners bound, stores open, every app's first version
/// ready. [`Server::serve`] runs it.
pub struct Server {
    listener: TcpListener,
    admin: Option<(TcpListener, Arc<AdminState>)>,
    apps: Arc<Apps>,
    actors: Vec<Arc<ActorHost>>,
    options: ServeOptions,
    metrics: Arc<Metrics>,
    /// The budget holds its reclaimer weakly.
    _reclaimers: Arc<dyn Reclaim>,
    data_dir: DataDir,
    cluster: Option<Arc<Cluster>>,
    /// Cluster mode: what keeps this node's images in step with the
    /// cluster's while it serves.
    images_kept_up: Option<ImagesKeptUp>,
}

/// See [`ImageMirror::keep_up`].
struct ImagesKeptUp {
    mirror: Arc<ImageMirror>,
    store: ImageStore,
    prepare: Option<weir_programs::shared_images::PrepareImage>,
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Listen {
            addr,
            cause: source,
        })
}

impl Server {
    /// Builds a server from `config`. Must run inside a Tokio runtime.
    pub async fn build(config: ServerConfig) -> Result<Server, ServerError> {
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
        data_dir.record_admin_address(admin_listener.as_ref().map(local_addr))?;
        // Cluster mode: the node joins before any app loads (its actors
        // need their placement), and its internal listener is one of the
        // server's own addresses no guest may reach.
        let cluster = match &config.cluster {
            Some(cluster) => {
                let cluster = Cluster::start(ClusterConfig {
                    lease: config.limits.cluster.cluster_lease,
                    schema_patience: config.limits.cluster.cluster_schema_patience,
                    ..cluster.clone()
                })
                .await?;
                own.push(cluster.internal_addr());
                Some(cluster)
            }
            None => None,
        };
        // The images every node runs, in cluster mode.
        let image_mirror = cluster.as_ref().map(|c| ImageMirror::new(c.images()));
        let server_limits = &config.limits.runtime;
        let mut lanes = 0;
        for spec in &config.apps {
            lanes += spec.limits(&config.limits)?.runtime.max_concurrent;
        }
        let lane_capacity = lanes * VERSIONS_AT_ONCE;
        let budget = MemoryBudget::new(server_limits.total_guest_memory());
        let pool = Arc::new(SqlPool::new(server_limits.sql_threads)?);
        let pool_seen = pool.clone();
        server_limits
            .check_sql_memory()
            .map_err(ServerError::Config)?;
        let statements_bounded = weir_store::statement_bounds::bound_sqlite_heap(
            server_limits.max_sql_memory_bytes / SQLITE_SOFT_HEAP_DIVISOR,
            server_limits.max_sql_memory_bytes,
            server_limits.max_sql_statement_memory_bytes,
        );
        if !statements_bounded {
            // SQLite was in use in this process before the server was
            // built (an embedding program's own connection).
            tracing::warn!(
                "SQLite was in use before the server started: guest statements are bounded only by max_sql_memory_bytes, not max_sql_statement_memory_bytes"
            );
        }
        let code_dir = config.data_dir.join(CODE_DIR);
        let code_cache = CodeCache::new(
            &code_dir,
            config.compiler.clone(),
            server_limits.compile_memory_limit_bytes,
        )
        .map(Arc::new)
        .map_err(|source| ServerError::CodeCache {
            dir: code_dir.clone(),
            cause: source,
        })?;
        // Worker events and actor turns run on this runtime's workers; long
        // computations among them share `long_call_workers` of them.
        let share = ComputeShare::new(compute_share::slices_per_tick(
            tokio::runtime::Handle::current().metrics().num_workers(),
            server_limits.long_call_workers,
        ))?;
        let engine = WeirEngine::new(
            EngineSizing {
                lanes: u32::try_from(lane_capacity).unwrap_or(u32::MAX),
                memory_limit_bytes: server_limits.memory_limit_bytes,
            },
            budget.clone(),
            Some(share.clone()),
        )?;
        // Actor classes run on an engine of their own: many mostly idle
        // instances, allocated on demand and freed when they hibernate.
        let actor_engine = if config.apps.iter().any(|a| !a.actors.is_empty()) {
            Some(WeirEngine::on_demand(
                server_limits.memory_limit_bytes,
                budget.clone(),
                Some(share.clone()),
            )?)
        } else {
            None
        };
        let metrics = Arc::new(Metrics::new());
        let sockets = SocketHub::new(
            config.limits.sockets.clone(),
            config.receipts.clone(),
            &metrics,
        );
        let shared = Arc::new(tenant::Shared {
            share: share.clone(),
            sockets: sockets.clone(),
            engine,
            actor_engine,
            code_cache: code_cache.clone(),
            compiler: config.compiler.clone(),
            actor_metrics: ActorMetrics::register(&metrics),
            program_metrics: ProgramMetrics::register(&metrics),
            metrics: metrics.clone(),
            receipts: config.receipts.clone(),
            guest_output: config.guest_output.clone(),
            budget: budget.clone(),
            pool,
            limits: config.limits.clone(),
            durability: config.durability,
            data_dir: config.data_dir.clone(),
            own,
            lane_capacity,
            qualified: config.apps.iter().any(|a| a.data_subdir.is_some()),
            cluster: cluster.clone(),
            image_mirror: image_mirror.clone(),
        });
        metrics.watch_budget(budget.clone());
        let apps = Apps::start(shared, &config.apps).await?;
        let tenants = apps.tenants().await;
        let actors: Vec<Arc<ActorHost>> = tenants.iter().filter_map(|t| t.actors.clone()).collect();
        let options = ServeOptions {
            receipt_headers: config.receipt_headers,
            sockets: Some(sockets),
            limits: config.limits.runtime.clone(),
        };
        if let Some(cluster) = &cluster {
            // Sockets relayed to an app's actors are served as on its
            // actor routes.
            let doors = tenants
                .iter()
                .filter(|t| t.actors.is_some())
                .map(|t| {
                    let door: Arc<dyn weir_actors::SocketDoor> =
                        RelayDoor::new(apps.router().clone(), &t.name, options.clone());
                    (t.name.clone(), door)
                })
                .collect();
            cluster.serve(
                tenants
                    .iter()
                    .filter_map(|t| Some((t.name.clone(), t.actors.clone()?)))
                    .collect(),
                tenants
                    .iter()
                    .filter_map(|t| Some((t.name.clone(), t.store_placement.clone()?)))
                    .collect(),
                doors,
            );
        }
        let reclaimers: Arc<dyn Reclaim> = Arc::new(Reclaimers(actors.clone()));
        budget.set_reclaimer(&reclaimers);
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
        // A pushed image is compiled for every app whose actors may spawn
        // it (apps with the same memory limit share one artifact).
        let programs: Vec<_> = tenants
            .iter()
            .filter(|t| t.actors.is_some())
            .map(|t| t.programs.clone())
            .collect();
        let handed_over = programs.clone();
        let prepare_image = (!programs.is_empty()).then(|| {
            let prepare: weir_http::admin::PrepareImage = Arc::new(move |digest| {
                programs
                    .iter()
                    .try_for_each(|programs| programs.prepare_image(digest))
            });
            prepare
        });
        // In cluster mode this node's store follows the cluster's images.
        let images_kept_up = image_mirror.as_ref().map(|mirror| ImagesKeptUp {
            mirror: mirror.clone(),
            store: (*images).clone(),
            prepare: prepare_image.clone(),
        });
        let admin = admin_listener.map(|listener| {
            let deployer: Arc<dyn weir_http::admin_apps::Deployer> = apps.clone();
            let state = Arc::new(AdminState {
                router: apps.router().clone(),
                metrics: metrics.clone(),
                tenants: tenants
                    .iter()
                    .map(|t| AdminTenant {
                        app: t.name.clone(),
                        actors: t.actors.clone(),
                        processes: t.actors.as_ref().map(|_| t.programs.table.clone()),
                    })
                    .collect(),
                images: Some(images),
                prepare_image,
                image_mirror,
                deployer: Some(deployer),
                token,
                sections: cluster
                    .iter()
                    .map(|cluster| {
                        let cluster = cluster.clone();
                        let section: weir_http::admin::StatusSection = Arc::new(move || {
                            serde_json::to_value(cluster.status()).unwrap_or_default()
                        });
                        ("cluster", section)
                    })
                    .chain(images_kept_up.as_ref().map(|kept| {
                        let mirror = kept.mirror.clone();
                        let section: weir_http::admin::StatusSection = Arc::new(move || {
                            serde_json::to_value(mirror.status()).unwrap_or_default()
                        });
                        ("images", section)
                    }))
                    .chain(std::iter::once(share_section(share)))
                    .chain(std::iter::once(sql_pool_section(pool_seen.clone())))
                    .chain(std::iter::once(processes_section(handed_over.clone())))
                    .collect(),
            });
            (listener, state)
        });
        Ok(Server {
            listener,
            admin,
            apps,
            actors,
            options,
            metrics,
            _reclaimers: reclaimers,
            data_dir,
            cluster,
            images_kept_up,
        })
    }

    /// Where the apps are served.
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

    /// The first app's worker as it serves now.
    pub fn app(&self) -> Arc<App> {
        self.apps.router().table().apps()[0].app.clone()
    }

    /// The first app with actor classes: its actor host.
    pub fn actors(&self) -> Option<Arc<ActorHost>> {
        self.actors.first().cloned()
    }

    /// Every app and its versions: what deploys and a re-read
    /// configuration go through.
    pub fn apps(&self) -> &Arc<Apps> {
        &self.apps
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
            apps,
            actors,
            options,
            data_dir,
            cluster,
            images_kept_up,
            ..
        } = self;
        let admin_task =
            admin.map(|(listener, state)| tokio::spawn(weir_http::serve_admin(listener, state)));
        let keeping_up = images_kept_up.map(|k| tokio::spawn(k.mirror.keep_up(k.store, k.prepare)));
        let pacemaker = weir_runtime::pacemaker::start();
        weir_http::serve(listener, apps.router().clone(), options, shutdown).await;
        pacemaker.abort();
        if let Some(task) = admin_task {
            task.abort();
        }
        if let Some(task) = keeping_up {
            task.abort();
        }
        // Everything answered: resident processes end, each with its
        // receipt, their launches kept for the next start (every app's at
        // once: each is bounded by its own grace).
        let mut stopping = tokio::task::JoinSet::new();
        for tenant in apps.tenants().await {
            let programs = tenant.programs.clone();
            stopping.spawn(async move { programs.stop_with_server().await });
        }
        stopping.join_all().await;
        // The timer ledgers' exact rows waiting are written: a clean stop
        // leaves no row earlier than its timer.
        for tenant in apps.tenants().await {
            if let Some(host) = &tenant.actors {
                host.stop_with_server();
            }
        }
        // This node's actors go to the others now,
        // not after its lease.
        if let Some(cluster) = cluster {
            cluster.stop().await;
        }
        // The engines (and their tickers) live until serving stops, and
        // the data dir is held until the end.
        drop(actors);
        drop(apps);
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
