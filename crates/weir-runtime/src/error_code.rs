//! The errors Weir itself answers, each with one stable code and status.
//!
//! Invariant owned here: a code names one failure and keeps its status; the
//! README's error table is this enum. Guests never produce these codes —
//! whatever a client receives under one of them came from Weir.

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
    /// (after idle actors were hibernated); its generation was abandoned.
    MemoryBudgetExceeded,
    /// 503: `max_connections` client connections are open already.
    ConnectionLimitExceeded,
    /// 503: the actor's turn queue is full (`actor_max_queued`).
    ActorOverloaded,
    /// 503: the actor's turn could not be committed; the actor was reset and
    /// none of the turn's writes are visible.
    StorageCommitFailed,
    /// 404: no actor class of that name is declared.
    ActorClassUnknown,
    /// 400: the host is in the actor domain but is not a valid actor address.
    ActorAddressInvalid,
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
        ErrorCode::ActorOverloaded,
        ErrorCode::StorageCommitFailed,
        ErrorCode::ActorClassUnknown,
        ErrorCode::ActorAddressInvalid,
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
            ErrorCode::ActorOverloaded => "actor_overloaded",
            ErrorCode::StorageCommitFailed => "storage_commit_failed",
            ErrorCode::ActorClassUnknown => "actor_class_unknown",
            ErrorCode::ActorAddressInvalid => "actor_address_invalid",
        }
    }

    pub fn status(self) -> u16 {
        match self {
            ErrorCode::RequestHeaderFieldsTooLarge => 431,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::RequestBodyTimeout => 408,
            ErrorCode::BadRequest | ErrorCode::ActorAddressInvalid => 400,
            ErrorCode::ActorClassUnknown => 404,
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
            | ErrorCode::ConnectionLimitExceeded
            | ErrorCode::ActorOverloaded
            | ErrorCode::StorageCommitFailed => 503,
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
