//! Extension points: how the layers above the runtime — keyed actors today,
//! resident processes and sockets next — plug into it without the runtime
//! knowing them.
//!
//! Invariant owned here: the runtime runs a guest call the same way
//! whoever asked for it. A layer above adds what it needs only through
//! these four doors:
//! - [`crate::code::HostInterfaces`]: more host functions in an app's
//!   linker (declared with the linker it extends, so that this module
//!   depends on nothing else in the runtime);
//! - [`Extras`]: its own per-generation data (reached again with
//!   [`crate::guest_state::GenerationState::extension`]) and an
//!   [`OutputGate`] that every outbound request of the generation passes
//!   first;
//! - [`InternalRouter`] (joined through [`InternalRoutes`]): a domain of
//!   outbound hosts that never reaches the network, answered in-process.

use std::any::Any;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, Weak};

use bytes::Bytes;

/// Called before anything a generation produced leaves it (an outbound
/// request, an internal call): a layer that buffers effects makes them
/// durable here. An error refuses the request.
pub trait OutputGate: Send + Sync {
    /// Makes the buffered effects durable where the layer keeps them
    /// first (an actor's local commit).
    fn flush(&self) -> Result<(), String>;

    /// What is left to wait for before the output may leave, when the
    /// layer makes effects durable beyond this process too (cluster mode):
    /// the request goes only once it resolves `Ok`.
    fn settle(&self) -> Option<Settle> {
        None
    }
}

/// Where an app's key-value stores and SQL databases are, when a layer
/// above decides it (cluster mode): every call runs on the node that owns
/// its store, wherever the guest that made it runs. Without a router a
/// call runs on this node's own stores.
pub trait StoreRouter: Send + Sync + 'static {
    /// True when the app declares a key-value store of that name.
    fn has_store(&self, name: &str) -> bool;

    /// True when the app declares a SQL database of that name.
    fn has_database(&self, name: &str) -> bool;

    /// Runs a key-value call on `store`. `stop` ends a listing here;
    /// `deadline` ends it on another node.
    fn kv(
        &self,
        store: String,
        op: weir_store::kv_op::KvOp,
        call: StoreCall,
    ) -> Pin<
        Box<
            dyn Future<Output = Result<weir_store::kv_op::KvAnswer, weir_store::StoreError>> + Send,
        >,
    >;

    /// Runs a batch on `database`, in one transaction.
    fn sql(
        &self,
        database: String,
        statements: Vec<weir_store::sql::Statement>,
        call: StoreCall,
    ) -> Pin<
        Box<
            dyn Future<
                    Output = Result<
                        Vec<weir_store::sql::StatementResult>,
                        weir_store::sql::BatchError,
                    >,
                > + Send,
        >,
    >;
}

/// The bounds of one storage call: what stops it, and what it may hand
/// back.
#[derive(Clone)]
pub struct StoreCall {
    /// The event's stop check (its deadline or abandonment), for a call
    /// that runs here.
    pub stop: Option<weir_store::statement_bounds::StopCheck>,
    /// The event's deadline, for a call that runs on another node.
    pub deadline: Option<std::time::Instant>,
    pub max_result_bytes: usize,
}

/// What an output gate leaves to wait for before a request goes.
pub type Settle = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Passes `gate` before a write to a store leaves the generation: the
/// writes its layer buffered so far are made durable first (an actor's
/// turn commits them, and in cluster mode waits until the cluster has
/// them). A store write is an effect that leaves the actor, like an
/// outbound request: a turn that fails after it does not undo it, and it
/// never lands before the writes the turn made before it. Why not, if the
/// gate refuses.
pub async fn pass_gate(gate: Option<&Arc<dyn OutputGate>>) -> Result<(), String> {
    let Some(gate) = gate else {
        return Ok(());
    };
    gate.flush()?;
    match gate.settle() {
        Some(settle) => settle.await,
        None => Ok(()),
    }
}

