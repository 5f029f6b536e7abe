//! What one app holds for as long as the server runs, whatever version of
//! its code serves: its stores and databases, its actor host, its programs
//! and the internal routes its guests reach them by.
//!
//! Invariant owned here: an app's storage, actors, resident processes and
//! storage slots are its own — opened under its own data directory, reached
//! only through its own linker's host interfaces and internal routes — so
//! no guest of one app can name another app's data or processes.

use std::path::PathBuf;
use std::sync::Arc;

use weir_actors::{
    ActorClass, ActorDirectory, ActorHost, ActorInterfaces, ActorMetrics, StorageRoom,
};
use weir_cluster::Cluster;
use weir_http::websocket::{ActorSockets, SocketHub, SocketInterfaces};
use weir_programs::RunLimits;
use weir_programs::host::{ProgramInterfaces, ProgramsConfig, ProgramsHost};
use weir_programs::image_store::IMAGES_DIR;
use weir_programs::metrics::ProgramMetrics;
use weir_programs::process_router::ProcessRouter;
use weir_runtime::code::HostInterfaces;
use weir_runtime::compiled_code::{CodeCache, Compiler};
use weir_runtime::extension::{InternalRouter, InternalRoutes};
use weir_runtime::guest_log::GuestLog;
use weir_runtime::memory_budget::MemoryBudget;
use weir_runtime::metrics::Metrics;
use weir_runtime::outbound::OutboundRules;

/// The domains of Weir's internal routers: actors and processes.
pub const INTERNAL_DOMAINS: &[&str] = &[
    weir_actors::address::ACTOR_HOST_SUFFIX,
    weir_programs::process_router::PROCESS_HOST_SUFFIX,
];
use weir_runtime::receipt::ReceiptSink;
use weir_runtime::sql_pool::SqlPool;
use weir_runtime::{AppCode, LoadError, Stores, WeirEngine};
use weir_store::sql::SqlDatabases;
use weir_store::{Durability, KvStores};

use crate::app_spec::AppSpec;
use crate::recipe::Source;
use crate::{ServerError, ServerLimits};

/// What every app of the server is built with.
pub(crate) struct Shared {
    /// The request workers' share for long computations; each app has a
    /// seat in it.
    pub share: Arc<weir_runtime::compute_share::ComputeShare>,
    /// Workers' instances: pooled, sized for every app's lanes.
    pub engine: WeirEngine,
    /// Actor classes' instances, when any app declares classes.
    pub actor_engine: Option<WeirEngine>,
    pub code_cache: Arc<CodeCache>,
    pub compiler: Compiler,
    /// The server's WebSockets: a deploy closes the replaced version's.
    pub sockets: Arc<SocketHub>,
    pub metrics: Arc<Metrics>,
    pub actor_metrics: ActorMetrics,
    pub program_metrics: ProgramMetrics,
    pub receipts: Option<Arc<dyn ReceiptSink>>,
    /// Where guests' stdout and stderr go, if anywhere.
    pub guest_output: Option<Arc<dyn ReceiptSink>>,
    pub budget: Arc<MemoryBudget>,
    pub pool: Arc<SqlPool>,
    pub limits: ServerLimits,
    pub durability: Durability,
    pub data_dir: PathBuf,
    /// The server's own addresses: no guest may reach them.
    pub own: Vec<std::net::SocketAddr>,
    /// Lanes the worker engine has room for, across every app and every
    /// version alive at once.
    pub lane_capacity: usize,
    /// Names in metrics carry the app's name (a server of declared apps);
    /// a single-app server keeps its metrics as they were.
    pub qualified: bool,
    /// This node's part in its cluster, in cluster mode.
    pub cluster: Option<Arc<Cluster>>,
    /// Cluster mode: the images the nodes share, which every app's
    /// programs fetch from when this node lacks one.
    pub image_mirror: Option<Arc<weir_programs::shared_images::ImageMirror>>,
}

impl Shared {
    /// An app's allow-list, with the server's own addresses denied.
    pub fn outbound(&self, rules: &OutboundRules) -> OutboundRules {
        let mut rules = rules.clone();
        rules.deny_own(self.own.clone());
        // Where no router of the caller's answers them (a program, a
        // worker-only app), internal addresses are denied, never looked up.
        rules.reserve(INTERNAL_DOMAINS);
        rules
    }

    /// What the names of an app's actors and programs in metrics,
    /// receipts and socket labels start with: `NAME/` on a server of
    /// declared apps, nothing on a single-app server (whose names stay as
    /// they were).
    pub fn prefix(&self, app: &str) -> String {
        if self.qualified {
            format!("{app}/")
        } else {
            String::new()
        }
    }

    /// The name an app's actor class is counted under (and its sockets
    /// are labelled with).
    pub fn class_metrics_name(&self, app: &str, class: &str) -> String {
        format!("{}actor:{class}", self.prefix(app))
    }

