//! Response bodies on their way to the client.
//!
//! Invariants owned here:
//! - a guest's body ends cleanly only after the event task has confirmed
//!   that the guest returned ([`SessionEnd::Clean`]); a guest that failed
//!   after headers — or whose session outcome never arrives — ends the body
//!   with an error, so hyper aborts the connection instead of writing a
//!   clean terminator;
//! - no chunk written to the client exceeds `max_response_chunk_bytes`, and
//!   a body that crosses `max_response_body_bytes` is aborted at the
//!   crossing, its excess never sent;
//! - dropping the body (the client left) cancels the event.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::oneshot;
use weir_runtime::ErrorCode;
use weir_runtime::event::GuestBody;
use weir_runtime::event::{CancelHandle, SessionEnd, settled};
use weir_runtime::outcome::Outcome;
use weir_runtime::receipt::Receipt;

/// Why a response body was cut off.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the guest failed after sending headers")]
    GuestFailed,
    #[error("the response body crossed max_response_body_bytes")]
    TooLarge,
    #[error("the guest's body stream failed: {0}")]
    Stream(String),
}

/// The body of every response Weir sends.
pub enum ServeBody {
    Full(Option<Bytes>),
    Session(Box<SessionBody>),
}

impl ServeBody {
    pub fn full(bytes: Bytes) -> Self {
        ServeBody::Full(Some(bytes))
    }

    pub fn empty() -> Self {
        ServeBody::Full(None)
    }
}

impl From<Bytes> for ServeBody {
    fn from(bytes: Bytes) -> Self {
        ServeBody::full(bytes)
    }
}

impl Body for ServeBody {
    type Data = Bytes;
    type Error = SessionError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, SessionError>>> {
        match self.get_mut() {
            ServeBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ServeBody::Session(s) => Pin::new(s.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ServeBody::Full(bytes) => bytes.is_none(),
            ServeBody::Session(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ServeBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ServeBody::Full(None) => SizeHint::with_exact(0),
            ServeBody::Session(s) => s.inner.size_hint(),
        }
    }
}

/// A guest's streamed body, bounded and honest about how it ended.
pub struct SessionBody {
    inner: GuestBody,
    session: Option<oneshot::Receiver<SessionEnd>>,
    receipt: Receipt,
    /// Held until the body is gone; its drop cancels the event.
    _cancel: CancelHandle,
    /// Bytes of a guest chunk not yet sent because of the chunk limit.
    pending: Bytes,
    sent: u64,
    max_total: u64,
    max_chunk: usize,
    done: bool,
}

impl SessionBody {
    pub fn new(
        inner: GuestBody,
        session: oneshot::Receiver<SessionEnd>,
        receipt: Receipt,
        cancel: CancelHandle,
        max_total: u64,
        max_chunk: usize,
    ) -> Self {
        SessionBody {
            inner,
            session: Some(session),
            receipt,
            _cancel: cancel,
            pending: Bytes::new(),
            sent: 0,
            max_total,
            max_chunk,
            done: false,
        }
    }

    fn next_chunk(&mut self) -> Bytes {
        let n = self.pending.len().min(self.max_chunk);
        let chunk = self.pending.split_to(n);
        self.receipt.add_bytes_out(chunk.len() as u64);
        chunk
    }

    fn fail(&mut self, error: SessionError) -> Poll<Option<Result<Frame<Bytes>, SessionError>>> {
        self.done = true;
        Poll::Ready(Some(Err(error)))
    }
}

impl Body for SessionBody {
    type Data = Bytes;
    type Error = SessionError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, SessionError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if !this.pending.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(this.next_chunk()))));
        }
        loop {
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if data.is_empty() {
                            continue;
                        }
                        this.sent += data.len() as u64;
                        if this.sent > this.max_total {
                            this.receipt.fail(
                                Outcome::Limit,
                                Some(ErrorCode::ResponseBodyTooLarge),
                                Some("streamed body crossed max_response_body_bytes".into()),
                            );
                            return this.fail(SessionError::TooLarge);
                        }
                        this.pending = data;
                        return Poll::Ready(Some(Ok(Frame::data(this.next_chunk()))));
                    }
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                Some(Err(e)) => {
                    let detail = format!("{e:?}");
                    this.receipt.fail(
                        Outcome::Trap,
                        None,
                        Some(format!("body stream failed: {detail}")),
                    );
                    return this.fail(SessionError::Stream(detail));
                }
                None => {
                    let Some(session) = this.session.as_mut() else {
                        return Poll::Ready(None);
                    };
                    let end = ready!(Pin::new(session).poll(cx));
                    this.session = None;
                    return match end {
                        Ok(SessionEnd::Clean) => {
                            this.done = true;
                            Poll::Ready(None)
                        }
                        Ok(SessionEnd::Failed(_)) | Err(_) => this.fail(SessionError::GuestFailed),
                    };
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

pub(crate) enum Finished {
    /// The guest returned cleanly and its whole body is already here.
    Complete(Bytes),
    /// The body is still being written (or is large): stream it.
    Streaming(GuestBody, oneshot::Receiver<SessionEnd>),
}

/// Most responses are small and complete by the time their headers arrive:
/// the guest wrote its body and returned in one go. Those are sent as one
/// sized body — head and body in one write, with `content-length` — instead
/// of as a chunked stream. Anything else, or anything larger than one chunk,
/// streams. Nothing is waited for here.
pub(crate) fn finished_body(
    mut body: GuestBody,
    mut session: oneshot::Receiver<SessionEnd>,
    max_bytes: usize,
) -> Finished {
    match session.try_recv() {
        Ok(SessionEnd::Clean) => {}
        Err(oneshot::error::TryRecvError::Empty) => return Finished::Streaming(body, session),
        Ok(end @ SessionEnd::Failed(_)) => return Finished::Streaming(body, settled(end)),
        Err(oneshot::error::TryRecvError::Closed) => {
            return Finished::Streaming(body, settled(SessionEnd::Failed(Outcome::Trap)));
        }
    }
    let mut read = BytesMut::new();
    let end = loop {
        match body.frame().now_or_never() {
            Some(None) => return Finished::Complete(read.freeze()),
            Some(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => {
                    read.extend_from_slice(&data);
                    if read.len() > max_bytes {
                        break SessionEnd::Clean;
                    }
                }
                // Trailers: the client must get them, so stream.
                Err(trailers) => {
                    let rest = Prepend {
                        first: Some(read.freeze()),
                        trailers: trailers.into_trailers().ok(),
                        rest: body,
                    };
                    return Finished::Streaming(rest.boxed_unsync(), settled(SessionEnd::Clean));
                }
            },
            Some(Some(Err(_))) => break SessionEnd::Failed(Outcome::Trap),
            None => break SessionEnd::Clean,
        }
    };
    let rest = Prepend {
        first: Some(read.freeze()),
        trailers: None,
        rest: body,
    };
    Finished::Streaming(rest.boxed_unsync(), settled(end))
}

/// Bytes (and trailers) already taken from a guest body, then the rest of it.
struct Prepend {
    first: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
    rest: GuestBody,
}

impl Body for Prepend {
    type Data = Bytes;
    type Error = <GuestBody as Body>::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(first) = self.first.take().filter(|b| !b.is_empty()) {
            return std::task::Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if let Some(trailers) = self.trailers.take() {
            return std::task::Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        std::pin::Pin::new(&mut self.rest).poll_frame(cx)
    }
}
