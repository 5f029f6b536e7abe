//! One socket's two ends: the guest's (what host interfaces call) and the
//! wire's (what [`super::wire`] drives), and the bounded queues between them.
//!
//! Invariants owned here:
//! - what is sent to a socket and not yet written to its connection is
//!   counted at what it costs the host ([`Message::cost`]: its bytes and
//!   [`MESSAGE_COST_BYTES`] more, so an empty message is not free), and
//!   never passes `max_socket_send_queue_bytes`, except that one message
//!   always fits an empty queue: a sender waits for room
//!   ([`GuestEnd::send`]), or a socket that cannot wait is closed with 1008
//!   naming the limit ([`GuestEnd::send_or_close`]);
//! - at most [`INBOUND_MESSAGES_BUFFERED`] messages wait for the guest; past
//!   them the wire stops reading, so a fast client meets TCP back-pressure
//!   rather than growing memory; and the socket's place among
//!   `max_sockets` is held until the guest's receiving end is gone too
//!   ([`SocketReceiver::hold`]), so messages a closed socket left for the
//!   guest are counted among the open sockets until they are taken;
//! - a close the guest asks for is one an endpoint may send
//!   ([`super::close`]), or refused;
//! - once a socket has ended, every call on it says how it ended (the
//!   peer's close frame, or Weir's reason), and nothing more is queued.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use std::collections::VecDeque;

use tokio::sync::Notify;

use super::close::{CLOSE_NORMAL, CLOSE_POLICY, Close, MAX_CLOSE_REASON_BYTES, sendable_code};

/// Messages read from the client that wait for the guest to take them.
pub const INBOUND_MESSAGES_BUFFERED: usize = 4;

/// What a queued message costs the host besides its bytes: its place in
/// the queue, its buffer's header and allocation, and its frame's head.
/// Counted so that a guest sending empty messages to a client that reads
/// nothing meets the queue's bound like any other.
pub const MESSAGE_COST_BYTES: usize = 64;

/// A whole message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Text(String),
    Binary(Vec<u8>),
}

