//! Reading a request body under the transport limits.
//!
//! Invariants owned here: no more than `max_request_body_bytes` are ever
//! buffered (a body that grows past the limit is refused as soon as it
//! does), and the whole read ends within `body_read_timeout_ms` — a timer of
//! its own, separate from the Wasm deadline, because no Wasm runs yet. A
//! body that sends nothing for `body_idle_timeout_ms`, or that averages less
//! than `body_min_rate_bytes_per_s` once that long has passed, ends the read
//! at once: a slow client cannot hold a lane for the whole read timeout.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;
use weir_runtime::ErrorCode;
use weir_runtime::outcome::Outcome;

/// Why a body could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// More bytes than the limit arrived.
    TooLarge,
    /// The body did not complete in time.
    Timeout,
    /// The client went away or sent a malformed body.
    Broken,
}

impl BodyError {
    /// The error Weir answers for it.
    pub fn code(&self) -> ErrorCode {
        match self {
            BodyError::TooLarge => ErrorCode::PayloadTooLarge,
            BodyError::Timeout => ErrorCode::RequestBodyTimeout,
            BodyError::Broken => ErrorCode::RequestCancelled,
        }
    }

    /// How the event ended, for its receipt.
    pub fn outcome(&self) -> Outcome {
        match self {
            BodyError::TooLarge => Outcome::Limit,
            BodyError::Timeout => Outcome::Deadline,
            BodyError::Broken => Outcome::Cancelled,
        }
    }
}

/// How slowly a body may arrive.
#[derive(Clone, Copy, Debug)]
pub struct BodyPace {
    /// The whole body must arrive within this.
    pub total: Duration,
    /// Longest silence between two parts of the body.
    pub idle: Duration,
    /// Least average rate once `idle` has passed since the read began
    /// (0: none).
    pub min_bytes_per_s: u64,
}

/// Reads the whole body, holding at most `limit` bytes, at `pace` or
/// faster.
pub async fn read_body<B>(body: B, limit: u64, pace: BodyPace) -> Result<Bytes, BodyError>
where
    B: Body<Data = Bytes> + Unpin,
{
    // A request that declares no body needs neither a read nor a timer.
    if body.is_end_stream() {
        return Ok(Bytes::new());
    }
    match tokio::time::timeout(pace.total, collect(body, limit, pace)).await {
        Ok(result) => result,
        Err(_) => Err(BodyError::Timeout),
    }
}

async fn collect<B>(mut body: B, limit: u64, pace: BodyPace) -> Result<Bytes, BodyError>
where
    B: Body<Data = Bytes> + Unpin,
{
    // The common case — one frame or none — needs no copy.
    let mut first: Option<Bytes> = None;
    let mut rest: Option<BytesMut> = None;
    let mut total: u64 = 0;
    let began = tokio::time::Instant::now();
    loop {
        let frame = match tokio::time::timeout(pace.idle, body.frame()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(_) => return Err(BodyError::Timeout),
        };
        let frame = frame.map_err(|_| BodyError::Broken)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers carry no body bytes
        };
        total += data.len() as u64;
        if total > limit {
            return Err(BodyError::TooLarge);
        }
        let elapsed = began.elapsed();
        if pace.min_bytes_per_s > 0
            && elapsed > pace.idle
            && (total as u128) * 1000 < pace.min_bytes_per_s as u128 * elapsed.as_millis()
        {
            return Err(BodyError::Timeout);
        }
        match (&mut first, &mut rest) {
            (None, None) => first = Some(data),
            (Some(f), None) => {
                let mut buf = BytesMut::with_capacity(f.len() + data.len());
                buf.extend_from_slice(f);
                buf.extend_from_slice(&data);
                first = None;
                rest = Some(buf);
            }
            (_, Some(buf)) => buf.extend_from_slice(&data),
        }
    }
    Ok(match (first, rest) {
        (_, Some(buf)) => buf.freeze(),
        (Some(f), None) => f,
        (None, None) => Bytes::new(),
    })
}
