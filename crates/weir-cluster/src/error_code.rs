//! The errors Weir answers for what cluster mode adds, each with one
//! stable code and status, answered like every other of Weir's errors.
//!
//! Also: how an error is said in a log line, with its causes.
//!
//! Invariant owned here: no cluster code is also a runtime's or an actor's
//! code; the README's error table lists them all.

use weir_actors::{Refusal, TurnError};
use weir_runtime::WeirError;

/// A failure cluster mode answers itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClusterErrorCode {
    /// 503: another node took the object over while this one served it;
    /// this node dropped its copy, and the call's writes were not kept.
    OwnershipLost,
    /// 503: the cluster database could not be reached (or this node's
    /// lease could not be renewed in time): nothing was written or claimed,
    /// or whether a write was kept is not known.
    StorageUnavailable,
    /// 502: the node that owns the object could not be reached, or did
    /// not answer a call that may have run there; it is never resent.
    OwnerUnreachable,
    /// 501: what does not run in cluster mode yet (resident processes),
    /// or what the owner's older build cannot take (an operator's call, a
    /// relayed WebSocket), named in the log.
    Unsupported,
}

impl ClusterErrorCode {
    pub const ALL: &'static [ClusterErrorCode] = &[
        ClusterErrorCode::OwnershipLost,
        ClusterErrorCode::StorageUnavailable,
        ClusterErrorCode::OwnerUnreachable,
        ClusterErrorCode::Unsupported,
    ];

    /// The code as an actor placement's refusal.
    pub fn refusal(self) -> Refusal {
        Refusal {
            code: self.as_str(),
            status: self.status(),
        }
    }
}

impl WeirError for ClusterErrorCode {
    fn as_str(self) -> &'static str {
        match self {
            ClusterErrorCode::OwnershipLost => "ownership_lost",
            ClusterErrorCode::StorageUnavailable => "storage_unavailable",
            ClusterErrorCode::OwnerUnreachable => "owner_unreachable",
            ClusterErrorCode::Unsupported => "cluster_unsupported",
        }
    }

    fn status(self) -> u16 {
        match self {
            ClusterErrorCode::OwnershipLost | ClusterErrorCode::StorageUnavailable => 503,
            ClusterErrorCode::OwnerUnreachable => 502,
            ClusterErrorCode::Unsupported => 501,
        }
    }
}

/// An error and the causes under it, each once: a pool's "error
/// connecting to server" says why only in its source (connection refused,
/// a name that does not resolve, a password refused), and an operator
/// needs the why.
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut said = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !said.contains(&more) {
            said.push_str(": ");
            said.push_str(&more);
        }
        cause = c.source();
    }
    said
}

impl From<ClusterErrorCode> for TurnError {
    fn from(code: ClusterErrorCode) -> Self {
        TurnError::Placement(code.refusal())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_actors::ActorErrorCode;
    use weir_runtime::ErrorCode;

    #[test]
    fn cluster_codes_are_their_own_and_the_readme_lists_each() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .unwrap();
        for code in ClusterErrorCode::ALL {
            let row = format!("| {} | `{}` |", code.status(), code.as_str());
            assert!(readme.contains(&row), "README lacks the row `{row}`");
            assert!(
                ErrorCode::ALL.iter().all(|r| r.as_str() != code.as_str()),
                "{code:?}"
            );
            assert!(
                ActorErrorCode::ALL
                    .iter()
                    .all(|a| a.as_str() != code.as_str()),
                "{code:?}"
            );
            let v: serde_json::Value = serde_json::from_str(&code.body()).unwrap();
            assert_eq!(v["error"], code.as_str());
        }
    }

    #[test]
    fn an_error_is_said_with_its_causes_once() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error connecting to server")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let said = with_causes(&Outer(refused));
        assert_eq!(said, "error connecting to server: connection refused");
        // A cause its error already names is not said twice.
        let io = std::io::Error::other("no route");
        assert_eq!(with_causes(&io), "no route");
    }
}
