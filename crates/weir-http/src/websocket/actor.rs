//! Sockets actors own: held by Weir while their actor hibernates, with
//! their tags, attachment and the actor's auto-response, and delivered to
//! the actor as turns of its exported `weir:websocket/handler`.
//!
//! Invariants owned here:
//! - an actor names only its own sockets: every call looks the id up
//!   among the calling actor's sockets (the turn's seat), never a global
//!   id space, so another actor's socket is `no-such-socket`;
//! - what a client sends is delivered one turn at a time per socket, in
//!   order, by one task per socket; a turn that fails is rolled back (the
//!   actor's turn rules) and the socket stays open;
//! - the actor is told of each of its sockets' ends once (`on-close`),
//!   after the socket left its list, whatever ended it: a socket is listed
//!   in the actor's own storage (`weir_store::socket_ledger`) by the turn
//!   that accepts it, and taken off the list by the turn that tells the
//!   actor of its end (or, if that turn fails, right after it). A socket
//!   whose process or node could not tell the actor (killed, or no longer
//!   holding the actor: its `on-close` turn cannot open the actor) stays
//!   listed, and whoever opens the actor's storage next tells it, with
//!   1006 and [`LOST_REASON`]: in cluster mode the actor's next owner;
//! - a socket's id is unique among its actor's sockets across processes
//!   and nodes (the ledger keeps the sequence), so a listed socket of an
//!   earlier process is never taken for one open here;
//! - a send or a close is a commit point of its turn: the turn's writes
//!   are committed (and in cluster mode durable) before it leaves. A send
//!   never waits on a client: a full queue closes the socket with 1008;
//! - every other socket effect of a turn takes place only if the turn
//!   commits ([`weir_actors::gate::Effect`]): an attachment or an
//!   auto-response set in a turn that rolls back is not kept (the turn
//!   itself reads its own), and a socket accepted in a turn exists only
//!   once the turn ends well and its 101 goes out. Until then it is the
//!   turn's alone: no delivery, no `on-close`, and the older socket its
//!   replacement key names stays open;
//! - an accept that is refused (a limit, a bad tag) closes nothing; one
//!   with a replacement key closes the older socket of that key with 1000
//!   only once the new one is accepted and its turn committed;
//! - in cluster mode a socket lives only as long as its node's hold on
//!   the actor: it is closed with 1012 when that ends, so that the actor's
//!   next owner holds all of the sockets its clients reach it by;
//! - a deleted actor's sockets are its own to the end: its deletion
//!   closes them (1001, "the actor was deleted") before its database goes,
//!   and neither their last messages nor their ends are delivered to a
//!   new actor of the same name, which finds none of them;
//! - at most `max_sockets_per_actor` sockets per actor, at most
//!   [`MAX_TAGS`] tags of [`MAX_TAG_BYTES`], an attachment of at most
//!   [`MAX_ATTACHMENT_BYTES`], an auto-response of at most
//!   `MAX_AUTO_RESPONSE_BYTES` each way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use wasmtime::StoreContextMut;
use wasmtime::component::Linker;
use weir_actors::bindings::ActorSeat;
use weir_actors::gate::Effect;
use weir_actors::placement::BoxFuture;
use weir_actors::{ActorAddress, ActorHost, Holdings};
use weir_runtime::guest_state::GenerationState;

use super::close::{self, CLOSE_GOING_AWAY, CLOSE_NORMAL, CLOSE_SERVICE_RESTART, Close};
use super::hub::ClosedBy;
use super::socket::{
    self, Incoming, MAX_AUTO_RESPONSE_BYTES, SocketError, SocketReceiver, SocketSender,
};
use super::wire::Wire;
use super::worker::{
    SocketInfo, UpgradeOffer, from_guest, switching_protocols, to_guest, to_guest_error, types,
};

/// Most tags one socket carries.
pub const MAX_TAGS: usize = 10;
/// Longest tag, and longest replacement key.
pub const MAX_TAG_BYTES: usize = 256;
/// Largest attachment kept with a socket (held in memory while the actor
/// hibernates).
pub const MAX_ATTACHMENT_BYTES: usize = 16 * 1024;