impl Message {
    pub fn len(&self) -> usize {
        match self {
            Message::Text(t) => t.len(),
            Message::Binary(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the message costs the host while it is queued.
    pub fn cost(&self) -> usize {
        self.len() + MESSAGE_COST_BYTES
    }
}

/// What the client sent, as the guest takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Incoming {
    Message(Message),
    /// The client closed (Weir answers the close handshake).
    Close(Close),
}

/// What the guest sends, as the wire takes it.
#[derive(Debug)]
pub enum Outgoing {
    Message(Message),
    /// A close; `by_weir` when Weir closes in the guest's stead (a full
    /// queue, a replaced connection).
    Close {
        close: Close,
        by_weir: bool,
    },
}

/// Why a call on a socket failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SocketError {
    /// The socket has ended: how.
    #[error("the socket is closed ({})", .0.code)]
    Closed(Close),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Invalid(String),
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

struct Shared {
    max_message_bytes: usize,
    max_queue_bytes: usize,
    /// Bytes queued and not yet written.
    queued: AtomicUsize,
    /// The most `queued` ever was (its cost, [`Message::cost`]): what the
    /// socket's receipt says its send queue held at its fullest.
    queued_peak: AtomicUsize,
    /// Room in the queue, or the socket's end.
    room: Notify,
    /// Set once: the guest asked to close, or the socket ended.
    closing: AtomicBool,
    /// How the socket ended, once it has.
    ended: Mutex<Option<Close>>,
    /// What the client sent and the guest has not taken (at most
    /// INBOUND_MESSAGES_BUFFERED). A VecDeque allocates only when used: an
    /// idle socket holds no queue memory.
    inbound: Mutex<VecDeque<Incoming>>,
    /// A message for the guest, or the wire's end.
    inbound_ready: Notify,
    /// Room in `inbound`, or the guest's end.
    inbound_room: Notify,
    /// What the guest sent and the wire has not written.
    outbound: Mutex<VecDeque<Outgoing>>,
    /// Something for the wire, or the guest's end.
    outbound_ready: Notify,
    /// The guest dropped its sending end.
    guest_gone: AtomicBool,
    /// The guest dropped its receiving end.
    receiver_gone: AtomicBool,
    /// The wire's end is gone: nothing more arrives.
    wire_gone: AtomicBool,
}

/// The guest's end of a socket: what sends to it and what receives from
/// it (an actor's sockets keep the two apart: any turn sends, one task
/// delivers).
pub struct GuestEnd {
    pub sender: SocketSender,
    pub receiver: SocketReceiver,
    /// The subprotocol agreed in the handshake.
    pub protocol: Option<String>,
}

/// What sends to a socket.
pub struct SocketSender {
    shared: Arc<Shared>,
}

/// What receives from a socket.
pub struct SocketReceiver {
    shared: Arc<Shared>,
    /// The socket's place, shared with its wire: given back once both are
    /// gone.
    place: Option<Arc<super::hub::SocketPermit>>,
}

impl Drop for SocketSender {
    fn drop(&mut self) {
        self.shared.guest_gone.store(true, Ordering::Release);
        self.shared.outbound_ready.notify_one();
    }
}

impl Drop for SocketReceiver {
    fn drop(&mut self) {
        self.shared.receiver_gone.store(true, Ordering::Release);
        self.shared.inbound_room.notify_one();
    }
}

/// The wire's end of a socket.
pub struct WireEnd {
    shared: Arc<Shared>,
    /// What the wire answers by itself, and when it last did.
    pub auto: Option<(Arc<AutoResponse>, Arc<AtomicU64>)>,
}

/// Longest auto-response request, and reply: a ping and its pong, not a
/// second channel.
pub const MAX_AUTO_RESPONSE_BYTES: usize = 2048;

/// A text message the wire answers by itself, without the guest: a
/// request and its reply.
#[derive(Default)]
pub struct AutoResponse(Mutex<Option<(String, String)>>);

impl AutoResponse {
    pub fn set(&self, pair: Option<(String, String)>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = pair;
    }

    pub fn is_set(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// The reply to `text`, if it is the request.
    pub fn reply(&self, text: &str) -> Option<String> {
        match &*self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((request, reply)) if request == text => Some(reply.clone()),
            _ => None,
        }
    }
}

/// A socket's two ends, under these limits.
pub fn pair(
    max_message_bytes: usize,
    max_queue_bytes: usize,
    protocol: Option<String>,
) -> (GuestEnd, WireEnd) {
    let shared = Arc::new(Shared {
        max_message_bytes,
        max_queue_bytes,
        queued: AtomicUsize::new(0),
        queued_peak: AtomicUsize::new(0),
        room: Notify::new(),
        closing: AtomicBool::new(false),
        ended: Mutex::new(None),
        inbound: Mutex::new(VecDeque::new()),
        inbound_ready: Notify::new(),
        inbound_room: Notify::new(),
        outbound: Mutex::new(VecDeque::new()),
        outbound_ready: Notify::new(),
        guest_gone: AtomicBool::new(false),
        receiver_gone: AtomicBool::new(false),
        wire_gone: AtomicBool::new(false),
    });
    (
        GuestEnd {
            sender: SocketSender {
                shared: shared.clone(),
            },
            receiver: SocketReceiver {
                shared: shared.clone(),
                place: None,
            },
            protocol,
        },
        WireEnd { shared, auto: None },
    )
}

impl Shared {
    fn ended(&self) -> Option<Close> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn closed_error(&self) -> SocketError {
        SocketError::Closed(
            self.ended()
                .unwrap_or_else(|| Close::new(CLOSE_NORMAL, "closed by the guest")),
        )
    }

    /// Takes `len` bytes of queue if they fit (one message always fits an
    /// empty queue).
    fn try_reserve(&self, len: usize) -> bool {
        match self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q == 0 || q + len <= self.max_queue_bytes).then_some(q + len)
            }) {
            Ok(before) => {
                self.queued_peak.fetch_max(before + len, Ordering::Relaxed);
                true
            }
            Err(_) => false,
        }
    }
}

