//! The limits of WebSockets, declared once like the runtime's
//! (`weir_runtime::limit_table!`) and set from the same `[limits]` table
//! and `--limit NAME=VALUE`.

use std::time::Duration;

use weir_runtime::limit_table;
use weir_runtime::limits::MAX_DURATION_MS;

/// Largest message a server may be allowed to take or send: what the
/// platform the seeds ran on allows. A message is held whole in memory.
pub const MAX_MESSAGE_BYTES: u64 = 32 << 20;

/// Most sockets a server may be allowed: each holds a file descriptor and
/// its buffers.
pub const MAX_SOCKETS: u64 = 1 << 20;

limit_table! {
    /// The limits of the WebSockets a server holds.
    pub struct SocketLimits {
        max_socket_message_bytes: usize = "max_socket_message_bytes" {
            default: 1 << 20, range: 125, MAX_MESSAGE_BYTES, unit: Bytes,
            meaning: "one message, either way, after its fragments are joined; a bigger one from the client closes the socket with 1009, a bigger send is refused with too-large",
        },
        max_sockets: usize = "max_sockets" {
            default: 10_000, range: 1, MAX_SOCKETS, unit: Count,
            meaning: "open WebSockets of the whole server, each app of several holding at most its share (max_sockets divided by the apps served); an upgrade past it is answered 503 socket_capacity_exceeded",
        },
        max_sockets_per_actor: usize = "max_sockets_per_actor" {
            default: 32_768, range: 1, MAX_SOCKETS, unit: Count,
            meaning: "open WebSockets one actor holds; an accept past it is refused with limit, and nobody is evicted",
        },
        max_socket_send_queue_bytes: usize = "max_socket_send_queue_bytes" {
            default: 1 << 20, range: 1024, MAX_MESSAGE_BYTES, unit: Bytes,
            meaning: "bytes sent to one socket that its client has not taken yet; a worker's send waits for room, one message always fits an empty queue",
        },
        socket_ping_interval: Duration = "socket_ping_interval_ms" {
            default: 30_000, range: 10, MAX_DURATION_MS, unit: Millis,
            meaning: "how often Weir pings a socket it has heard nothing from, so a live client answers",
        },
        socket_idle_timeout: Duration = "socket_idle_timeout_ms" {
            default: 90_000, range: 10, MAX_DURATION_MS, unit: Millis,
            meaning: "a socket whose client sends nothing (not even a pong) for this long, or takes nothing Weir writes for this long, is a dead peer: closed with 1001 and dropped",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_table_says_what_the_code_does() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .unwrap();
        let wrong = weir_runtime::limit_table::readme_disagreements(SocketLimits::SPECS, &readme);
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}