/// Why a deleted actor's sockets were closed (with 1001, going away).
pub const DELETED_REASON: &str = "the actor was deleted";

/// Why an actor's sockets were closed when its node stopped owning it
/// (with 1012, service restart: a client that connects again reaches the
/// actor's new owner).
pub const MOVED_REASON: &str = "the actor moved to another node";

/// Why an actor's socket was closed when what its turn had written before
/// a send or a close could not be made durable (with 1012: a client that
/// connects again reaches the actor as its storage really is).
pub const UNDURABLE_REASON: &str = "the actor's writes could not be made durable";

/// What an actor is told of a socket whose end its process or node could
/// not tell it (with 1006, abnormal closure, as a browser reports a
/// connection lost without a close frame).
pub const LOST_REASON: &str = "the socket was lost with the process or node that held it";

/// The code an actor is told a lost socket ended with.
pub const CLOSE_ABNORMAL: u16 = 1006;

/// The interface actor classes export to receive their sockets' turns.
pub const HANDLER_INTERFACE: &str = "weir:websocket/handler@0.1.0";
const ACTOR_INTERFACE: &str = "weir:websocket/actor@0.1.0";

/// One socket an actor holds.
struct Held {
    sender: SocketSender,
    tags: Vec<String>,
    key: Option<String>,
    attachment: Mutex<Attachment>,
    auto_at: Arc<AtomicU64>,
    /// Set when its actor is deleted: nothing of it reaches an actor again.
    orphaned: Arc<AtomicBool>,
}

/// A socket's attachment: what committed turns set, and what the turn
/// running now set and has not yet committed (with the number of that
/// call, so that only the last call's outcome clears it).
#[derive(Default)]
struct Attachment {
    kept: Option<Vec<u8>>,
    staged: Option<(u64, Vec<u8>)>,
    calls: u64,
}

/// One actor's sockets in this process. Socket ids are the actor's own,
/// so the ids of a deleted actor's sockets come again for a new actor of
/// its name: each set is made with an `epoch` of its own, which the tasks
/// of its sockets carry, so that none of them touches a namesake's set.
#[derive(Default)]
struct ActorSet {
    epoch: u64,
    sockets: HashMap<u64, Arc<Held>>,
    /// Sockets off `sockets` whose end the actor is being told of (by
    /// their own task, or as lost ones): still listed in its storage, and
    /// not lost.
    ending: std::collections::HashSet<u64>,
    auto: Arc<socket::AutoResponse>,
}

/// Every actor's sockets.
pub struct ActorSockets {
    host: OnceLock<Weak<ActorHost>>,
    /// Put before `actor:CLASS` in receipts and metrics: the app's name
    /// and a `/` on a server of several apps.
    prefix: String,
    actors: Mutex<HashMap<ActorAddress, ActorSet>>,
    /// Numbers the actor sets as they are made.
    epochs: AtomicU64,
    /// Itself, for the tasks its hooks start.
    me: Weak<ActorSockets>,
}

/// `actor`'s set, made (with a new epoch) if it has none.
fn set_of<'m>(
    actors: &'m mut HashMap<ActorAddress, ActorSet>,
    epochs: &AtomicU64,
    actor: &ActorAddress,
) -> &'m mut ActorSet {
    actors.entry(actor.clone()).or_insert_with(|| ActorSet {
        epoch: epochs.fetch_add(1, Ordering::Relaxed),
        ..ActorSet::default()
    })
}

impl ActorSockets {
    /// The sockets of one app's actors; `prefix` as [`ActorSockets::label`]
    /// says.
    pub fn new(prefix: &str) -> Arc<Self> {
        Arc::new_cyclic(|me| ActorSockets {
            host: OnceLock::new(),
            prefix: prefix.to_string(),
            actors: Mutex::new(HashMap::new()),
            epochs: AtomicU64::new(1),
            me: me.clone(),
        })
    }

    /// How receipts, metrics and deploys name the sockets of `class`.
    pub fn label(&self, class: &str) -> String {
        format!("{}actor:{class}", self.prefix)
    }

