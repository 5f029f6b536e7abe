//! App code: one component, compiled and linked once, that every
//! generation of an app (or every keyed instance of a class, or every run
//! of a program) is made from.
//!
//! Invariant owned here: a component that cannot be compiled, does not
//! export what it is entered by ([`Entry`]: `wasi:http/incoming-handler`
//! for what serves requests, `wasi:cli/run` for a command), or imports
//! something Weir does not provide is refused when it is loaded — with the
//! reason — never at the first request or run. The host interfaces a guest can import are exactly those
//! linked here: WASI, `wasi:http`, `wasi:keyvalue`, `weir:sql`, and what
//! the layers above add through [`HostInterfaces`].

use std::path::Path;
use std::sync::Arc;

use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use weir_store::KvStores;
use weir_store::sql::SqlDatabases;

use crate::compiled_code::{CodeCache, CompileError};
use crate::component_world::{self, World};
use crate::compute_share::ShareTenant;
use crate::engine::WeirEngine;
use crate::extension::InternalRoutes;
use crate::guest_log::GuestLog;
use crate::guest_state::GenerationState;
use crate::limits::Limits;
use crate::memory_budget::MemoryBudget;
use crate::outbound::OutboundRules;
use crate::sql_pool::SqlPool;

/// Why a fresh generation could not be created.
#[derive(Debug, thiserror::Error)]
#[error("cannot instantiate generation {number}: {reason}")]
pub struct InstantiateError {
    pub number: u64,
    pub reason: String,
    /// Its memory did not fit in the total guest memory budget.
    pub over_budget: bool,
}

/// A layer's host functions, added to the linker of every app and class
/// (the `weir:actor` interfaces, for example). One of the extension points
/// of [`crate::extension`].
pub trait HostInterfaces: Send + Sync {
    fn add_to_linker(&self, linker: &mut Linker<GenerationState>) -> wasmtime::Result<()>;
}

/// Why an app could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    #[error("{path} is a core Wasm module, not a component; build it for wasm32-wasip2")]
    NotAComponent { path: String },
    #[error("{path} does not compile: {reason}")]
    Compile { path: String, reason: String },
    /// Compiled, but its code could not be kept in the code cache (or the
    /// compiler could not be run): the server's trouble, not the
    /// component's.
    #[error("{path}: its compiled code cannot be kept: {reason}")]
    CodeNotKept { path: String, reason: String },
    #[error("{path} cannot be linked: {reason}")]
    Link { path: String, reason: String },
    #[error("{path} does not export wasi:http/incoming-handler: {reason}")]
    NotAProxy { path: String, reason: String },
    #[error("{path} is not a command (it does not export wasi:cli/run): {reason}")]
    NotACommand { path: String, reason: String },
    /// A component Weir can tell it cannot serve from its exports alone
    /// (a WASI 0.3 handler), refused before it is compiled.
    #[error("{path} cannot be served: {reason}")]
    Unservable { path: String, reason: String },
    #[error("{path}: {cause}")]
    Instantiate {
        path: String,
        cause: InstantiateError,
    },
}

impl LoadError {
    /// Why the code of the component at `path` could not be had.
    pub fn compiling(path: &str, e: CompileError) -> LoadError {
        let path = path.to_string();
        match e {
            CompileError::Refused(reason) => LoadError::Compile { path, reason },
            CompileError::NotKept(reason) => LoadError::CodeNotKept { path, reason },
        }
    }
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
    /// Where the stores and databases are, when a layer above decides
    /// (cluster mode); `kv` and `sql` are then empty.
    pub router: Option<Arc<dyn crate::extension::StoreRouter>>,
    /// The app's seat in the share of the request workers its long
    /// computations take turns at ([`crate::compute_share`]); none for
    /// code that runs on threads of its own (programs).
    pub share: Option<ShareTenant>,
    /// Where its guests' stdout and stderr go, as records naming the app
    /// ([`crate::guest_log`]); nowhere without one.
    pub guest_log: Option<Arc<GuestLog>>,
}

/// The export a kind of code is entered by: its pre-instantiated form,
/// and what a component that lacks it is told.
pub trait Entry: Sized + Send + Sync + 'static {
    fn new(pre: InstancePre<GenerationState>) -> wasmtime::Result<Self>;
    fn instance_pre(&self) -> &InstancePre<GenerationState>;
    fn refusal(path: String, reason: String) -> LoadError;
}

