//! An app: one component, compiled and linked once, served by its lanes.
//!
//! Invariant owned here: a component that cannot be compiled, does not
//! export `wasi:http/incoming-handler`, or imports something Weir does not
//! provide is refused when the app is loaded — with the reason — never at
//! the first request. One generation is instantiated before the app is
//! offered to clients, so an app that cannot start is refused at once; the
//! other lanes make their first generation when they are first admitted
//! (an idle app costs one instance, not `max_concurrent`).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::component::{Component, Linker};
use wasmtime_wasi_http::p2::bindings::ProxyPre;

use crate::admission::Admission;
use crate::engine::WeirEngine;
use crate::extension::{Extras, HostInterfaces, InternalRoutes};
use crate::generation::{Generation, GenerationState, InstantiateError};
use crate::lane::{Lane, LaneBoard};
use crate::limits::Limits;
use crate::memory_budget::MemoryBudget;
use crate::metrics::AppMetrics;
use crate::outbound::OutboundRules;
use crate::receipt::ReceiptBook;
use crate::sql_pool::SqlPool;
use weir_store::KvStores;
use weir_store::sql::SqlDatabases;

/// Why an app could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is a core Wasm module, not a component; build it for wasm32-wasip2")]
    NotAComponent { path: String },
    #[error("{path} does not compile: {reason}")]
    Compile { path: String, reason: String },
    #[error("{path} cannot be linked: {reason}")]
    Link { path: String, reason: String },
    #[error("{path} does not export wasi:http/incoming-handler: {reason}")]
    NotAProxy { path: String, reason: String },
    #[error("{path}: {source}")]
    Instantiate {
        path: String,
        source: InstantiateError,
    },
}

/// The storage an app's guests may use, the threads their storage calls
/// run on, the internal domains they may call, and the host interfaces the
/// layers above add.
#[derive(Clone)]
pub struct Stores {
    pub kv: Arc<KvStores>,
    pub sql: Arc<SqlDatabases>,
    pub pool: Arc<SqlPool>,
    pub routes: InternalRoutes,
    pub interfaces: Vec<Arc<dyn HostInterfaces>>,
}

/// What every generation of an app is made from: compiled once, shared.
pub struct AppCode {
    engine: wasmtime::Engine,
    pub(crate) pre: ProxyPre<GenerationState>,
    pub limits: Limits,
    pub outbound: Arc<OutboundRules>,
    pub kv: Arc<KvStores>,
    pub sql: Arc<SqlDatabases>,
    pub pool: Arc<SqlPool>,
    /// The guest memory budget every instance reserves from.
    pub budget: Arc<MemoryBudget>,
    pub routes: InternalRoutes,
    /// The compiled component, for a layer's own exports.
    pub component: Component,
}

impl AppCode {
    pub fn engine(&self) -> &wasmtime::Engine {
        &self.engine
    }

    /// Compiles and links a component file.
    pub fn load(
        engine: &WeirEngine,
        path: &Path,
        limits: Limits,
        outbound: OutboundRules,
        stores: Stores,
    ) -> Result<AppCode, LoadError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::from_bytes(engine, &shown, &bytes, limits, outbound, stores)
    }

    pub fn from_bytes(
        engine: &WeirEngine,
        shown: &str,
        bytes: &[u8],
        limits: Limits,
        outbound: OutboundRules,
        stores: Stores,
    ) -> Result<AppCode, LoadError> {
        if is_core_module(bytes) {
            return Err(LoadError::NotAComponent {
                path: shown.to_string(),
            });
        }
        let component = engine.compile(bytes).map_err(|mut reason| {
            if reason.contains("memory") {
                reason.push_str(&format!(
                    " (memory_limit_bytes is {})",
                    limits.memory_limit_bytes
                ));
            }
            LoadError::Compile {
                path: shown.to_string(),
                reason,
            }
        })?;
        let budget = engine.budget().clone();
        let engine = engine.engine().clone();
        let link = |e: wasmtime::Error| LoadError::Link {
            path: shown.to_string(),
            reason: format!("{e:#}"),
        };
        let mut linker: Linker<GenerationState> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(link)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(link)?;
        crate::keyvalue::add_to_linker(&mut linker, GenerationState::keyvalue).map_err(link)?;
        crate::sql::add_to_linker(&mut linker, GenerationState::sql).map_err(link)?;
        for interfaces in &stores.interfaces {
            interfaces.add_to_linker(&mut linker).map_err(link)?;
        }
        let instance_pre = linker.instantiate_pre(&component).map_err(link)?;
        let pre = ProxyPre::new(instance_pre).map_err(|e| LoadError::NotAProxy {
            path: shown.to_string(),
            reason: format!("{e:#}"),
        })?;
        Ok(AppCode {
            engine,
            pre,
            limits,
            outbound: Arc::new(outbound),
            kv: stores.kv,
            sql: stores.sql,
            pool: stores.pool,
            budget,
            routes: stores.routes,
            component: component.clone(),
        })
    }
}

/// True when the bytes are a core module (version 1) rather than a component.
fn is_core_module(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes[0..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0]
}

/// A served app: its code, its lanes and its counters.
pub struct App {
    pub name: Arc<str>,
    pub code: AppCode,
    pub admission: Admission,
    pub board: LaneBoard,
    pub metrics: AppMetrics,
    pub receipts: Arc<ReceiptBook>,
    next_generation: AtomicU64,
    next_admission: AtomicU64,
}

impl App {
    /// Loads the app and instantiates the first generation of lane 0; the
    /// other lanes wait, without one, until they are needed.
    pub async fn start(
        name: String,
        code: AppCode,
        receipts: Arc<ReceiptBook>,
        shown: &str,
    ) -> Result<Arc<App>, LoadError> {
        let lanes = code.limits.max_concurrent;
        let metrics = receipts.metrics().clone();
        let app = Arc::new(App {
            receipts,
            name: name.into(),
            admission: Admission::new(code.limits.max_queued),
            board: LaneBoard::new(lanes),
            metrics,
            next_generation: AtomicU64::new(1),
            next_admission: AtomicU64::new(1),
            code,
        });
        let first = app
            .instantiate()
            .await
            .map_err(|source| LoadError::Instantiate {
                path: shown.to_string(),
                source,
            })?;
        // Idle lanes are taken last-in first-out: lane 0, released last, is
        // admitted first, and a lane without a generation only when every
        // lane with one is busy.
        for id in (1..lanes).rev() {
            app.board.set_idle(id, 0);
            app.admission.release(
                &app,
                Lane {
                    id,
                    generation: None,
                },
            );
        }
        app.board.set_idle(0, first.number);
        app.admission.release(
            &app,
            Lane {
                id: 0,
                generation: Some(first),
            },
        );
        Ok(app)
    }

    /// Creates a fresh generation with the next number.
    pub async fn instantiate(&self) -> Result<Generation, InstantiateError> {
        let number = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let result =
            Generation::instantiate(&self.code, &self.metrics, number, Extras::default()).await;
        match &result {
            Ok(_) => self.metrics.generation_created(),
            Err(e) => {
                self.metrics.instantiation_failed();
                tracing::error!(app = %self.name, generation = number, error = %e.reason, "instantiation failed");
            }
        }
        result
    }

    pub fn next_admission_index(&self) -> u64 {
        self.next_admission.fetch_add(1, Ordering::Relaxed)
    }

    /// True while every lane can admit.
    pub fn healthy(&self) -> bool {
        self.board.all_available()
    }
}
