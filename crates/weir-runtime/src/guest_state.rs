//! The guest's state: what a generation's `Store` holds for its guest, and
//! the views host functions get of it.
//!
//! Invariant owned here: a host function reaches only what this state
//! hands it — the app's stores, the current event's scope, the storage
//! threads and the guest's output budget — and every one of those views
//! carries the scope, so nothing a guest starts escapes its event.

use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};
use weir_store::KvStores;
use weir_store::sql::SqlDatabases;

use crate::compute_share::{LONG_CALL_SLICES, ShareTenant};
use crate::guest_output::GuestOutput;
use crate::keyvalue::KeyValueView;
use crate::memory_budget::MemoryLimiter;
use crate::outbound::OutboundPolicy;
use crate::scope::EventScope;
use crate::sql::SqlView;
use crate::sql_pool::SqlPool;

/// Everything a generation's store holds for its guest.
pub struct GenerationState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) http: WasiHttpCtx,
    pub(crate) outbound: OutboundPolicy,
    pub(crate) kv: Arc<KvStores>,
    pub(crate) sql: Arc<SqlDatabases>,
    pub(crate) pool: Arc<SqlPool>,
    pub(crate) router: Option<Arc<dyn crate::extension::StoreRouter>>,
    pub(crate) max_result_bytes: usize,
    pub(crate) memory: MemoryLimiter,
    /// The guest's output budget (shared by its stdout and stderr).
    pub(crate) output: GuestOutput,
    /// A layer's own data for this generation ([`crate::extension::Extras::data`]).
    pub(crate) extension: Option<Box<dyn std::any::Any + Send>>,
    /// What the running event's caller offered its host interfaces, until
    /// one claims it or the event ends.
    pub(crate) offered: Option<crate::extension::Offered>,
    /// Epoch interruptions since the running call began.
    pub(crate) slices: u32,
    /// Where the call takes its slices once it is a long computation.
    pub(crate) share: Option<ShareTenant>,
}

impl WasiView for GenerationState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl GenerationState {
    /// What `wasi:keyvalue` calls see: the app's stores and the event's scope.
    pub(crate) fn keyvalue(&mut self) -> KeyValueView<'_> {
        KeyValueView {
            table: &mut self.table,
            stores: &self.kv,
            router: self.router.as_ref(),
            scope: self.outbound.scope.as_ref(),
            gate: self.outbound.output_gate.as_ref(),
            pool: &self.pool,
            max_result_bytes: self.max_result_bytes,
        }
    }
}

impl GenerationState {
    /// What `weir:sql` calls see: the app's databases and the event's scope.
    pub(crate) fn sql(&mut self) -> SqlView<'_> {
        SqlView {
            databases: &self.sql,
            router: self.router.as_ref(),
            scope: self.outbound.scope.as_ref(),
            gate: self.outbound.output_gate.as_ref(),
            pool: &self.pool,
            max_result_bytes: self.max_result_bytes,
        }
    }
}