/// Code that serves requests (`wasi:http/proxy`): apps and actor classes.
impl Entry for ProxyPre<GenerationState> {
    fn new(pre: InstancePre<GenerationState>) -> wasmtime::Result<Self> {
        ProxyPre::new(pre)
    }
    fn instance_pre(&self) -> &InstancePre<GenerationState> {
        ProxyPre::instance_pre(self)
    }
    fn refusal(path: String, reason: String) -> LoadError {
        LoadError::NotAProxy { path, reason }
    }
}

/// Code that runs to completion (`wasi:cli/command`): programs.
impl Entry for CommandPre<GenerationState> {
    fn new(pre: InstancePre<GenerationState>) -> wasmtime::Result<Self> {
        CommandPre::new(pre)
    }
    fn instance_pre(&self) -> &InstancePre<GenerationState> {
        CommandPre::instance_pre(self)
    }
    fn refusal(path: String, reason: String) -> LoadError {
        LoadError::NotACommand { path, reason }
    }
}

/// What every generation of an app is made from: compiled once, shared.
/// `E` is how it is entered: served (the default) or run as a command.
pub struct AppCode<E: Entry = ProxyPre<GenerationState>> {
    engine: wasmtime::Engine,
    pub(crate) pre: E,
    pub limits: Limits,
    pub outbound: Arc<OutboundRules>,
    pub kv: Arc<KvStores>,
    pub sql: Arc<SqlDatabases>,
    pub pool: Arc<SqlPool>,
    /// Where the stores are, in cluster mode.
    pub router: Option<Arc<dyn crate::extension::StoreRouter>>,
    /// The guest memory budget every instance reserves from.
    pub budget: Arc<MemoryBudget>,
    /// Where its long computations take their slices, if anywhere.
    pub share: Option<ShareTenant>,
    /// Where its guests' output goes (see [`Stores::guest_log`]).
    pub guest_log: Option<Arc<GuestLog>>,
    pub routes: InternalRoutes,
    /// The compiled component, for a layer's own exports.
    pub component: Component,
}

impl<E: Entry> AppCode<E> {
    pub fn engine(&self) -> &wasmtime::Engine {
        &self.engine
    }

    /// Compiles and links a component file.
    pub fn load(
        engine: &WeirEngine,
        cache: &CodeCache,
        path: &Path,
        limits: Limits,
        outbound: OutboundRules,
        stores: Stores,
    ) -> Result<AppCode<E>, LoadError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: shown.clone(),
            cause: source,
        })?;
        Self::from_bytes(engine, cache, &shown, &bytes, limits, outbound, stores)
    }

    /// Compiles (or takes from `cache`) and links a component's bytes.
    pub fn from_bytes(
        engine: &WeirEngine,
        cache: &CodeCache,
        shown: &str,
        bytes: &[u8],
        limits: Limits,
        outbound: OutboundRules,
        stores: Stores,
    ) -> Result<AppCode<E>, LoadError> {
        match component_world::served(bytes) {
            Ok(World::CoreModule) => {
                return Err(LoadError::NotAComponent {
                    path: shown.to_string(),
                });
            }
            Ok(world @ World::Http03 { .. }) => {
                return Err(LoadError::Unservable {
                    path: shown.to_string(),
                    reason: world.refusal().unwrap_or_default(),
                });
            }
            // Other worlds are refused by the linker below, which names
            // the first import or export that does not fit; bytes that do
            // not parse are named by the compiler.
            Ok(_) | Err(_) => {}
        }
        let component = cache.component(engine, bytes).map_err(|e| {
            let mut e = LoadError::compiling(shown, e);
            if let LoadError::Compile { reason, .. } = &mut e
                && reason.contains("memory")
            {
                reason.push_str(&format!(
                    " (memory_limit_bytes is {})",
                    limits.memory_limit_bytes
                ));
            }
            e
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
        let pre =
            E::new(instance_pre).map_err(|e| E::refusal(shown.to_string(), format!("{e:#}")))?;
        Ok(AppCode {
            engine,
            pre,
            limits,
            outbound: Arc::new(outbound),
            kv: stores.kv,
            sql: stores.sql,
            pool: stores.pool,
            router: stores.router,
            budget,
            share: stores.share,
            guest_log: stores.guest_log,
            routes: stores.routes,
            component: component.clone(),
        })
    }
}