    /// The class label of an app's class in the actor metrics.
    pub fn class_label(&self, app: &str, class: &str) -> String {
        format!("{}{class}", self.prefix(app))
    }

    /// Compiles and links one actor class's component for `app`; its
    /// receipts name the source's version.
    pub fn class(
        &self,
        app: &str,
        class: &str,
        source: &Source,
        limits: &ServerLimits,
        outbound: &OutboundRules,
        stores: &Stores,
    ) -> Result<ActorClass, ServerError> {
        let engine = self
            .actor_engine
            .as_ref()
            .expect("an app with classes runs on a server with an actor engine");
        let code = AppCode::from_bytes(
            engine,
            &self.code_cache,
            &source.shown,
            &source.bytes,
            limits.runtime.clone(),
            self.outbound(outbound),
            stores.clone(),
        )
        .map_err(|source| ServerError::ActorClass {
            class: class.to_string(),
            cause: source,
        })?;
        Ok(ActorClass::new(
            class.to_string(),
            code,
            limits.actors.clone(),
            self.metrics.for_app(&self.class_metrics_name(app, class)),
            self.actor_metrics.for_class(&self.class_label(app, class)),
        )
        .versioned(app, source.version()))
    }
}

/// One app's lasting parts.
pub(crate) struct Tenant {
    pub name: String,
    pub stores: Stores,
    pub actors: Option<Arc<ActorHost>>,
    pub programs: Arc<ProgramsHost>,
    /// Held here: the internal routes hold their routers weakly.
    _process_router: Arc<dyn InternalRouter>,
    /// Where its stores and databases run, in cluster mode.
    pub store_placement: Option<Arc<weir_cluster::stores::StorePlacement>>,
    /// What the app was started with that only a restart changes.
    pub kv_stores: Vec<String>,
    pub sql_databases: Vec<String>,
    pub classes: Vec<String>,
}