/// Why a guest may not close with `code` and `reason`, if it may not.
pub fn closable(code: u16, reason: &str) -> Result<(), SocketError> {
    if !sendable_code(code) {
        return Err(SocketError::Invalid(format!(
            "close code {code} may not be sent (1000-1003, 1007-1011, 3000-4999)"
        )));
    }
    if reason.len() > MAX_CLOSE_REASON_BYTES {
        return Err(SocketError::Invalid(format!(
            "a close reason is at most {MAX_CLOSE_REASON_BYTES} bytes"
        )));
    }
    Ok(())
}

fn locked<T>(queue: &Mutex<VecDeque<T>>) -> std::sync::MutexGuard<'_, VecDeque<T>> {
    queue.lock().unwrap_or_else(|p| p.into_inner())
}

impl SocketReceiver {
    /// Holds the socket's place until this end is gone as well as the
    /// wire's.
    pub fn hold(&mut self, place: Arc<super::hub::SocketPermit>) {
        self.place = Some(place);
    }

    /// The next thing the client sent; once the socket has ended, how.
    pub async fn receive(&mut self) -> Result<Incoming, SocketError> {
        let shared = &self.shared;
        loop {
            // Checked before the queue: a message pushed just before the
            // wire ended is still taken.
            let gone = shared.wire_gone.load(Ordering::Acquire);
            if let Some(incoming) = locked(&shared.inbound).pop_front() {
                shared.inbound_room.notify_one();
                return Ok(incoming);
            }
            if gone {
                return Err(shared.closed_error());
            }
            shared.inbound_ready.notified().await;
        }
    }
}

impl GuestEnd {
    pub async fn receive(&mut self) -> Result<Incoming, SocketError> {
        self.receiver.receive().await
    }

    pub async fn send(&self, message: Message) -> Result<(), SocketError> {
        self.sender.send(message).await
    }

    pub fn send_or_close(&self, message: Message) -> Result<(), SocketError> {
        self.sender.send_or_close(message)
    }

    pub fn close(&self, code: u16, reason: String) -> Result<(), SocketError> {
        self.sender.close(code, reason)
    }
}

impl SocketSender {
    /// True until the socket has ended or a close was asked for.
    pub fn is_open(&self) -> bool {
        !self.shared.closing.load(Ordering::Acquire)
    }

    /// Closes the socket with Weir's reason (a replaced connection).
    pub fn close_with(&self, close: Close) {
        self.begin_close(close, true);
    }

    /// Why `message` could not be sent now, if it could not (the socket is
    /// closing, or the message is too large).
    pub fn check(&self, message: &Message) -> Result<(), SocketError> {
        if self.shared.closing.load(Ordering::Acquire) {
            return Err(self.shared.closed_error());
        }
        if message.len() > self.shared.max_message_bytes {
            return Err(SocketError::TooLarge(format!(
                "a message of {} bytes is over max_socket_message_bytes ({})",
                message.len(),
                self.shared.max_message_bytes
            )));
        }
        Ok(())
    }

    fn queue(&self, message: Message) -> Result<(), SocketError> {
        if self.shared.wire_gone.load(Ordering::Acquire) {
            return Err(self.shared.closed_error());
        }
        locked(&self.shared.outbound).push_back(Outgoing::Message(message));
        self.shared.outbound_ready.notify_one();
        Ok(())
    }