/// Who a generation is, as the layer that made it names it (an actor's
/// identity): handed to internal routers with each of its requests, so a
/// router can answer only the callers it belongs to.
pub type Caller = Arc<dyn Any + Send + Sync>;

/// What a layer attaches to one generation when it instantiates it.
#[derive(Default)]
pub struct Extras {
    /// The layer's own per-generation data.
    pub data: Option<Box<dyn Any + Send>>,
    /// Passed before every outbound request of the generation.
    pub output_gate: Option<Arc<dyn OutputGate>>,
    /// Who the generation is, for internal routers (none: a worker).
    pub caller: Option<Caller>,
    /// Where its guest's output goes, when the layer names the instance
    /// in its records (an actor, a process); else the code's.
    pub guest_log: Option<Arc<crate::guest_log::GuestLog>>,
}

/// A domain of hosts answered in-process: requests to it never reach the
/// network and need no allow-list entry. Failures come back as Weir's JSON
/// error responses, never as transport errors.
pub trait InternalRouter: Send + Sync + 'static {
    /// True when `host` is in this router's domain (valid or not).
    fn handles(&self, host: &str) -> bool;

    /// Answers one request from `caller` (none: a worker).
    fn call(
        self: Arc<Self>,
        request: http::Request<Bytes>,
        caller: Option<Caller>,
    ) -> Pin<Box<dyn Future<Output = http::Response<Bytes>> + Send>>;
}

/// The internal routers an app's guests can reach, bound after the apps
/// are loaded: the routers themselves run apps (an actor calls actors), so
/// they exist only once the apps do.
#[derive(Clone, Default)]
pub struct InternalRoutes(Arc<OnceLock<Vec<Weak<dyn InternalRouter>>>>);

impl InternalRoutes {
    /// Binds the routers; later calls are ignored.
    pub fn connect(&self, routers: &[Arc<dyn InternalRouter>]) {
        let _ = self.0.set(routers.iter().map(Arc::downgrade).collect());
    }

    /// The router whose domain `host` is in, if any.
    pub fn find(&self, host: &str) -> Option<Arc<dyn InternalRouter>> {
        self.0
            .get()?
            .iter()
            .filter_map(Weak::upgrade)
            .find(|r| r.handles(host))
    }
}

/// What an event's caller offers the host interfaces for that event alone,
/// beside the request the guest sees (the transport's WebSocket upgrade).
/// It rides in the request's extensions and is taken out before the guest
/// sees the request; a host interface claims it with
/// [`crate::guest_state::GenerationState::take_offer`].
#[derive(Clone)]
pub struct EventOffer(pub Arc<dyn Any + Send + Sync>);

/// Marks a response a host interface set in its guest's stead that takes
/// the connection over (a WebSocket's 101). A guest cannot mark one, so an
/// informational status without the mark is the guest's own, and refused.
#[derive(Clone, Copy, Debug)]
pub struct Takeover;

/// The response a guest writes, or an error in its place.
pub type AnswerResult = Result<
    http::Response<wasmtime_wasi_http::p2::body::HyperOutgoingBody>,
    wasmtime_wasi_http::p2::bindings::http::types::ErrorCode,
>;

/// The one place an offered event's response goes: the guest's
/// `response-outparam` and the host interface that claimed the offer both
/// write here, and the first one wins.
#[derive(Clone)]
pub struct Answer(Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<AnswerResult>>>>);

impl Answer {
    pub fn new(to: tokio::sync::oneshot::Sender<AnswerResult>) -> Self {
        Answer(Arc::new(std::sync::Mutex::new(Some(to))))
    }

    /// Sets the event's response; false when it was already set.
    pub fn set(&self, response: AnswerResult) -> bool {
        let taken = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        match taken {
            Some(to) => {
                let _ = to.send(response);
                true
            }
            None => false,
        }
    }
}

/// An offer claimed by a host interface, with the means to answer.
pub struct Offered {
    pub offer: Arc<dyn Any + Send + Sync>,
    pub answer: Answer,
}