impl Tenant {
    /// Opens an app's stores, databases and actors under its data
    /// directory, its classes compiled from `classes`.
    pub async fn open(
        shared: &Shared,
        spec: &AppSpec,
        limits: &ServerLimits,
        classes: &[(String, Arc<Source>)],
    ) -> Result<Tenant, ServerError> {
        let dir = spec.data_dir(&shared.data_dir);
        let stores_error = |source| ServerError::Stores {
            dir: dir.clone(),
            cause: source,
        };
        // A cluster stores each database's snapshot as one PostgreSQL
        // value: a bound past what one value holds is refused at start,
        // not found at the first snapshot that cannot be stored.
        let max_database_bytes = limits.runtime.max_database_bytes;
        if shared.cluster.is_some() && max_database_bytes > weir_cluster::config::MAX_DATABASE_BYTES
        {
            return Err(ServerError::Config(format!(
                "app `{}`: max_database_bytes is {max_database_bytes}; in cluster mode it may be at \
                 most {} (a database's snapshot is one PostgreSQL value, at most 1 GB)",
                spec.name,
                weir_cluster::config::MAX_DATABASE_BYTES
            )));
        }
        // In cluster mode each store and database runs on the node that
        // owns it, opened there when it is claimed; none is opened here now.
        let store_placement = shared.cluster.as_ref().map(|cluster| {
            cluster.store_placement(
                &spec.name,
                &dir,
                &spec.kv_stores,
                &spec.sql_databases,
                shared.durability,
                weir_cluster::stores::OwnBounds {
                    max_bytes: max_database_bytes,
                    max_result_bytes: limits.runtime.max_sql_result_bytes,
                    longest_call: limits.runtime.event_limit.max(limits.runtime.session_limit),
                },
                shared.pool.clone(),
            )
        });
        let (kv, sql) = match &store_placement {
            Some(_) => (KvStores::default(), SqlDatabases::default()),
            None => {
                let kv = KvStores::open(&dir, &spec.kv_stores, shared.durability)
                    .map_err(stores_error)?;
                let sql = SqlDatabases::open(&dir, &spec.sql_databases, shared.durability)
                    .map_err(stores_error)?;
                kv.set_max_bytes(max_database_bytes).map_err(stores_error)?;
                sql.set_max_bytes(max_database_bytes)
                    .map_err(stores_error)?;
                (kv, sql)
            }
        };
        let programs_metrics = format!(
            "{}{}",
            shared.prefix(&spec.name),
            crate::PROGRAMS_METRICS_APP
        );
        // Its guests' output: records naming the app in Weir's log.
        let guest_log = shared
            .guest_output
            .as_ref()
            .map(|sink| Arc::new(GuestLog::new(sink.clone(), &spec.name)));
        // What the app's actors take on disk, their databases and their
        // storage slots together (`max_actor_storage_bytes`).
        let room = Arc::new(StorageRoom::default());
        // Programs run from the app's actors' turns: on an engine of their
        // own, made at the first run, from the server's image store into
        // the app's own storage slots.
        let programs = ProgramsHost::new(ProgramsConfig {
            images_dir: shared.data_dir.join(IMAGES_DIR),
            slots_dir: dir.join(weir_programs::storage_slot::SLOTS_DIR),
            room: room.clone(),
            compiler: shared.compiler.clone(),
            limits: RunLimits {
                runtime: limits.runtime.clone(),
                programs: limits.programs.clone(),
            },
            outbound: shared.outbound(&spec.outbound),
            budget: shared.budget.clone(),
            metrics: shared.metrics.for_app(&programs_metrics),
            program_metrics: shared.program_metrics.for_app(&spec.name),
            receipts: shared.receipts.clone(),
            guest_log: guest_log.clone(),
            secrets: spec.secrets.clone(),
            durable_slots_refused: shared.cluster.as_ref().map(|_| {
                "cluster_unsupported: a durable storage slot is one node's files and would not follow its owner to another node; use an ephemeral slot, or keep the data in the actor's storage"
            }),
            mirror: shared.image_mirror.clone(),
        });
        // Owners reach their processes at `<pid>.process.internal`.
        let process_router: Arc<dyn InternalRouter> = Arc::new(ProcessRouter {
            table: programs.table.clone(),
        });
        // The app's actors' sockets run their turns on its actor host.
        let actor_sockets = ActorSockets::new(&shared.prefix(&spec.name));
        // In every linker, so that a worker that imports `weir:actor`
        // links whether or not it runs as an actor (outside a turn, its
        // calls fail).
        let interfaces: Vec<Arc<dyn HostInterfaces>> = vec![
            Arc::new(ActorInterfaces),
            Arc::new(SocketInterfaces(actor_sockets.clone())),
            Arc::new(ProgramInterfaces(programs.clone())),
        ];
        let stores = Stores {
            kv: Arc::new(kv),
            sql: Arc::new(sql),
            pool: shared.pool.clone(),
            routes: InternalRoutes::default(),
            interfaces,
            router: store_placement
                .clone()
                .map(|p| p as Arc<dyn weir_runtime::extension::StoreRouter>),
            share: Some(shared.share.seat(&spec.name)),
            guest_log,
        };
        let actors = if classes.is_empty() {
            None
        } else {
            let mut built = Vec::new();
            for (class, source) in classes {
                built.push(shared.class(
                    &spec.name,
                    class,
                    source,
                    limits,
                    &spec.outbound,
                    &stores,
                )?);
            }
            let directory = ActorDirectory::new(&dir, shared.durability)
                .with_room(room)
                .with_stamps(&shared.data_dir);
            // In cluster mode each actor runs on the node that owns it, its
            // storage shipped to the cluster's database.
            let placement = shared
                .cluster
                .as_ref()
                .map(|c| c.actor_placement(&spec.name, shared.durability));
            let host = ActorHost::new(built, directory, shared.receipts.clone(), placement)
                .map_err(|source| ServerError::Actors {
                    dir: dir.clone(),
                    cause: source,
                })?;
            actor_sockets.connect(&host);
            // Deleting an actor ends its processes, removes its slots and
            // closes its sockets.
            host.keep_holdings(programs.clone());
            host.keep_holdings(actor_sockets.clone());
            let router: Arc<dyn InternalRouter> = host.clone();
            stores.routes.connect(&[router, process_router.clone()]);
            // What the durable storage slots hold counts in the room
            // before any turn writes, and a crash's ephemeral ones go.
            programs.open_slots().map_err(ServerError::Slots)?;
            host.start();
            // Owners whose processes the last run did not see end get them
            // back now, without waiting for a request (in cluster mode,
            // wherever the cluster places them: see
            // `weir_programs::handover`).
            programs.recover(&host).await;
            Some(host)
        };
        Ok(Tenant {
            name: spec.name.clone(),
            stores,
            actors,
            programs,
            _process_router: process_router,
            store_placement,
            kv_stores: spec.kv_stores.clone(),
            sql_databases: spec.sql_databases.clone(),
            classes: spec.actors.iter().map(|(c, _)| c.clone()).collect(),
        })
    }

    /// Compiles and links a worker component with this app's stores.
    pub fn worker_code(
        &self,
        shared: &Shared,
        source: &Source,
        limits: &ServerLimits,
        outbound: &OutboundRules,
    ) -> Result<AppCode, LoadError> {
        AppCode::from_bytes(
            &shared.engine,
            &shared.code_cache,
            &source.shown,
            &source.bytes,
            limits.runtime.clone(),
            shared.outbound(outbound),
            self.stores.clone(),
        )
    }
}