    /// Queues a message, waiting while the queue is full.
    pub async fn send(&self, message: Message) -> Result<(), SocketError> {
        self.check(&message)?;
        let len = message.cost();
        loop {
            let room = self.shared.room.notified();
            if self.shared.closing.load(Ordering::Acquire) {
                return Err(self.shared.closed_error());
            }
            if self.shared.try_reserve(len) {
                return self.queue(message);
            }
            room.await;
        }
    }

    /// Queues a message now; a full queue closes the socket with 1008
    /// (for senders that must not wait on a client).
    pub fn send_or_close(&self, message: Message) -> Result<(), SocketError> {
        self.check(&message)?;
        if self.shared.try_reserve(message.cost()) {
            return self.queue(message);
        }
        let close = Close::new(
            CLOSE_POLICY,
            format!(
                "max_socket_send_queue_bytes ({}) reached: the client is not reading",
                self.shared.max_queue_bytes
            ),
        );
        self.begin_close(close.clone(), true);
        Err(SocketError::Closed(close))
    }

    /// Starts the close handshake with `code` and `reason`.
    pub fn close(&self, code: u16, reason: String) -> Result<(), SocketError> {
        closable(code, &reason)?;
        if self.shared.closing.load(Ordering::Acquire) {
            return Err(self.shared.closed_error());
        }
        self.begin_close(Close { code, reason }, false);
        Ok(())
    }

    fn begin_close(&self, close: Close, by_weir: bool) {
        if !self.shared.closing.swap(true, Ordering::AcqRel) {
            locked(&self.shared.outbound).push_back(Outgoing::Close { close, by_weir });
            self.shared.outbound_ready.notify_one();
        }
        self.shared.room.notify_waiters();
    }
}

impl WireEnd {
    /// Waits for room for one more message to the guest; false when the
    /// guest's receiving end is gone.
    pub async fn room(&self) -> bool {
        let shared = &self.shared;
        loop {
            if shared.receiver_gone.load(Ordering::Acquire) {
                return false;
            }
            if locked(&shared.inbound).len() < INBOUND_MESSAGES_BUFFERED {
                return true;
            }
            shared.inbound_room.notified().await;
        }
    }

    /// Hands the guest what the client sent (after [`WireEnd::room`]).
    pub fn deliver(&self, incoming: Incoming) {
        locked(&self.shared.inbound).push_back(incoming);
        self.shared.inbound_ready.notify_one();
    }

    /// The next thing the guest sent; `None` once its sending end is gone
    /// and nothing is left.
    pub async fn next_outgoing(&self) -> Option<Outgoing> {
        let shared = &self.shared;
        loop {
            let gone = shared.guest_gone.load(Ordering::Acquire);
            if let Some(out) = locked(&shared.outbound).pop_front() {
                return Some(out);
            }
            if gone {
                return None;
            }
            shared.outbound_ready.notified().await;
        }
    }

    /// The next thing the guest sent, if it is there now.
    pub fn try_outgoing(&self) -> Option<Outgoing> {
        locked(&self.shared.outbound).pop_front()
    }

    /// Queued messages that cost `len` ([`Message::cost`]) are written:
    /// room for more.
    pub fn written(&self, len: usize) {
        self.shared.queued.fetch_sub(len, Ordering::AcqRel);
        self.shared.room.notify_waiters();
    }

    /// Resolves once a close was asked for (by the guest, or by Weir in its
    /// stead) or the socket ended.
    pub async fn close_requested(&self) {
        loop {
            let changed = self.shared.room.notified();
            if self.shared.closing.load(Ordering::Acquire) {
                return;
            }
            changed.await;
        }
    }

    /// True once a close was asked for or the socket ended.
    pub fn closing(&self) -> bool {
        self.shared.closing.load(Ordering::Acquire)
    }