    /// Binds the actor host the sockets' turns run on (it is made after the
    /// linkers this interface is in).
    pub fn connect(&self, host: &Arc<ActorHost>) {
        let _ = self.host.set(Arc::downgrade(host));
    }

    fn actors(&self) -> std::sync::MutexGuard<'_, HashMap<ActorAddress, ActorSet>> {
        self.actors.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn held(&self, actor: &ActorAddress, id: u64) -> Result<Arc<Held>, types::Error> {
        self.actors()
            .get(actor)
            .and_then(|set| set.sockets.get(&id).cloned())
            .ok_or(types::Error::NoSuchSocket)
    }

    /// Sockets `actor` holds open now.
    pub fn count(&self, actor: &ActorAddress) -> usize {
        self.actors().get(actor).map_or(0, |set| set.sockets.len())
    }

    /// The set of `actor` made in `epoch`, if it is still there.
    fn set_in<'m>(
        actors: &'m mut HashMap<ActorAddress, ActorSet>,
        actor: &ActorAddress,
        epoch: u64,
    ) -> Option<&'m mut ActorSet> {
        actors.get_mut(actor).filter(|set| set.epoch == epoch)
    }

    fn forget(&self, actor: &ActorAddress, epoch: u64, id: u64) {
        let mut actors = self.actors();
        if let Some(set) = Self::set_in(&mut actors, actor, epoch) {
            set.sockets.remove(&id);
            set.ending.remove(&id);
            if set.sockets.is_empty() && set.ending.is_empty() && !set.auto.is_set() {
                actors.remove(actor);
            }
        }
    }

    /// Socket `id` left `actor`'s list: its end is being told.
    fn ending(&self, actor: &ActorAddress, epoch: u64, id: u64) {
        if let Some(set) = Self::set_in(&mut self.actors(), actor, epoch) {
            set.sockets.remove(&id);
            set.ending.insert(id);
        }
    }

    /// True while socket `id` is `actor`'s (open, or its end being told)
    /// in the set of `epoch`: false once the actor was deleted, whose
    /// sockets reach no actor again.
    fn is_current(&self, actor: &ActorAddress, epoch: u64, id: u64) -> bool {
        Self::set_in(&mut self.actors(), actor, epoch)
            .is_some_and(|set| set.sockets.contains_key(&id) || set.ending.contains(&id))
    }
}

/// The calling actor, if the call is an actor's turn.
fn caller(state: &GenerationState) -> Option<ActorAddress> {
    let seat = state.extension::<ActorSeat>()?;
    Some(ActorAddress {
        class: seat.identity.class.clone(),
        name: seat.identity.name.clone(),
    })
}

type Accepted = Result<u64, types::Error>;

