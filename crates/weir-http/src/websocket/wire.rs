//! The wire: one task per socket that owns its connection after the 101,
//! does the framing (tokio-tungstenite: masks, fragments, control frames,
//! UTF-8) and moves whole messages between the connection and the
//! socket's guest end.
//!
//! Invariants owned here:
//! - the task ends only after the socket has ended, and it always says how
//!   (to the guest end, in the receipt): a close frame sent by the client,
//!   by the guest, or by Weir at a limit, or the connection lost;
//! - Weir answers pings and the client's close, pings a client it has not
//!   heard from every `socket_ping_interval_ms`, and drops a client it has
//!   heard nothing from — or that takes nothing it writes — for
//!   `socket_idle_timeout_ms`, so a vanished peer never holds a socket;
//! - a message over `max_socket_message_bytes` closes with 1009, text that
//!   is not UTF-8 with 1007, a protocol error with 1002; 1005, 1006 and 1015
//!   are never sent;
//! - a close Weir starts waits at most [`CLOSE_HANDSHAKE_TIMEOUT`] for the
//!   client's reply, then the connection is dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{SinkExt, StreamExt};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Error as WsError};

use super::close::{
    CLOSE_GOING_AWAY, CLOSE_INVALID_DATA, CLOSE_NO_STATUS, CLOSE_PROTOCOL, CLOSE_TOO_BIG, Close,
};
use super::hub::{ClosedBy, SocketHub, SocketPermit, SocketRecord};
use super::socket::{Incoming, Message, Outgoing, WireEnd};

/// How long a close Weir (or the guest) starts waits for the client's
/// close frame before the connection is dropped.
pub const CLOSE_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The framing's read buffer, allocated for each socket: small, because an
/// idle socket should cost little (6.7 KiB in all per idle socket on a
/// hibernated actor, measured; 8.7 KiB with 4 KiB here); larger messages
/// are read in more calls.
pub const READ_BUFFER_BYTES: usize = 2048;

/// Bytes of frames gathered before a write reaches the connection (a burst
/// of small messages is one write); each batch is flushed at once anyway.
pub const WRITE_BUFFER_BYTES: usize = 16 * 1024;

/// Queued messages written before one flush.
pub const MAX_MESSAGES_PER_FLUSH: usize = 64;

/// When the session behind a socket ends, and the close it ends with.
pub type Ending = Pin<Box<dyn Future<Output = (Close, ClosedBy)> + Send>>;

/// One socket, before its connection is upgraded.
pub struct Wire {
    pub hub: Arc<SocketHub>,
    /// Shared with the guest's receiving end ([`super::socket::SocketReceiver::hold`]).
    pub permit: Arc<SocketPermit>,
    pub upgrade: OnUpgrade,
    pub end: WireEnd,
    pub ending: Ending,
    pub app: Arc<str>,
    /// The version of the code that accepted the socket.
    pub version: Arc<str>,
    /// The mark of the node that relayed it here (cluster mode), if one
    /// did: the socket closes when that node leaves.
    pub relayer: Option<Arc<str>>,
    pub protocol: Option<String>,
    /// After the socket ends, how long its session may take to end on its
    /// own before its caller counts as gone (the app's
    /// `cancellation_limit_ms`).
    pub grace: Duration,
}

type Stream = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

fn config(max_message: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(WRITE_BUFFER_BYTES)
        .max_write_buffer_size(max_message + 2 * WRITE_BUFFER_BYTES)
        .max_message_size(Some(max_message))
        .max_frame_size(Some(max_message))
}

