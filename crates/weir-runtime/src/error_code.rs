//! The errors Weir itself answers, each with one stable code and status.
//!
//! Invariants owned here: a code names one failure and keeps its status;
//! the README's error table is this enum. Guests never produce these codes —
//! whatever a client receives under one of them came from Weir. Every
//! answer Weir sends on a guest's behalf, whichever layer sends it, is
//! made by [`error_response`]: `{"error":"<code>"}`, JSON, never cached,
//! never sniffed.

use std::fmt;

/// A failure Weir answers on the guest's behalf, as `{"error":"<code>"}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 431: the request head is over `max_request_head_bytes`.
    RequestHeaderFieldsTooLarge,
    /// 413: the declared or streamed request body is over `max_request_body_bytes`.
    PayloadTooLarge,
    /// 408: the request body did not arrive within `body_read_timeout_ms`.
    RequestBodyTimeout,
    /// 400: the request could not be handed to the guest (no authority, bad framing).
    BadRequest,
    /// 502: the declared response length is over `max_response_body_bytes`.
    ResponseBodyTooLarge,
    /// 502: the guest returned without a response, or with an error in place of one.
    InvalidResponse,
    /// 503: every lane is busy and the wait queue is full.
    EventCapacityExceeded,
    /// 503: the request waited in the queue until its deadline passed.
    AdmissionDeadlineExceeded,
    /// 503: the client left; the event was cancelled.
    RequestCancelled,
    /// 503: no lane of the app can instantiate a generation.
    HostUnavailable,
    /// 503: the event's host operations did not settle within `cleanup_timeout_ms`.
    StorageCleanupUnconfirmed,
    /// 503: the guest trapped; its generation was abandoned.
    InstanceAbandoned,
    /// 503: the guest did not answer within `event_limit_ms`; its generation was abandoned.
    EventDeadlineExceeded,
    /// 503: the guest grew past `memory_limit_bytes`; its generation was abandoned.
    MemoryLimitExceeded,
    /// 503: the guest's memory did not fit in `max_total_guest_memory_bytes`
    /// (after idle instances of the layers above were let go); its
    /// generation was abandoned.
    MemoryBudgetExceeded,
    /// 503: `max_connections` client connections are open already.
    ConnectionLimitExceeded,
}

/// A failure Weir answers itself: a stable code and its status. The
/// runtime's [`ErrorCode`] is one; the layers above define their own (their
/// codes never collide with the runtime's), and every path answers them
/// the same way.
pub trait WeirError: Copy {
    fn as_str(self) -> &'static str;
    fn status(self) -> u16;

    /// The JSON body Weir sends for this code.
    fn body(self) -> String {
        format!("{{\"error\":\"{}\"}}", self.as_str())
    }
}

/// Weir's own answer for `code`, with any body type made from bytes.
pub fn error_response<B: From<bytes::Bytes>>(code: impl WeirError) -> http::Response<B> {
    let mut response = http::Response::new(B::from(bytes::Bytes::from(code.body())));
    *response.status_mut() =
        http::StatusCode::from_u16(code.status()).unwrap_or(http::StatusCode::SERVICE_UNAVAILABLE);
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    headers.insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        http::HeaderValue::from_static("nosniff"),
    );
    response
}

impl WeirError for ErrorCode {
    fn as_str(self) -> &'static str {
        ErrorCode::as_str(self)
    }

    fn status(self) -> u16 {
        ErrorCode::status(self)
    }
}

impl ErrorCode {
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::RequestHeaderFieldsTooLarge,
        ErrorCode::PayloadTooLarge,
        ErrorCode::RequestBodyTimeout,
        ErrorCode::BadRequest,
        ErrorCode::ResponseBodyTooLarge,
        ErrorCode::InvalidResponse,
        ErrorCode::EventCapacityExceeded,
        ErrorCode::AdmissionDeadlineExceeded,
        ErrorCode::RequestCancelled,
        ErrorCode::HostUnavailable,
        ErrorCode::StorageCleanupUnconfirmed,
        ErrorCode::InstanceAbandoned,
        ErrorCode::EventDeadlineExceeded,
        ErrorCode::MemoryLimitExceeded,
        ErrorCode::MemoryBudgetExceeded,
        ErrorCode::ConnectionLimitExceeded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::RequestHeaderFieldsTooLarge => "request_header_fields_too_large",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::RequestBodyTimeout => "request_body_timeout",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::ResponseBodyTooLarge => "response_body_too_large",
            ErrorCode::InvalidResponse => "invalid_response",
            ErrorCode::EventCapacityExceeded => "event_capacity_exceeded",
            ErrorCode::AdmissionDeadlineExceeded => "admission_deadline_exceeded",
            ErrorCode::RequestCancelled => "request_cancelled",
            ErrorCode::HostUnavailable => "host_unavailable",
            ErrorCode::StorageCleanupUnconfirmed => "storage_cleanup_unconfirmed",
            ErrorCode::InstanceAbandoned => "instance_abandoned",
            ErrorCode::EventDeadlineExceeded => "event_deadline_exceeded",
            ErrorCode::MemoryLimitExceeded => "memory_limit_exceeded",
            ErrorCode::MemoryBudgetExceeded => "memory_budget_exceeded",
            ErrorCode::ConnectionLimitExceeded => "connection_limit_exceeded",
        }
    }

    pub fn status(self) -> u16 {
        match self {
            ErrorCode::RequestHeaderFieldsTooLarge => 431,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::RequestBodyTimeout => 408,
            ErrorCode::BadRequest => 400,
            ErrorCode::ResponseBodyTooLarge | ErrorCode::InvalidResponse => 502,
            ErrorCode::EventCapacityExceeded
            | ErrorCode::AdmissionDeadlineExceeded
            | ErrorCode::RequestCancelled
            | ErrorCode::HostUnavailable
            | ErrorCode::StorageCleanupUnconfirmed
            | ErrorCode::InstanceAbandoned
            | ErrorCode::EventDeadlineExceeded
            | ErrorCode::MemoryLimitExceeded
            | ErrorCode::MemoryBudgetExceeded
            | ErrorCode::ConnectionLimitExceeded => 503,
        }
    }

    /// The JSON body Weir sends for this code.
    pub fn body(self) -> String {
        format!("{{\"error\":\"{}\"}}", self.as_str())
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_bodies_are_json() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "duplicate {code}");
            let v: serde_json::Value = serde_json::from_str(&code.body()).unwrap();
            assert_eq!(v["error"], code.as_str());
        }
    }
}