impl ActorSockets {
    fn accept(
        self: &Arc<Self>,
        state: &mut GenerationState,
        tags: Vec<String>,
        key: Option<String>,
        protocol: Option<String>,
    ) -> wasmtime::Result<Accepted> {
        let Some(actor) = caller(state) else {
            return Ok(Err(types::Error::NotAnActor));
        };
        if tags.len() > MAX_TAGS {
            return Ok(Err(types::Error::Invalid(format!(
                "at most {MAX_TAGS} tags"
            ))));
        }
        if tags
            .iter()
            .chain(key.iter())
            .any(|t| t.len() > MAX_TAG_BYTES)
        {
            return Ok(Err(types::Error::Invalid(format!(
                "a tag or key is at most {MAX_TAG_BYTES} bytes"
            ))));
        }
        let Some(offer) = state.offer::<UpgradeOffer>() else {
            return Ok(Err(types::Error::NotAnUpgrade));
        };
        if let Some(p) = &protocol
            && !offer.handshake.protocols.contains(p)
        {
            return Ok(Err(types::Error::Invalid(format!(
                "the client did not offer the subprotocol {p:?}"
            ))));
        }
        let limits = offer.hub.limits.clone();
        // A socket this one replaces gives its place up.
        let replacing = key.as_ref().map_or(0, |key| {
            self.actors().get(&actor).map_or(0, |set| {
                set.sockets
                    .values()
                    .filter(|h| h.key.as_ref() == Some(key) && h.sender.is_open())
                    .count()
            })
        });
        if self.count(&actor) - replacing >= limits.max_sockets_per_actor {
            return Ok(Err(types::Error::Limit(format!(
                "max_sockets_per_actor ({}) reached",
                limits.max_sockets_per_actor
            ))));
        }
        let exports = self
            .host
            .get()
            .and_then(Weak::upgrade)
            .is_some_and(|host| host.exports(&actor.class, (HANDLER_INTERFACE, "on-message")));
        if !exports {
            return Ok(Err(types::Error::Invalid(format!(
                "class {} does not export {HANDLER_INTERFACE}",
                actor.class
            ))));
        }
        let Some(gate) = state.extension::<ActorSeat>().map(|seat| seat.gate.clone()) else {
            return Ok(Err(types::Error::NotAnActor));
        };
        // Listed in the actor's storage by this turn: kept if it commits.
        let id = match gate.write(|db| db.socket_opened()) {
            Ok(id) => id,
            Err(e) => {
                return Ok(Err(types::Error::Invalid(format!(
                    "the actor's storage refused the socket: {e}"
                ))));
            }
        };
        let unlisted = |gate: &weir_actors::gate::TurnGate| {
            let _ = gate.write(|db| db.socket_ended(id));
        };
        let (offer, answer) = state.take_offer::<UpgradeOffer>().expect("just seen");
        let Some((upgrade, permit)) = offer.take() else {
            unlisted(&gate);
            return Ok(Err(types::Error::NotAnUpgrade));
        };
        let (mut guest, mut wire) = socket::pair(
            limits.max_socket_message_bytes,
            limits.max_socket_send_queue_bytes,
            protocol.clone(),
        );
        let permit = Arc::new(permit);
        guest.receiver.hold(permit.clone());
        let response = switching_protocols(&offer, protocol.as_deref())?;
        if !answer.set(Ok(response)) {
            unlisted(&gate);
            return Ok(Err(types::Error::AlreadyAnswered));
        }
        let auto_at = Arc::new(AtomicU64::new(0));
        let orphaned = Arc::new(AtomicBool::new(false));
        let epoch = {
            let mut actors = self.actors();
            let set = set_of(&mut actors, &self.epochs, &actor);
            wire.auto = Some((set.auto.clone(), auto_at.clone()));
            set.sockets.insert(
                id,
                Arc::new(Held {
                    sender: guest.sender,
                    tags,
                    key: key.clone(),
                    attachment: Mutex::new(Attachment::default()),
                    auto_at,
                    orphaned: orphaned.clone(),
                }),
            );
            set.epoch
        };
        let wire = Wire {
            hub: offer.hub.clone(),
            permit,
            upgrade,
            end: wire,
            // An actor's socket outlives the turn that accepted it,
            // but not its node's hold on the actor.
            ending: self.tenure(&actor),
            app: self.label(&actor.class).into(),
            version: self
                .host
                .get()
                .and_then(Weak::upgrade)
                .and_then(|host| {
                    host.class_versions()
                        .into_iter()
                        .find(|(class, _)| *class == actor.class)
                })
                .map(|(_, version)| version)
                .unwrap_or_else(|| Arc::from("")),
            relayer: offer.relayer.clone(),
            protocol,
            grace: std::time::Duration::ZERO,
        };
        // The socket is the turn's until the turn ends well: then its
        // wire and its deliveries start, and the socket it replaces is
        // closed. A turn that fails gives its place back: its 101 never
        // went out, and the actor never hears of it.
        let sockets = self.clone();
        let receiver = guest.receiver;
        gate.defer(Effect::at_end(move |committed| {
            if !committed {
                sockets.forget(&actor, epoch, id);
                return;
            }
            let replaced: Vec<Arc<Held>> = match &key {
                Some(key) => sockets
                    .actors()
                    .get(&actor)
                    .map(|set| {
                        set.sockets
                            .iter()
                            .filter(|(other, h)| **other != id && h.key.as_ref() == Some(key))
                            .map(|(_, h)| h.clone())
                            .collect()
                    })
                    .unwrap_or_default(),
                None => Vec::new(),
            };
            for old in replaced {
                old.sender
                    .close_with(Close::new(CLOSE_NORMAL, "replaced by a new connection"));
            }
            tokio::spawn(wire.run());
            let mine = Mine { actor, epoch, id };
            tokio::spawn(deliver(sockets, mine, orphaned, receiver));
        }));
        Ok(Ok(id))
    }
}