/// The frames of a message: one, or, when it is larger than
/// [`WRITE_BUFFER_BYTES`], fragments of that size. The framing buffers a
/// frame whole before it writes it, and its buffer keeps the size of the
/// largest frame it held for the socket's life: in fragments, a socket
/// that once sent a large message keeps no buffer of its size.
fn to_wire(message: Message) -> Vec<tungstenite::Message> {
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    let (kind, bytes) = match message {
        Message::Text(t) if t.len() <= WRITE_BUFFER_BYTES => {
            return vec![tungstenite::Message::text(t)];
        }
        Message::Binary(b) if b.len() <= WRITE_BUFFER_BYTES => {
            return vec![tungstenite::Message::binary(b)];
        }
        Message::Text(t) => (Data::Text, bytes::Bytes::from(t)),
        Message::Binary(b) => (Data::Binary, bytes::Bytes::from(b)),
    };
    let pieces = bytes.len().div_ceil(WRITE_BUFFER_BYTES);
    (0..pieces)
        .map(|i| {
            let piece = bytes
                .slice(i * WRITE_BUFFER_BYTES..((i + 1) * WRITE_BUFFER_BYTES).min(bytes.len()));
            let opcode = if i == 0 {
                OpCode::Data(kind)
            } else {
                OpCode::Data(Data::Continue)
            };
            tungstenite::Message::Frame(Frame::message(piece, opcode, i + 1 == pieces))
        })
        .collect()
}

fn close_frame(close: &Close) -> tungstenite::Message {
    tungstenite::Message::Close(Some(CloseFrame {
        code: CloseCode::from(close.code),
        reason: close.reason.clone().into(),
    }))
}

/// How the loop ended.
enum Stop {
    /// Weir or the guest closes with this frame.
    Close(Close, ClosedBy),
    /// The session behind the socket ended, and would close with this
    /// frame unless the guest queued its own close before it ended.
    Ended(Close, ClosedBy),
    /// The guest's end of the socket is gone.
    Released,
    /// The client closed; its close was answered.
    ClientClosed(Close),
    /// The connection is gone, or dead: nothing more can be sent.
    Lost(Close),
    /// Closed with this frame while the client took nothing: the frame
    /// cannot be sent, the connection is dropped.
    Dropped(Close, ClosedBy),
}

impl Wire {
    /// Runs the socket to its end.
    pub async fn run(self) {
        let Wire {
            hub,
            permit,
            upgrade,
            end,
            ending,
            app,
            version,
            relayer,
            protocol,
            grace,
        } = self;
        let (id, counters) = hub.opened(&app);
        let mut record = SocketRecord {
            app,
            version,
            relayer,
            id,
            counters,
            protocol,
            opened: Instant::now(),
            messages_in: 0,
            messages_out: 0,
            bytes_in: 0,
            bytes_out: 0,
            queue_peak_bytes: 0,
        };
        let mut ending = Some(ending);
        let upgraded = tokio::select! {
            upgraded = upgrade => upgraded,
            (close, by) = ending.as_mut().expect("set") => {
                end.end(close.clone());
                hub.closed(&record, &close, by);
                return;
            }
        };
        let (how, by) = match upgraded {
            Ok(upgraded) => {
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config(end.max_message_bytes())),
                )
                .await;
                serve(ws, &hub, end, &mut ending, grace, &mut record).await
            }
            Err(e) => {
                let how = Close::new(super::close::CLOSE_ABNORMAL, format!("upgrade failed: {e}"));
                end.end(how.clone());
                (how, ClosedBy::Connection)
            }
        };
        hub.closed(&record, &how, by);
        drop(permit);
        // The guest learns of the end from its socket; it gets a grace to
        // finish before its session is cut short as a caller that left.
        if let Some(ending) = ending.as_mut() {
            let _ = tokio::time::timeout(grace, ending).await;
        }
    }
}

