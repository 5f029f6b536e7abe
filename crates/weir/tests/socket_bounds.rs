//! What clients and guests can make a server hold through WebSockets,
//! from outside: each app of a server of several holds only its share of
//! `max_sockets`; a client that pings and reads nothing is dropped on
//! time, and a stop does not wait on it; a guest that floods empty
//! messages to a client that reads nothing meets the send queue's bound;
//! and the messages a client left behind as it reset count among the
//! open sockets until they are taken.

mod common;

use std::time::Duration;

use futures::SinkExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use common::apps::{app_section, config_file};
use common::hostile::{data_dir, hostile_socket};
use common::{Weir, guest, rss_kib};

/// A WebSocket to `path` on `weir`, as app `host` is reached: the status
/// the upgrade was answered with.
async fn upgrade(weir: &Weir, host: &str, path: &str) -> (u16, Option<common::websocket::Client>) {
    let mut request = format!("ws://{}{path}", weir.addr)
        .into_client_request()
        .unwrap();
    request.headers_mut().insert("host", host.parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Ok((ws, response)) => (response.status().as_u16(), Some(ws)),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            (response.status().as_u16(), None)
        }
        Err(e) => panic!("{path}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_app_holds_only_its_share_of_max_sockets() {
    let sockets = guest("sockets");
    let config = config_file(
        "socket-shares",
        &(app_section("a", &sockets, &["a.test/"], "")
            + &app_section("b", &sockets, &["b.test/"], "")),
    );
    let weir = Weir::start_with(&[
        "--config",
        config.to_str().unwrap(),
        "--limit",
        "max_sockets=8",
    ]);
    // Four of the eight are a's.
    let mut held = Vec::new();
    for _ in 0..4 {
        let (status, ws) = upgrade(&weir, "a.test", "/hold").await;
        assert_eq!(status, 101);
        held.push(ws);
    }
    let (status, _) = upgrade(&weir, "a.test", "/hold").await;
    assert_eq!(status, 503, "a's share is taken");
    // b's are still b's.
    for _ in 0..4 {
        let (status, ws) = upgrade(&weir, "b.test", "/hold").await;
        assert_eq!(status, 101);
        held.push(ws);
    }
    let (status, _) = upgrade(&weir, "b.test", "/hold").await;
    assert_eq!(status, 503);
    // One of a's closes: a gets a place again.
    drop(held.remove(0));
    let again = common::wait_for("a's place back", || async {
        match upgrade(&weir, "a.test", "/hold").await {
            (101, ws) => Ok(ws),
            (status, _) => Err(format!("{status}")),
        }
    })
    .await;
    held.push(again);
}

/// The handshake of a WebSocket to `path` on a raw connection whose
/// receive buffer is small: a client that will read nothing more.
async fn raw_socket(weir: &Weir, path: &str) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(weir.addr).await.unwrap();
    stream
        .write_all(
            format!(
                "GET {path} HTTP/1.1\r\nhost: {}\r\nupgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n",
                weir.addr
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    stream
}

/// A masked ping frame with a 125-byte payload, as a client sends it.
fn ping_frame() -> Vec<u8> {
    let mut frame = vec![0x89, 0x80 | 125, 1, 2, 3, 4];
    frame.extend((0..125u8).map(|i| i ^ [1, 2, 3, 4][usize::from(i % 4)]));
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_pings_and_reads_nothing_is_dropped_on_time_and_holds_up_no_stop() {
    let sockets = guest("sockets");
    let mut weir = Weir::start(&sockets, &["--limit", "socket_idle_timeout_ms=1500"]);
    let mut stream = raw_socket(&weir, "/hold").await;
    // Pings as fast as the server reads them, never reading a pong.
    let pinger = tokio::spawn(async move {
        let frame = ping_frame();
        let mut sent = 0u64;
        while stream.write_all(&frame).await.is_ok() {
            sent += 1;
        }
        sent
    });
    // Dropped for taking nothing, by Weir, on its idle timeout.
    let receipt = weir
        .first_logged("weir::socket", |r| r["message"] == "socket closed")
        .await;
    assert_eq!(receipt["close_code"], 1001, "{receipt}");
    assert!(
        receipt["detail"]
            .as_str()
            .is_some_and(|r| r.contains("taking nothing")),
        "{receipt}"
    );
    let sent = pinger.await.unwrap();
    assert!(
        sent > 1000,
        "the client pinged ({sent} pings) until dropped"
    );
    // A stop then waits on nothing.
    let _stuck = raw_socket(&weir, "/hold").await;
    weir.signal("TERM");
    assert!(weir.wait_exit(Duration::from_secs(25)).is_some());
    assert!(
        !weir.log().contains("shutdown grace passed"),
        "{}",
        weir.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_messages_to_a_client_that_reads_nothing_meet_the_send_queues_bound() {
    let sockets = guest("sockets");
    let weir = Weir::start(&sockets, &[]);
    let before = rss_kib(weir.pid());
    // The guest sends empty messages for as long as the queue takes them.
    let _stream = raw_socket(&weir, "/flood?kb=0").await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    // The queue's bound (1 MiB, at 64 bytes a message) is about 16,000
    // messages: a few MiB with the connection's buffers, whatever the time.
    let grown = rss_kib(weir.pid()).saturating_sub(before);
    assert!(
        grown < 16 * 1024,
        "the server grew {grown} KiB holding empty messages for one socket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_a_reset_socket_left_behind_hold_its_place_until_they_are_taken() {
    let dir = data_dir("reset-loop");
    let weir = common::hostile::start(&dir, &["--limit", "max_sockets=4"]);
    // Each connection sends four slow messages of 256 KiB, then resets.
    let message = format!("sleep:300{}", " ".repeat(256 << 10));
    let mut refused = 0;
    for i in 0..12 {
        match hostile_socket(&weir, &format!("r{i}"), "").await {
            Ok(mut ws) => {
                for _ in 0..4 {
                    ws.send(Message::text(message.clone())).await.unwrap();
                }
                // A reset, not a close: nothing is said.
                let stream = ws.into_inner();
                if let tokio_tungstenite::MaybeTlsStream::Plain(tcp) = stream {
                    // A zero linger resets at once: nothing blocks on drop.
                    #[allow(deprecated)]
                    tcp.set_linger(Some(Duration::ZERO)).unwrap();
                }
            }
            Err((status, body)) => {
                assert_eq!(status, 503, "{body}");
                refused += 1;
            }
        }
    }
    assert!(
        refused > 0,
        "every connection was taken while four sockets' messages still waited"
    );
    // Every message is taken in the end, and the places come back.
    common::wait_for("the places back", || async {
        match hostile_socket(&weir, "after", "").await {
            Ok(_) => Ok(()),
            Err((status, _)) => Err(format!("{status}")),
        }
    })
    .await;
}