impl ActorSockets {
    /// Resolves, with the close it ends a socket with, when this node's
    /// hold on `actor` ends (in cluster mode; never on one machine).
    fn tenure(&self, actor: &ActorAddress) -> super::wire::Ending {
        let tenure = self
            .host
            .get()
            .and_then(Weak::upgrade)
            .and_then(|host| host.placement().map(|p| p.tenure(actor)));
        match tenure {
            Some(tenure) => Box::pin(async move {
                tenure.await;
                (
                    Close::new(CLOSE_SERVICE_RESTART, MOVED_REASON),
                    ClosedBy::Weir,
                )
            }),
            None => Box::pin(std::future::pending()),
        }
    }
}

/// A deleted actor's sockets: closed, and forgotten before its namesake
/// could name them.
impl Holdings for ActorSockets {
    /// The sockets the actor's storage lists that no task here holds were
    /// lost with an earlier process or node: the actor is told of their
    /// ends, after the turn that opened it.
    fn opened(&self, actor: &ActorAddress, gate: &Arc<weir_actors::gate::TurnGate>) {
        let listed = match gate.with_db(|db| db.sockets_listed()) {
            Ok(listed) => listed,
            Err(e) => {
                tracing::warn!(actor = %actor, error = %e, "cannot read the sockets an actor's storage lists");
                return;
            }
        };
        if listed.is_empty() {
            return;
        }
        let (epoch, lost) = {
            let mut actors = self.actors();
            let held_here = |id: &u64| {
                actors
                    .get(actor)
                    .is_some_and(|set| set.sockets.contains_key(id) || set.ending.contains(id))
            };
            let lost: Vec<u64> = listed.into_iter().filter(|id| !held_here(id)).collect();
            if lost.is_empty() {
                return;
            }
            let set = set_of(&mut actors, &self.epochs, actor);
            set.ending.extend(lost.iter().copied());
            (set.epoch, lost)
        };
        let Some(me) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(tell_lost(me, actor.clone(), epoch, lost));
    }