/// The socket's life on its connection; returns how it ended. Reads and
/// writes share `ws`, not split into two halves behind a lock: the loop
/// never does both at once.
async fn serve(
    mut ws: Stream,
    hub: &SocketHub,
    mut end: WireEnd,
    ending: &mut Option<Ending>,
    grace: Duration,
    record: &mut SocketRecord,
) -> (Close, ClosedBy) {
    let limits = &hub.limits;
    let idle = limits.socket_idle_timeout;
    // Polled only when one of its signals woke it, not on every pass of
    // the loop: polling a waiting `Notified` takes its `Notify`'s lock,
    // and the server-wide signals' locks are shared by every socket, so
    // polling them per message made every core take them (3 % of an
    // actor echo's samples).
    let mut by_weir: FuturesUnordered<_> = std::iter::once(hub.weir_close(
        record.app.clone(),
        record.version.clone(),
        record.relayer.clone(),
    ))
    .collect();
    let mut tick = tokio::time::interval(limits.socket_ping_interval.min(idle));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heard = Instant::now();
    // Since when a pong the client has not taken waits.
    let mut pong_owed: Option<Instant> = None;
    // Room for one more message to the guest.
    let mut slot = false;
    let stop = loop {
        tokio::select! {
            biased;
            (close, by) = ending.as_mut().expect("set until it ends") => {
                *ending = None;
                break Stop::Ended(close, by);
            }
            Some(close) = by_weir.next() => break Stop::Close(close, ClosedBy::Weir),
            out = end.next_outgoing() => {
                let first = match out {
                    Some(Outgoing::Message(m)) => m,
                    Some(Outgoing::Close { close, by_weir }) => break Stop::Close(close, closer(by_weir)),
                    // The guest's end is gone: it let the socket go, or its
                    // instance was dropped because it failed, which its
                    // session's end says next.
                    None => break Stop::Released,
                };
                // Whatever else is queued goes in the same flush.
                let mut batch = vec![first];
                let mut then_close = None;
                while batch.len() < MAX_MESSAGES_PER_FLUSH {
                    match end.try_outgoing() {
                        Some(Outgoing::Message(m)) => batch.push(m),
                        Some(Outgoing::Close { close, by_weir }) => { then_close = Some((close, closer(by_weir))); break; }
                        None => break,
                    }
                }
                let bytes: usize = batch.iter().map(Message::len).sum();
                let cost: usize = batch.iter().map(Message::cost).sum();
                let count = batch.len() as u64;
                let write = async {
                    for m in batch {
                        for frame in to_wire(m) {
                            ws.feed(frame).await?;
                        }
                    }
                    ws.flush().await
                };
                // A close asked for while a write is stuck (the client
                // takes nothing) cannot be said: once the write has had
                // CLOSE_HANDSHAKE_TIMEOUT more, the connection is dropped
                // with it.
                                let outcome = |written: Result<Result<(), WsError>, tokio::time::error::Elapsed>| match written {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(lost(e)),
                    Err(_) => Some(taking_nothing()),
                };
                let mut write = std::pin::pin!(tokio::time::timeout(idle, write));
                let first = {
                    let asked = end.close_requested();
                    tokio::select! {
                        written = &mut write => Some(outcome(written)),
                        _ = asked => None,
                    }
                };
                let stuck = match first {
                    Some(stuck) => stuck,
                    None => match tokio::time::timeout(CLOSE_HANDSHAKE_TIMEOUT, &mut write).await {
                        Ok(written) => outcome(written),
                        Err(_) => Some(match then_close.take().or_else(|| queued_close(&mut end)) {
                            Some((close, by)) => Stop::Dropped(close, by),
                            None => Stop::Lost(Close::new(super::close::CLOSE_ABNORMAL, "the socket ended mid-write")),
                        }),
                    },
                };
                if let Some(stop) = stuck {
                    break stop;
                }
                end.written(cost);
                record.messages_out += count;
                record.bytes_out += bytes as u64;
                record.counters.outgoing.inc_by(count);
                if let Some((close, by)) = then_close {
                    break Stop::Close(close, by);
                }
            }
            room = end.room(), if !slot => {
                if !room {
                    // The guest's end is gone.
                    break Stop::Released;
                }
                slot = true;
            }
            frame = ws.next(), if slot => {
                heard = Instant::now();
                let message = match frame {
                    None => break Stop::Lost(Close::new(super::close::CLOSE_ABNORMAL, "the connection ended without a close frame")),
                    Some(Err(e)) => break refusal(e),
                    Some(Ok(tungstenite::Message::Text(text))) => {
                        // An auto-response is Weir's to answer: no turn.
                        if let Some((auto, at)) = &end.auto
                            && let Some(reply) = auto.reply(text.as_str())
                        {
                            record.messages_in += 1;
                            record.bytes_in += text.len() as u64;
                            record.counters.auto.inc();
                            at.store(crate::websocket::socket::now_ms(), std::sync::atomic::Ordering::Relaxed);
                            match tokio::time::timeout(idle, ws.send(tungstenite::Message::text(reply))).await {
                                Ok(Ok(())) => continue,
                                Ok(Err(e)) => break lost(e),
                                Err(_) => break taking_nothing(),
                            }
                        }
                        Message::Text(text.as_str().to_string())
                    }
                    Some(Ok(tungstenite::Message::Binary(bytes))) => Message::Binary(bytes.to_vec()),
                    Some(Ok(tungstenite::Message::Ping(_))) => {
                        // The framing queued the pong: sent now if the
                        // client takes it, else by the framing as it next
                        // reads. Never waited on: a client that pings and
                        // reads nothing holds up no close, no send and no
                        // timer, and is dropped once it has taken nothing
                        // for socket_idle_timeout_ms. Judged here as well
                        // as on the tick: a client that pings faster than
                        // this loop reads keeps this branch ready, and the
                        // tick, polled after it, would never come.
                        match futures::FutureExt::now_or_never(ws.flush()) {
                            Some(Ok(())) => pong_owed = None,
                            Some(Err(e)) => break lost(e),
                            None => {
                                let since = *pong_owed.get_or_insert_with(Instant::now);
                                if since.elapsed() >= idle {
                                    break taking_nothing();
                                }
                            }
                        }
                        continue;
                    }
                    Some(Ok(tungstenite::Message::Pong(_) | tungstenite::Message::Frame(_))) => continue,
                    Some(Ok(tungstenite::Message::Close(frame))) => {
                        let close = match frame {
                            Some(f) => Close::new(u16::from(f.code), f.reason.as_str()),
                            None => Close::new(CLOSE_NO_STATUS, ""),
                        };
                        // The framing queued the reply; flush it, then the
                        // connection is done.
                        let _ = tokio::time::timeout(CLOSE_HANDSHAKE_TIMEOUT, ws.flush()).await;
                        if std::mem::take(&mut slot) {
                            end.deliver(Incoming::Close(close.clone()));
                        }
                        break Stop::ClientClosed(close);
                    }
                };
                record.messages_in += 1;
                record.bytes_in += message.len() as u64;
                record.counters.incoming.inc();
                if std::mem::take(&mut slot) {
                    end.deliver(Incoming::Message(message));
                }
            }
            _ = tick.tick() => {
                if let Some(since) = pong_owed {
                    match futures::FutureExt::now_or_never(ws.flush()) {
                        Some(Ok(())) => pong_owed = None,
                        Some(Err(e)) => break lost(e),
                        None if since.elapsed() >= idle => break taking_nothing(),
                        None => {}
                    }
                }
                if !slot {
                    // Waiting on the guest, not on the client.
                    heard = Instant::now();
                    continue;
                }
                let quiet = heard.elapsed();
                if quiet >= idle {
                    break Stop::Lost(Close::new(CLOSE_GOING_AWAY, "socket_idle_timeout_ms passed without a word from the client"));
                }
                if quiet >= limits.socket_ping_interval.min(idle) {
                    let ping = async { ws.send(tungstenite::Message::Ping(Default::default())).await };
                    match tokio::time::timeout(idle - quiet, ping).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => break lost(e),
                        Err(_) => break taking_nothing(),
                    }
                }
            }
        }
    };
    let (how, by) = match stop {
        Stop::ClientClosed(close) => (close, ClosedBy::Client),
        Stop::Dropped(close, by) => (close, by),
        Stop::Lost(close) => {
            let by = if close.code == CLOSE_GOING_AWAY {
                ClosedBy::Weir
            } else {
                ClosedBy::Connection
            };
            (close, by)
        }
        Stop::Ended(..) | Stop::Close(..) | Stop::Released => {
            let (close, by) = match stop {
                Stop::Released => {
                    let released = (
                        Close::new(super::close::CLOSE_NORMAL, "the guest let the socket go"),
                        ClosedBy::Guest,
                    );
                    match ending.take() {
                        Some(ending) => tokio::time::timeout(grace, ending)
                            .await
                            .unwrap_or(released),
                        None => released,
                    }
                }
                // What the guest queued before its session ended goes
                // first, its own close included.
                Stop::Ended(mut close, mut by) => {
                    let mut last = Vec::new();
                    while let Some(out) = end.try_outgoing() {
                        match out {
                            Outgoing::Message(m) => last.push(m),
                            Outgoing::Close {
                                close: own,
                                by_weir,
                            } => {
                                (close, by) = (own, closer(by_weir));
                                break;
                            }
                        }
                    }
                    let flush = async {
                        for m in last {
                            record.messages_out += 1;
                            record.bytes_out += m.len() as u64;
                            record.counters.outgoing.inc();
                            for frame in to_wire(m) {
                                ws.feed(frame).await?;
                            }
                        }
                        ws.flush().await
                    };
                    let _ = tokio::time::timeout(CLOSE_HANDSHAKE_TIMEOUT, flush).await;
                    (close, by)
                }
                Stop::Close(close, by) => (close, by),
                _ => unreachable!("matched above"),
            };
            // Say so, then wait (bounded) for the client's reply.
            end.end(close.clone());
            let handshake = async {
                ws.send(close_frame(&close)).await?;
                while let Some(frame) = ws.next().await {
                    if let tungstenite::Message::Close(_) = frame? {
                        break;
                    }
                }
                Ok::<_, WsError>(())
            };
            let _ = tokio::time::timeout(CLOSE_HANDSHAKE_TIMEOUT, handshake).await;
            (close, by)
        }
    };
    end.end(how.clone());
    record.queue_peak_bytes = end.queued_peak() as u64;
    (how, by)
}

