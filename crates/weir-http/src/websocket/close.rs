//! What a close says: the codes of RFC 6455 that Weir sends or reports,
//! and the close frame's code and reason.
//!
//! Invariants owned here: a close a guest asks for has a code an endpoint
//! may send (1000–1003, 1007–1011, 3000–4999; [`sendable_code`]), and
//! Weir adds only 1012 of its own (a code update, an actor that moved);
//! 1005, 1006 and 1015 only report how a socket ended and are never sent.
//! A close reason fits a close frame (at most 123 bytes, cut at a
//! character boundary).

/// The longest close reason: a close frame's payload is at most 125 bytes,
/// two of them the code (RFC 6455 §5.5).
pub const MAX_CLOSE_REASON_BYTES: usize = 123;

/// Normal closure.
pub const CLOSE_NORMAL: u16 = 1000;
/// The endpoint is going away (a session's deadline, a server shutting
/// down, a dead peer).
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// The peer broke the protocol.
pub const CLOSE_PROTOCOL: u16 = 1002;
/// A close frame without a code (reported to guests, never sent).
pub const CLOSE_NO_STATUS: u16 = 1005;
/// The connection ended without a close frame (reported, never sent).
pub const CLOSE_ABNORMAL: u16 = 1006;
/// A text message that is not UTF-8.
pub const CLOSE_INVALID_DATA: u16 = 1007;
/// A limit of Weir's (the send queue).
pub const CLOSE_POLICY: u16 = 1008;
/// A message over `max_socket_message_bytes`.
pub const CLOSE_TOO_BIG: u16 = 1009;
/// The guest failed (a trap, an abandoned instance).
pub const CLOSE_INTERNAL: u16 = 1011;
/// The code that accepted the socket was replaced by a deploy: the client
/// reconnects to the new version.
pub const CLOSE_SERVICE_RESTART: u16 = 1012;

/// A close frame: its code and reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Close {
    pub code: u16,
    pub reason: String,
}

impl Close {
    pub fn new(code: u16, reason: impl Into<String>) -> Self {
        let mut reason = reason.into();
        if reason.len() > MAX_CLOSE_REASON_BYTES {
            let mut cut = MAX_CLOSE_REASON_BYTES;
            while !reason.is_char_boundary(cut) {
                cut -= 1;
            }
            reason.truncate(cut);
        }
        Close { code, reason }
    }
}

/// True for a close code a guest may have Weir send.
pub fn sendable_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_reason_is_cut_at_a_character_boundary() {
        let close = Close::new(1000, "é".repeat(100));
        assert!(close.reason.len() <= MAX_CLOSE_REASON_BYTES);
        assert!(close.reason.chars().all(|c| c == 'é'));
    }

    #[test]
    fn only_codes_an_endpoint_may_send_are_sendable() {
        for code in [1000, 1001, 1003, 1007, 1011, 3000, 4999] {
            assert!(sendable_code(code), "{code}");
        }
        for code in [999, 1004, 1005, 1006, 1012, 1015, 2999, 5000] {
            assert!(!sendable_code(code), "{code}");
        }
    }
}
