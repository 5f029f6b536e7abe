//! Cluster mode: several Weir nodes sharing one PostgreSQL database, each
//! actor (and each key-value store and SQL database) owned by exactly one
//! node at a time, and nothing acknowledged ever lost when a node dies.
//!
//! PostgreSQL holds membership (each node's lease), ownership (one row per
//! object: its owner and epoch) and the durable copy of every object's
//! storage (its log of commits and snapshots). A node runs an object's
//! turns on its local SQLite copy as on one machine; each commit's pages
//! go to PostgreSQL in a fenced statement before anything that followed
//! them leaves the node.
//!
//! - [`coordinator`]: the protocol's atomic steps, and [`postgres`] their
//!   implementation;
//! - [`lease`]: the node's session and its own judgement of it, and
//!   [`leaving`]: its objects handed over when it stops;
//! - [`ownership`]: who owns what, claims and placement;
//! - [`shipper`]: commits made durable through the fence, in order, and
//!   [`committer`]: several objects' commits in one statement;
//! - [`replicas`]: local copies made current before they open;
//! - [`actors`]: the actor placement; [`alarms`]: alarms of actors whose
//!   owner died;
//! - [`internal`] and [`envelope`]: calls between nodes, and
//!   [`call_versions`]: which versions of them nodes of two builds agree
//!   on while a cluster is upgraded; [`socket_relay`]: actors' WebSockets
//!   relayed to the node that owns them;
//! - [`images`]: the images every node runs, shared through the database;
//! - [`config`], [`error_code`]: settings and the errors cluster mode adds.

pub mod actors;
pub mod alarms;
pub mod call_versions;
pub mod committer;
pub mod config;
pub mod coordinator;
pub mod counters;
pub mod envelope;
pub mod error_code;
pub mod images;
pub mod internal;
pub mod lease;
pub mod leaving;
pub mod limits;
pub mod ownership;
pub mod postgres;
pub mod replicas;
pub mod shipper;
pub mod socket_relay;
pub mod store_wire;
pub mod stores;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use weir_actors::{ActorHost, Placement};
use weir_store::Durability;

pub use config::{ClusterConfig, ConfigError};
pub use error_code::ClusterErrorCode;
pub use limits::ClusterLimits;

use crate::coordinator::{CoordError, Coordinator};
use crate::internal::{Forwarder, Secret, Served};
use crate::lease::Lease;
use crate::ownership::Ownership;
use crate::replicas::Replicas;
use crate::shipper::Records;

/// Why a node could not join its cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{database}: {cause}")]
    Database { database: String, cause: CoordError },
    #[error("cannot listen for other nodes on {addr}: {cause}")]
    Listen {
        addr: SocketAddr,
        cause: std::io::Error,
    },
}

/// This node's part in its cluster.
pub struct Cluster {
    config: ClusterConfig,
    address: String,
    internal_addr: SocketAddr,
    lease: Arc<Lease>,
    ownership: Arc<Ownership>,
    records: Arc<Records>,
    replicas: Arc<Replicas>,
    forwarder: Forwarder,
    served: Arc<Served>,
    images: Arc<images::ClusterImages>,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The internal listener, which closes last.
    listening: Mutex<Option<JoinHandle<()>>>,
}

/// What `/status` shows of the cluster.
#[derive(Debug, Serialize)]
pub struct ClusterStatus {
    pub node: String,
    pub address: String,
    pub session: Option<i64>,
    pub lease_held: bool,
    pub lease_ms: u64,
    pub nodes: Vec<String>,
    /// The versions of calls between nodes this node speaks, oldest and
    /// newest ([`call_versions`]).
    pub call_versions: [u32; 2],
    /// The version of socket relays this node takes
    /// ([`socket_relay::SOCKET_RELAY_VERSION`]).
    pub socket_relay_version: u32,
    /// What this node shipped, claimed, rebuilt and handed on so far.
    pub counters: counters::CounterValues,
}

impl Cluster {
    /// Joins the cluster: connects to its database (creating the schema on
    /// first use), binds the internal listener and registers this node,
    /// waiting while an earlier run of it still holds a lease.
    pub async fn start(config: ClusterConfig) -> Result<Arc<Cluster>, ClusterError> {
        config.check()?;
        let database = postgres::redacted(&config.database);
        let postgres = Arc::new(
            postgres::Postgres::connect(&config.database, config.schema_patience)
                .await
                .map_err(|source| ClusterError::Database {
                    database: database.clone(),
                    cause: source,
                })?,
        );
        let coordinator: Arc<dyn Coordinator> = postgres.clone();
        let leasing: Arc<dyn Coordinator> = Arc::new(
            postgres::Postgres::for_lease(&config.database).map_err(|source| {
                ClusterError::Database {
                    database: database.clone(),
                    cause: source,
                }
            })?,
        );
        let listener =
            internal::bind(config.listen)
                .await
                .map_err(|source| ClusterError::Listen {
                    addr: config.listen,
                    cause: source,
                })?;
        let internal_addr = listener
            .local_addr()
            .map_err(|source| ClusterError::Listen {
                addr: config.listen,
                cause: source,
            })?;
        let address = config
            .advertise
            .clone()
            .unwrap_or_else(|| internal_addr.to_string());
        let lease = Lease::new(&config.node, &address, config.lease);
        lease
            .register(leasing.as_ref(), |_| true)
            .await
            .map_err(|source| ClusterError::Database {
                database: database.clone(),
                cause: source,
            })?;
        let ownership = Arc::new(Ownership::new(coordinator.clone(), lease.clone()));
        let records = Arc::new(Records::default());
        let (stop, stopped) = watch::channel(false);
        let served = Arc::new(Served::new(ownership.counters().clone(), lease.clone()));
        let keeper = tokio::spawn(lease.clone().keep(leasing, stopped.clone()));
        let listening = tokio::spawn(internal::serve(
            listener,
            Secret::new(&config.secret),
            served.clone(),
        ));
        Ok(Arc::new(Cluster {
            images: Arc::new(images::ClusterImages { postgres }),
            forwarder: Forwarder::new(
                &config.secret,
                &config.node,
                ownership.counters().clone(),
                coordinator.clone(),
            ),
            replicas: Arc::new(Replicas {
                ownership: ownership.clone(),
                records: records.clone(),
            }),
            config,
            address,
            internal_addr,
            lease,
            ownership,
            records,
            served,
            stop,
            tasks: Mutex::new(vec![keeper]),
            listening: Mutex::new(Some(listening)),
        }))
    }