/// The close the guest (or Weir in its stead) queued, if any.
fn queued_close(end: &mut WireEnd) -> Option<(Close, ClosedBy)> {
    while let Some(out) = end.try_outgoing() {
        if let Outgoing::Close { close, by_weir } = out {
            return Some((close, closer(by_weir)));
        }
    }
    None
}

/// Who a queued close is from.
fn closer(by_weir: bool) -> ClosedBy {
    if by_weir {
        ClosedBy::Weir
    } else {
        ClosedBy::Guest
    }
}

/// A connection that failed under a read or write.
fn lost(e: WsError) -> Stop {
    Stop::Lost(Close::new(
        super::close::CLOSE_ABNORMAL,
        format!("connection lost: {e}"),
    ))
}

/// What a read error means: a close Weir sends, or a lost connection.
fn refusal(e: WsError) -> Stop {
    let close = match &e {
        WsError::Capacity(_) => {
            Close::new(CLOSE_TOO_BIG, "a message over max_socket_message_bytes")
        }
        WsError::Utf8(_) => Close::new(CLOSE_INVALID_DATA, "a text message that is not UTF-8"),
        WsError::Protocol(tungstenite::error::ProtocolError::ResetWithoutClosingHandshake) => {
            return lost(e);
        }
        WsError::Protocol(p) => Close::new(CLOSE_PROTOCOL, format!("protocol error: {p}")),
        _ => return lost(e),
    };
    Stop::Close(close, ClosedBy::Weir)
}

/// How a client that took nothing for `socket_idle_timeout_ms` is let go.
fn taking_nothing() -> Stop {
    Stop::Lost(Close::new(
        CLOSE_GOING_AWAY,
        "socket_idle_timeout_ms passed with the client taking nothing",
    ))
}