    fn let_go<'a>(&'a self, actor: &'a ActorAddress) -> BoxFuture<'a, Result<(), String>> {
        let set = self.actors().remove(actor);
        for held in set.into_iter().flat_map(|set| set.sockets.into_values()) {
            held.orphaned.store(true, Ordering::Release);
            held.sender
                .close_with(Close::new(CLOSE_GOING_AWAY, DELETED_REASON));
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

/// One socket of one actor's set (see [`ActorSet`]).
struct Mine {
    actor: ActorAddress,
    epoch: u64,
    id: u64,
}

/// Delivers what the client of socket `mine` sends, one turn at a time,
/// and its end once.
async fn deliver(
    sockets: Arc<ActorSockets>,
    mine: Mine,
    orphaned: Arc<AtomicBool>,
    mut from: SocketReceiver,
) {
    let Mine { actor, epoch, id } = &mine;
    loop {
        let (incoming, last) = match from.receive().await {
            Ok(Incoming::Message(m)) => (Incoming::Message(m), false),
            Ok(Incoming::Close(c)) | Err(SocketError::Closed(c)) => (Incoming::Close(c), true),
            Err(e) => (
                Incoming::Close(Close::new(close::CLOSE_INTERNAL, e.to_string())),
                true,
            ),
        };
        // Its actor was deleted: nothing of it reaches an actor again.
        if orphaned.load(Ordering::Acquire) {
            return;
        }
        if last {
            sockets.ending(actor, *epoch, *id);
        }
        let Some(host) = sockets.host.get().and_then(Weak::upgrade) else {
            return;
        };
        let Ok(mut held) = Box::pin(host.exclusive(&actor.class, &actor.name)).await else {
            sockets.forget(actor, *epoch, *id);
            return;
        };
        // Deleted while this waited for its turn (its set is gone, or a
        // namesake's is there): a new actor of that name is not this
        // socket's.
        if orphaned.load(Ordering::Acquire) || !sockets.is_current(actor, *epoch, *id) {
            return;
        }
        // This node no longer holds the actor (cluster mode): nothing of
        // the socket runs here. It closes (its client reconnects to the
        // next owner), and stays listed: the node that opens the actor
        // next tells it of the end.
        if !holds(&host, actor) {
            if let Ok(socket) = sockets.held(actor, *id) {
                socket
                    .sender
                    .close_with(Close::new(CLOSE_SERVICE_RESTART, MOVED_REASON));
            }
            sockets.forget(actor, *epoch, *id);
            drop(held);
            return;
        }
        // Boxed: a turn's future is large, and this task lives as long as
        // its socket, mostly idle; only the turn running now pays for it.
        let ended = match incoming {
            Incoming::Message(m) => {
                Box::pin(host.call_export(
                    &mut held,
                    (HANDLER_INTERFACE, "on-message"),
                    (*id, to_guest(m)),
                ))
                .await
            }
            Incoming::Close(c) => {
                let frame = types::CloseFrame {
                    code: c.code,
                    reason: c.reason,
                };
                tell_end(&host, &mut held, *id, frame).await
            }
        };
        // Forgotten before the hold goes: a turn that opens the actor
        // next finds the socket either here or, still listed, lost.
        if last {
            sockets.forget(actor, *epoch, *id);
        }
        drop(held);
        if let Err(why) = ended {
            tracing::debug!(actor = %actor, socket = id, error = %why, "a socket's turn failed; it was rolled back");
        }
        if last {
            return;
        }
    }
}

/// True unless this node is of a cluster and does not hold `actor` now.
fn holds(host: &ActorHost, actor: &ActorAddress) -> bool {
    host.placement().is_none_or(|p| p.owns(actor))
}

/// Tells the held actor that its socket `id` ended with `frame`: one turn
/// that takes the socket off the actor's list and calls its `on-close`.
/// If the guest was called and the turn failed, the socket is taken off
/// the list after it (the actor was told once, and failed to hear it); if
/// the guest was never called (the actor could not be opened or woken
/// here: this node no longer holds it, say), the socket stays listed for
/// whoever opens the actor next.
async fn tell_end(
    host: &ActorHost,
    held: &mut weir_actors::Exclusive,
    id: u64,
    frame: types::CloseFrame,
) -> Result<Option<()>, String> {
    let called = AtomicBool::new(false);
    let unlist = |gate: &weir_actors::gate::TurnGate| {
        gate.write(|db| db.socket_ended(id))
            .map_err(|e| e.to_string())?;
        called.store(true, Ordering::Relaxed);
        Ok(())
    };
    let told =
        Box::pin(host.call_export_with(held, (HANDLER_INTERFACE, "on-close"), (id, frame), unlist))
            .await;
    if told.is_err() && called.load(Ordering::Relaxed) {
        // Best effort: a holder that cannot reach the storage leaves it
        // listed, which is what a later opening needs.
        let _ = held.storage(|db| db.socket_ended(id));
    }
    told
}

/// Tells `actor` of the end of each socket in `lost` (listed in its
/// storage, held by no task here; in its set of `epoch`), one turn each,
/// in order.
async fn tell_lost(sockets: Arc<ActorSockets>, actor: ActorAddress, epoch: u64, lost: Vec<u64>) {
    for id in lost {
        let Some(host) = sockets.host.get().and_then(Weak::upgrade) else {
            return;
        };
        let Ok(mut held) = Box::pin(host.exclusive(&actor.class, &actor.name)).await else {
            sockets.forget(&actor, epoch, id);
            continue;
        };
        // Deleted meanwhile: nothing of it is told to a namesake. Nor is
        // anything told by a node that no longer holds the actor.
        if !sockets.is_current(&actor, epoch, id) || !holds(&host, &actor) {
            sockets.forget(&actor, epoch, id);
            drop(held);
            continue;
        }
        let frame = types::CloseFrame {
            code: CLOSE_ABNORMAL,
            reason: LOST_REASON.to_string(),
        };
        let told = tell_end(&host, &mut held, id, frame).await;
        sockets.forget(&actor, epoch, id);
        drop(held);
        match told {
            Ok(_) => {
                tracing::info!(actor = %actor, socket = id, "an actor was told of a socket lost with the process or node that held it")
            }
            Err(why) => {
                tracing::debug!(actor = %actor, socket = id, error = %why, "telling an actor of a lost socket failed")
            }
        }
    }
}

/// `weir:websocket/actor` in every app's linker, with the sockets it
/// reaches.
pub(crate) fn add_to_linker(
    sockets: &Arc<ActorSockets>,
    linker: &mut Linker<GenerationState>,
) -> wasmtime::Result<()> {
    let mut actor = linker.instance(ACTOR_INTERFACE)?;
    let s = sockets.clone();
    actor.func_wrap(
        "accept",
        move |mut store: StoreContextMut<'_, GenerationState>,
              (tags, key, protocol): (Vec<String>, Option<String>, Option<String>)| {
            Ok((s.accept(store.data_mut(), tags, key, protocol)?,))
        },
    )?;
    let s = sockets.clone();
    actor.func_wrap(
        "send",
        move |store: StoreContextMut<'_, GenerationState>, (id, message): (u64, types::Message)| {
            let state = store.data();
            let Some(seat) = state.extension::<ActorSeat>() else {
                return Ok((Err(types::Error::NotAnActor),));
            };
            let actor = ActorAddress {
                class: seat.identity.class.clone(),
                name: seat.identity.name.clone(),
            };
            let held = match s.held(&actor, id) {
                Ok(held) => held,
                Err(e) => return Ok((Err(e),)),
            };
            let message = from_guest(message);
            if let Err(e) = held.sender.check(&message) {
                return Ok((Err(to_guest_error(e)),));
            }
            // What the client sees must not outlive the turn's writes: the
            // message leaves once they are committed, and in cluster mode
            // once the cluster's database has them; if they never are, the
            // socket closes (1012) rather than tell the client what the
            // actor's next owner will not know.
            seat.gate.defer(Effect::at_commit(move |committed| {
                if committed {
                    let _ = held.sender.send_or_close(message);
                } else {
                    held.sender
                        .close_with(Close::new(CLOSE_SERVICE_RESTART, UNDURABLE_REASON));
                }
            }));
            if let Err(why) = state.flush_output() {
                return Ok((Err(types::Error::Invalid(format!(
                    "output_gate_refused: {why}"
                ))),));
            }
            Ok((Ok(()),))
        },
    )?;
    let s = sockets.clone();
    actor.func_wrap(
        "close",
        move |store: StoreContextMut<'_, GenerationState>,
              (id, code, reason): (u64, u16, String)| {
            let state = store.data();
            let Some(seat) = state.extension::<ActorSeat>() else {
                return Ok((Err(types::Error::NotAnActor),));
            };
            let actor = ActorAddress {
                class: seat.identity.class.clone(),
                name: seat.identity.name.clone(),
            };
            let held = match s.held(&actor, id) {
                Ok(held) => held,
                Err(e) => return Ok((Err(e),)),
            };
            if let Err(e) = socket::closable(code, &reason) {
                return Ok((Err(to_guest_error(e)),));
            }
            // A close is seen by the client as a send is: not before the
            // turn's writes are durable.
            seat.gate.defer(Effect::at_commit(move |committed| {
                if committed {
                    let _ = held.sender.close(code, reason);
                } else {
                    held.sender
                        .close_with(Close::new(CLOSE_SERVICE_RESTART, UNDURABLE_REASON));
                }
            }));
            if let Err(why) = state.flush_output() {
                return Ok((Err(types::Error::Invalid(format!(
                    "output_gate_refused: {why}"
                ))),));
            }
            Ok((Ok(()),))
        },
    )?;
    let s = sockets.clone();
    actor.func_wrap(
        "sockets",
        move |store: StoreContextMut<'_, GenerationState>, (tag,): (Option<String>,)| {
            let Some(actor) = caller(store.data()) else {
                return Ok((Vec::new(),));
            };
            let actors = s.actors();
            let mut list: Vec<SocketInfo> = actors
                .get(&actor)
                .map(|set| {
                    set.sockets
                        .iter()
                        .filter(|(_, h)| h.sender.is_open())
                        .filter(|(_, h)| tag.as_ref().is_none_or(|t| h.tags.contains(t)))
                        .map(|(id, h)| SocketInfo {
                            id: *id,
                            tags: h.tags.clone(),
                            key: h.key.clone(),
                            auto_response_at: match h.auto_at.load(Ordering::Relaxed) {
                                0 => None,
                                at => Some(at),
                            },
                        })
                        .collect()
                })
                .unwrap_or_default();
            list.sort_by_key(|i| i.id);
            Ok((list,))
        },
    )?;
    let s = sockets.clone();
    actor.func_wrap(
        "set-attachment",
        move |store: StoreContextMut<'_, GenerationState>, (id, bytes): (u64, Vec<u8>)| {
            let Some(seat) = store.data().extension::<ActorSeat>() else {
                return Ok((Err(types::Error::NotAnActor),));
            };
            let actor = ActorAddress {
                class: seat.identity.class.clone(),
                name: seat.identity.name.clone(),
            };
            if bytes.len() > MAX_ATTACHMENT_BYTES {
                return Ok((Err(types::Error::Invalid(format!(
                    "an attachment is at most {MAX_ATTACHMENT_BYTES} bytes"
                ))),));
            }
            let held = match s.held(&actor, id) {
                Ok(held) => held,
                Err(e) => return Ok((Err(e),)),
            };
            // The turn reads its own at once; it is kept only if the turn
            // commits.
            let call = {
                let mut a = held.attachment.lock().unwrap_or_else(|p| p.into_inner());
                a.calls += 1;
                a.staged = Some((a.calls, bytes));
                a.calls
            };
            seat.gate.defer(Effect::at_commit(move |committed| {
                let mut a = held.attachment.lock().unwrap_or_else(|p| p.into_inner());
                let Some((staged, _)) = &a.staged else { return };
                let last = *staged == call;
                if committed && last {
                    a.kept = a.staged.take().map(|(_, bytes)| bytes);
                } else if last {
                    a.staged = None;
                }
            }));
            Ok((Ok(()),))
        },
    )?;
    let s = sockets.clone();
    actor.func_wrap(
        "attachment",
        move |store: StoreContextMut<'_, GenerationState>, (id,): (u64,)| {
            let Some(actor) = caller(store.data()) else {
                return Ok((Err(types::Error::NotAnActor),));
            };
            Ok((s.held(&actor, id).map(|held| {
                let a = held.attachment.lock().unwrap_or_else(|p| p.into_inner());
                match &a.staged {
                    Some((_, bytes)) => Some(bytes.clone()),
                    None => a.kept.clone(),
                }
            }),))
        },
    )?;
    let s = sockets.clone();
    actor.func_wrap(
        "set-auto-response",
        move |store: StoreContextMut<'_, GenerationState>,
              (pair,): (Option<(String, String)>,)| {
            let Some(seat) = store.data().extension::<ActorSeat>() else {
                return Ok((Err(types::Error::NotAnActor),));
            };
            let actor = ActorAddress {
                class: seat.identity.class.clone(),
                name: seat.identity.name.clone(),
            };
            if let Some((request, reply)) = &pair
                && (request.len() > MAX_AUTO_RESPONSE_BYTES || reply.len() > MAX_AUTO_RESPONSE_BYTES)
            {
                return Ok((Err(types::Error::Invalid(format!(
                    "an auto-response request and reply are each at most {MAX_AUTO_RESPONSE_BYTES} bytes"
                ))),));
            }
            // Weir answers with it only once the turn that set it commits.
            let s = s.clone();
            seat.gate.defer(Effect::at_commit(move |committed| {
                if committed {
                    set_of(&mut s.actors(), &s.epochs, &actor).auto.set(pair);
                }
            }));
            Ok((Ok(()),))
        },
    )?;
    Ok(())
}