    /// Where the internal listener is bound.
    pub fn internal_addr(&self) -> SocketAddr {
        self.internal_addr
    }

    /// The images the nodes share (see [`images`]).
    pub fn images(&self) -> Arc<dyn weir_programs::shared_images::SharedImages> {
        self.images.clone()
    }

    /// The placement of `app`'s actors on this node.
    pub fn actor_placement(&self, app: &str, durability: Durability) -> Arc<dyn Placement> {
        Arc::new(actors::ActorPlacement {
            app: app.to_string(),
            ownership: self.ownership.clone(),
            records: self.records.clone(),
            replicas: self.replicas.clone(),
            forwarder: self.forwarder.clone(),
            durability,
        })
    }

    /// The placement of `app`'s key-value stores and SQL databases (under
    /// `data_dir`) on this node; their calls run on `pool`.
    #[allow(clippy::too_many_arguments)]
    pub fn store_placement(
        &self,
        app: &str,
        data_dir: &std::path::Path,
        stores: &[String],
        databases: &[String],
        durability: Durability,
        own: stores::OwnBounds,
        pool: Arc<weir_runtime::sql_pool::SqlPool>,
    ) -> Arc<stores::StorePlacement> {
        stores::StorePlacement::new(
            app,
            data_dir.to_path_buf(),
            stores,
            databases,
            durability,
            own,
            self.ownership.clone(),
            self.replicas.clone(),
            self.forwarder.clone(),
            pool,
        )
    }

    /// Serves the apps' actors, stores and databases (and the sockets
    /// relayed to their actors, through `doors`) to the other nodes,
    /// and starts claiming the due alarms of actors whose owner died.
    pub fn serve(
        &self,
        actors: HashMap<String, Arc<ActorHost>>,
        stores: HashMap<String, Arc<stores::StorePlacement>>,
        doors: HashMap<String, Arc<dyn weir_actors::SocketDoor>>,
    ) {
        self.served.connect(actors.clone(), stores, doors);
        // Copies of actors deleted while this node was away.
        for (app, host) in &actors {
            let (app, host) = (app.clone(), host.clone());
            tokio::spawn(async move {
                match host.drop_stale_copies().await {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(app, dropped = n, "dropped local copies of deleted actors")
                    }
                    Err(e) => {
                        tracing::warn!(app, error = %e, "cannot look for local copies of deleted actors; they stay until the next start")
                    }
                }
            });
        }
        let sweeper = tokio::spawn(alarms::sweep(
            self.ownership.clone(),
            actors,
            self.stop.subscribe(),
        ));
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(sweeper);
    }

    /// Leaves the cluster: stops running other nodes' calls (those
    /// running finish), releases this node's lease and everything it
    /// owns, so other nodes take its objects over at once instead of after
    /// the lease, and only then closes the internal listener, once the
    /// calls that arrived meanwhile were answered "not run"
    /// ([`leaving`]).
    pub async fn stop(&self) {
        self.served.leaving.leave().await;
        self.stop.send_replace(true);
        let tasks: Vec<JoinHandle<()>> =
            std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            let _ = task.await;
        }
        self.served.leaving.released().await;
        self.served.leaving.close();
        let listening = self
            .listening
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(listening) = listening {
            let _ = listening.await;
        }
    }

    /// The cluster as `/status` shows it.
    pub fn status(&self) -> ClusterStatus {
        let held = self.lease.held();
        ClusterStatus {
            node: self.config.node.clone(),
            address: self.address.clone(),
            session: held.map(|h| h.session),
            lease_held: held.is_some(),
            lease_ms: self.config.lease.as_millis() as u64,
            nodes: self.lease.nodes().into_iter().map(|n| n.name).collect(),
            call_versions: [
                call_versions::OLDEST_CALL_VERSION,
                call_versions::CALL_VERSION,
            ],
            socket_relay_version: socket_relay::SOCKET_RELAY_VERSION,
            counters: self.ownership.counters().values(),
        }
    }
}
