//! The errors Weir answers for actor calls, each with one stable code and
//! status, answered the same way as the runtime's (`WeirError`).
//!
//! Invariant owned here: no actor code is also a runtime code; the README's
//! error table lists both.

use weir_runtime::{ErrorCode, WeirError};

use crate::placement::Refusal;

/// A failure of an actor call that Weir answers itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActorErrorCode {
    /// 503: `actor_max_queued` calls already wait for that actor.
    Overloaded,
    /// 503: the actor's turn could not be committed; the actor was reset and
    /// none of the turn's writes are visible.
    StorageCommitFailed,
    /// 404: no actor class of that name is declared.
    ClassUnknown,
    /// 400: the host is in the actor domain but is not a valid actor address.
    AddressInvalid,
    /// 507: the actor does not exist and the app already has `max_actors`.
    TooMany,
    /// 507: the actor does not exist and the app's actors already take
    /// `max_actor_storage_bytes` on disk.
    StorageFull,
    /// 508: an actor called an actor whose turn waits on it (itself, or
    /// one of its callers): the call would wait on its own caller.
    CallCycle,
    /// 508: the call would make a chain of more than `MAX_CALL_DEPTH`
    /// actors each waiting on the next.
    CallDepthExceeded,
}

impl ActorErrorCode {
    pub const ALL: &'static [ActorErrorCode] = &[
        ActorErrorCode::Overloaded,
        ActorErrorCode::StorageCommitFailed,
        ActorErrorCode::ClassUnknown,
        ActorErrorCode::AddressInvalid,
        ActorErrorCode::TooMany,
        ActorErrorCode::StorageFull,
        ActorErrorCode::CallCycle,
        ActorErrorCode::CallDepthExceeded,
    ];
}

impl WeirError for ActorErrorCode {
    fn as_str(self) -> &'static str {
        match self {
            ActorErrorCode::Overloaded => "actor_overloaded",
            ActorErrorCode::StorageCommitFailed => "storage_commit_failed",
            ActorErrorCode::ClassUnknown => "actor_class_unknown",
            ActorErrorCode::AddressInvalid => "actor_address_invalid",
            ActorErrorCode::TooMany => "too_many_actors",
            ActorErrorCode::StorageFull => "actor_storage_full",
            ActorErrorCode::CallCycle => "actor_call_cycle",
            ActorErrorCode::CallDepthExceeded => "actor_call_depth_exceeded",
        }
    }

    fn status(self) -> u16 {
        match self {
            ActorErrorCode::Overloaded | ActorErrorCode::StorageCommitFailed => 503,
            ActorErrorCode::ClassUnknown => 404,
            ActorErrorCode::AddressInvalid => 400,
            // Insufficient Storage: the server cannot keep one more, and
            // trying again will not help until an operator acts.
            ActorErrorCode::TooMany | ActorErrorCode::StorageFull => 507,
            // Loop Detected: answered at once, without running anything.
            ActorErrorCode::CallCycle | ActorErrorCode::CallDepthExceeded => 508,
        }
    }
}

/// What a turn failed with: one of the runtime's codes (a trap, a deadline,
/// memory), an actor's own, or its placement's (cluster mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnError {
    Runtime(ErrorCode),
    Actor(ActorErrorCode),
    Placement(Refusal),
}

impl From<Refusal> for TurnError {
    fn from(refusal: Refusal) -> Self {
        TurnError::Placement(refusal)
    }
}

impl From<ErrorCode> for TurnError {
    fn from(code: ErrorCode) -> Self {
        TurnError::Runtime(code)
    }
}

impl From<ActorErrorCode> for TurnError {
    fn from(code: ActorErrorCode) -> Self {
        TurnError::Actor(code)
    }
}

impl WeirError for TurnError {
    fn as_str(self) -> &'static str {
        match self {
            TurnError::Runtime(c) => WeirError::as_str(c),
            TurnError::Actor(c) => c.as_str(),
            TurnError::Placement(r) => r.code,
        }
    }

    fn status(self) -> u16 {
        match self {
            TurnError::Runtime(c) => WeirError::status(c),
            TurnError::Actor(c) => c.status(),
            TurnError::Placement(r) => r.status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actor_codes_are_their_own_and_the_readme_lists_each() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .unwrap();
        for code in ActorErrorCode::ALL {
            let row = format!("| {} | `{}` |", code.status(), code.as_str());
            assert!(readme.contains(&row), "README lacks the row `{row}`");
            assert!(
                ErrorCode::ALL.iter().all(|r| r.as_str() != code.as_str()),
                "{code:?}"
            );
            let v: serde_json::Value = serde_json::from_str(&code.body()).unwrap();
            assert_eq!(v["error"], code.as_str());
        }
    }
}
