//! What clients and guests can make a server hold through WebSockets,
//! from outside: each app of a server of several holds only its share of
//! `max_sockets`; a client that pings and reads nothing is dropped on
//! time, and a stop does not wait on it; a guest that floods empty
//! messages to a client that reads nothing meets the send queue's bound;
//! and the messages a client left behind as it reset count among the
//! open sockets until they are taken.

mod common;

use std::time::Duration;

use futures::{SinkExt, StreamExt};
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
    // Each connection takes the guest's greeting (so that Weir has written
    // all it will write before the reset), sends four slow messages, waits
    // until the server's kernel has acknowledged every byte (so the reset
    // loses none of them in the client's own send queue), then resets. Its
    // place is held for the four seconds its messages take.
    let message = format!("sleep:1000{}", " ".repeat(8 << 10));
    for i in 0..4 {
        let mut ws = hostile_socket(&weir, &format!("r{i}"), "")
            .await
            .unwrap_or_else(|(status, body)| panic!("socket {i}: {status} {body}"));
        let greeting = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("the greeting within 30 s");
        assert!(
            matches!(greeting, Some(Ok(Message::Text(_)))),
            "{greeting:?}"
        );
        for _ in 0..4 {
            ws.send(Message::text(message.clone())).await.unwrap();
        }
        let tokio_tungstenite::MaybeTlsStream::Plain(tcp) = ws.into_inner() else {
            panic!("a plain connection");
        };
        common::wait_for("every byte acknowledged", || async {
            match unacknowledged(&tcp) {
                0 => Ok(()),
                n => Err(format!("{n} bytes")),
            }
        })
        .await;
        // A reset, not a close: nothing is said. A zero linger resets at
        // once.
        #[allow(deprecated)]
        tcp.set_linger(Some(Duration::ZERO)).unwrap();
    }
    // The four places are held by messages no client will ever read the
    // answers to.
    match hostile_socket(&weir, "fifth", "").await {
        Ok(_) => panic!("a fifth socket was taken while four sockets' messages still waited"),
        Err((status, body)) => assert_eq!(status, 503, "{body}"),
    }
    // Every message is taken in the end, and the places come back.
    common::wait_for("the places back", || async {
        match hostile_socket(&weir, "after", "").await {
            Ok(_) => Ok(()),
            Err((status, _)) => Err(format!("{status}")),
        }
    })
    .await;
    // Each reset socket's four messages were taken.
    let closed = weir
        .logged("weir::socket")
        .into_iter()
        .filter(|r| {
            r["message"] == "socket closed"
                && r["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("reset by peer"))
        })
        .map(|r| r["messages_in"].clone())
        .collect::<Vec<_>>();
    assert_eq!(closed, [4, 4, 4, 4], "{}", weir.log());
}

/// Bytes the connection sent that its peer's kernel has not yet
/// acknowledged (`SIOCOUTQ`).
fn unacknowledged(tcp: &tokio::net::TcpStream) -> i32 {
    use std::os::fd::AsRawFd;
    let mut queued: libc::c_int = 0;
    // SAFETY: a valid socket descriptor and a pointer to an int, as
    // SIOCOUTQ (TIOCOUTQ) takes.
    let rc = unsafe { libc::ioctl(tcp.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
    assert_eq!(rc, 0, "SIOCOUTQ: {}", std::io::Error::last_os_error());
    queued
}
