//! The errors Weir answers for WebSocket upgrades, each with one stable code
//! and status, answered the same way as the runtime's (`WeirError`).
//!
//! Invariant owned here: no socket code is also a runtime code; the
//! README's error table lists each.

use weir_runtime::WeirError;

/// An upgrade Weir refuses before the guest sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SocketErrorCode {
    /// 400: the request asks for a WebSocket but is not a valid RFC 6455
    /// opening handshake (not GET, no `Connection: upgrade`, a version other
    /// than 13, a key that is not 16 bytes of base64).
    InvalidUpgrade,
    /// 503: `max_sockets` WebSockets are open already.
    CapacityExceeded,
}

impl SocketErrorCode {
    pub const ALL: &'static [SocketErrorCode] = &[
        SocketErrorCode::InvalidUpgrade,
        SocketErrorCode::CapacityExceeded,
    ];
}

impl WeirError for SocketErrorCode {
    fn as_str(self) -> &'static str {
        match self {
            SocketErrorCode::InvalidUpgrade => "invalid_upgrade",
            SocketErrorCode::CapacityExceeded => "socket_capacity_exceeded",
        }
    }

    fn status(self) -> u16 {
        match self {
            SocketErrorCode::InvalidUpgrade => 400,
            SocketErrorCode::CapacityExceeded => 503,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_socket_code_is_another_layers_and_the_readme_lists_each() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .unwrap();
        for code in SocketErrorCode::ALL {
            assert!(
                weir_runtime::ErrorCode::ALL
                    .iter()
                    .all(|r| r.as_str() != code.as_str()),
                "{}",
                code.as_str()
            );
            let row = format!("| {} | `{}` |", code.status(), code.as_str());
            assert!(readme.contains(&row), "README lacks the row `{row}`");
        }
    }
}