    /// Bytes queued now.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire)
    }

    /// The most the send queue held at once, in cost ([`Message::cost`]).
    pub fn queued_peak(&self) -> usize {
        self.shared.queued_peak.load(Ordering::Relaxed)
    }

    pub fn max_message_bytes(&self) -> usize {
        self.shared.max_message_bytes
    }

    /// The socket has ended, as `how` says; the guest's calls say so from
    /// now on.
    pub fn end(&self, how: Close) {
        self.shared
            .ended
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(how);
        self.shared.closing.store(true, Ordering::Release);
        self.shared.room.notify_waiters();
    }
}

impl Drop for WireEnd {
    fn drop(&mut self) {
        self.shared.wire_gone.store(true, Ordering::Release);
        self.shared.closing.store(true, Ordering::Release);
        self.shared.inbound_ready.notify_one();
        self.shared.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::websocket::close::CLOSE_ABNORMAL;

    #[tokio::test]
    async fn a_send_waits_for_room_and_one_message_always_fits_an_empty_queue() {
        let (guest, wire) = pair(100, 10, None);
        // Bigger than the queue, but the queue is empty: it goes.
        guest.send(Message::Binary(vec![0; 50])).await.unwrap();
        let blocked = tokio::spawn(async move {
            guest.send(Message::Text("x".into())).await.unwrap();
            guest
        });
        tokio::task::yield_now().await;
        assert!(!blocked.is_finished());
        assert!(matches!(
            wire.next_outgoing().await,
            Some(Outgoing::Message(_))
        ));
        wire.written(50 + MESSAGE_COST_BYTES);
        let guest = blocked.await.unwrap();
        assert!(
            matches!(wire.next_outgoing().await, Some(Outgoing::Message(Message::Text(t))) if t == "x")
        );
        assert!(matches!(
            guest.send(Message::Binary(vec![0; 101])).await,
            Err(SocketError::TooLarge(_))
        ));
    }

    #[tokio::test]
    async fn an_empty_message_costs_the_queue_what_it_costs_the_host() {
        let (guest, _wire) = pair(100, 16 * MESSAGE_COST_BYTES, None);
        for _ in 0..16 {
            guest.send_or_close(Message::Binary(Vec::new())).unwrap();
        }
        assert!(matches!(
            guest.send_or_close(Message::Binary(Vec::new())),
            Err(SocketError::Closed(_))
        ));
    }

    #[tokio::test]
    async fn a_full_queue_closes_a_socket_that_cannot_wait_with_1008() {
        let (guest, wire) = pair(100, 10, None);
        guest.send_or_close(Message::Binary(vec![0; 8])).unwrap();
        let Err(SocketError::Closed(close)) = guest.send_or_close(Message::Binary(vec![0; 8]))
        else {
            panic!("over the queue")
        };
        assert_eq!(close.code, CLOSE_POLICY);
        assert!(close.reason.contains("max_socket_send_queue_bytes"));
        assert!(matches!(
            wire.next_outgoing().await,
            Some(Outgoing::Message(_))
        ));
        assert!(
            matches!(wire.next_outgoing().await, Some(Outgoing::Close { close: c, by_weir: true }) if c.code == CLOSE_POLICY)
        );
    }

    #[tokio::test]
    async fn close_codes_and_reasons_are_checked_and_an_ended_socket_says_how() {
        let (mut guest, wire) = pair(100, 10, None);
        for code in [999, 1004, 1005, 1006, 1012, 1015, 2999, 5000] {
            assert!(
                matches!(
                    guest.close(code, String::new()),
                    Err(SocketError::Invalid(_))
                ),
                "{code}"
            );
        }
        assert!(guest.close(1000, "x".repeat(124)).is_err());
        wire.end(Close::new(CLOSE_ABNORMAL, "connection lost"));
        drop(wire);
        let Err(SocketError::Closed(how)) = guest.receive().await else {
            panic!("ended")
        };
        assert_eq!(how.code, CLOSE_ABNORMAL);
        assert!(matches!(
            guest.send(Message::Text("late".into())).await,
            Err(SocketError::Closed(c)) if c.code == CLOSE_ABNORMAL
        ));
    }
}