impl GenerationState {
    /// The data a layer attached to this generation, if it is a `T`.
    pub fn extension<T: 'static>(&self) -> Option<&T> {
        self.extension.as_ref()?.downcast_ref()
    }

    /// The scope of the event running now, if any: host functions register
    /// their operations in it.
    pub fn scope(&self) -> Option<&Arc<EventScope>> {
        self.outbound.scope.as_ref()
    }

    /// The threads that run storage work, off the async workers.
    pub fn pool(&self) -> &Arc<SqlPool> {
        &self.pool
    }

    /// Sets (or clears) the scope of the event or turn running now.
    /// A new scope is a new event: the guest's output budget and its
    /// count of slices start over.
    pub fn set_scope(&mut self, scope: Option<Arc<EventScope>>) {
        if scope.is_some() {
            self.output.reset();
            self.slices = 0;
        }
        // An offer lives for one event, and so does an unfinished line.
        if scope.is_none() {
            self.offered = None;
            self.output.end_event();
        }
        self.outbound.scope = scope;
    }

    /// Hands `request` to the guest as its incoming request, with the
    /// response-outparam whose response arrives on `out`. An offer in the
    /// request's extensions ([`crate::extension::EventOffer`]) is kept for
    /// the host interfaces, and the response then comes from the guest or
    /// from the interface that claims the offer, whichever is first.
    pub fn open_call(
        &mut self,
        mut request: http::Request<http_body_util::Full<bytes::Bytes>>,
        out: tokio::sync::oneshot::Sender<crate::extension::AnswerResult>,
    ) -> wasmtime::Result<(
        wasmtime::component::Resource<wasmtime_wasi_http::p2::types::HostIncomingRequest>,
        wasmtime::component::Resource<wasmtime_wasi_http::p2::types::HostResponseOutparam>,
    )> {
        use crate::extension::{Answer, EventOffer, Offered};
        use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
        let offer = request.extensions_mut().remove::<EventOffer>();
        let mut view = self.http();
        let req = view.new_incoming_request(Scheme::Http, request)?;
        let (out, offered) = match offer {
            None => (view.new_response_outparam(out)?, None),
            Some(offer) => {
                let answer = Answer::new(out);
                let to = answer.clone();
                let out = view.new_response_outparam_from_callback(move |response| {
                    to.set(response);
                })?;
                (
                    out,
                    Some(Offered {
                        offer: offer.0,
                        answer,
                    }),
                )
            }
        };
        self.offered = offered;
        Ok((req, out))
    }

    /// Flushes the generation's output gate (an actor's turn makes its
    /// writes durable) before something it produced leaves it.
    pub fn flush_output(&self) -> Result<(), String> {
        match &self.outbound.output_gate {
            Some(gate) => gate.flush(),
            None => Ok(()),
        }
    }

    /// The running event's offer, if it is a `T` and not yet claimed.
    pub fn offer<T: std::any::Any + Send + Sync>(&self) -> Option<&T> {
        self.offered.as_ref()?.offer.downcast_ref()
    }

    /// Claims the running event's offer (see
    /// [`crate::extension::EventOffer`]) if it is a `T`; once claimed, or
    /// when it is not a `T`, it is gone for the rest of the event.
    pub fn take_offer<T: std::any::Any + Send + Sync>(
        &mut self,
    ) -> Option<(Arc<T>, crate::extension::Answer)> {
        let offered = self.offered.take()?;
        let offer = offered.offer.downcast::<T>().ok()?;
        Some((offer, offered.answer))
    }

    /// The table of the guest's resources, for host interfaces that hand
    /// the guest resources of their own.
    pub fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }

    /// The most linear memory the guest has reached, in bytes.
    pub fn memory_peak(&self) -> usize {
        self.memory.peak
    }

    /// Keeps the guest's peak linear memory in `to` as well, from now on,
    /// for readers that cannot reach the store while the guest runs.
    pub fn mirror_memory(&mut self, to: std::sync::Arc<std::sync::atomic::AtomicU64>) {
        to.store(
            self.memory.peak as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.memory.mirror = Some(to);
    }

    /// What the guest does at an epoch interruption: its handles are
    /// counted ([`GenerationState::check_held`]), then it yields to tokio,
    /// and a long computation also waits for its next slice of the share
    /// ([`crate::compute_share`]).
    pub(crate) fn interrupted(&mut self) -> wasmtime::Result<wasmtime::UpdateDeadline> {
        self.check_held()?;
        self.slices = self.slices.saturating_add(1);
        Ok(match &self.share {
            Some(share) if self.slices >= LONG_CALL_SLICES => {
                wasmtime::UpdateDeadline::YieldCustom(1, share.next_slice())
            }
            _ => wasmtime::UpdateDeadline::Yield(1),
        })
    }

    /// Counts what the guest's handles hold in the host (headers with their
    /// entries, unsent bodies' buffers, internal responses not yet read)
    /// with its linear memory; past
    /// `memory_limit_bytes` the guest is refused (an error that traps it),
    /// as a memory growth past it would be.
    pub(crate) fn check_held(&mut self) -> wasmtime::Result<()> {
        let held = crate::held::held_bytes(&mut self.table, self.outbound.body_buffer_bytes())
            + self.outbound.held_responses.bytes();
        let limit = self.memory.limit();
        if held.saturating_add(self.memory.peak) > limit {
            self.memory.exceeded = true;
            wasmtime::bail!(
                "the guest's handles hold {held} bytes in the host (headers, unsent \
                 bodies and unread responses), over memory_limit_bytes ({limit}) with its {} bytes of linear memory",
                self.memory.peak
            );
        }
        Ok(())
    }

    /// Why the guest was refused memory, if it was: past its own limit,
    /// or past the total budget.
    pub fn memory_refusal(&self) -> Option<crate::ErrorCode> {
        if self.memory.over_budget {
            Some(crate::ErrorCode::MemoryBudgetExceeded)
        } else if self.memory.exceeded {
            Some(crate::ErrorCode::MemoryLimitExceeded)
        } else {
            None
        }
    }
}

impl WasiHttpView for GenerationState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            hooks: &mut self.outbound,
            table: &mut self.table,
            ctx: &mut self.http,
        }
    }
}
