//! Helpers of the tests of the chat example in cluster mode: nodes
//! serving it, clients of its rooms, what they are told.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use super::Weir;
use super::cluster::{Database, node_with_app};
use super::websocket::Client;

/// Node `name` serving the chat example: its page, the `room` class at
/// `/rooms`.
pub fn chat_node(pg: &impl Database, name: &str, dir: &Path, extra: &[&str]) -> Weir {
    let room = format!("room={}", super::guest("chat_room").display());
    let mut args = vec!["--actor", &room, "--actor-route", "room=/rooms"];
    args.extend_from_slice(extra);
    node_with_app(pg, name, dir, &super::guest("chat"), &args)
}

pub fn room_key(room: &str) -> String {
    format!("actor/chat/room/{room}")
}

/// Joins `room` as `user` through `node`, trying again for at most 30 s
/// while the cluster fails over (an upgrade refused with 502 or 503).
pub async fn join(node: &Weir, room: &str, user: &str) -> Client {
    let url = format!("ws://{}/rooms/{room}/?user={user}", node.addr);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Each try bounded too: a node that never answers fails the test,
        // it does not hang it.
        let tried =
            tokio::time::timeout_at(deadline.into(), tokio_tungstenite::connect_async(&url)).await;
        match tried {
            Ok(Ok((ws, response))) => {
                assert_eq!(response.status(), 101);
                return ws;
            }
            Ok(Err(e)) => {
                assert!(Instant::now() < deadline, "{user} could not join: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => panic!("{user} could not join within 30 s: no answer"),
        }
    }
}

/// The next JSON event the client gets for which `wanted` holds (others
/// are skipped), within 30 s.
pub async fn next_where(ws: &mut Client, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .unwrap_or_else(|_| panic!("no {what} within 30 s"));
        match frame {
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                if wanted(&v) {
                    return v;
                }
            }
            Some(Ok(_)) => {}
            other => panic!("waiting for {what}: {other:?}"),
        }
    }
}

pub async fn presence_of(ws: &mut Client, users: &[&str]) {
    let want = serde_json::json!(users);
    next_where(ws, &format!("presence {users:?}"), |v| {
        v["type"] == "presence" && v["users"] == want
    })
    .await;
}

pub async fn message_of(ws: &mut Client, user: &str, text: &str) {
    next_where(ws, &format!("{user}: {text}"), |v| {
        v["type"] == "message" && v["user"] == user && v["text"] == text
    })
    .await;
}

/// The messages a client that joins `room` through `node` is given first,
/// `n` of them.
pub async fn history(node: &Weir, room: &str, n: usize) -> Vec<(String, String)> {
    let mut ws = join(node, room, "reader").await;
    let mut said = Vec::new();
    while said.len() < n {
        let v = next_where(&mut ws, "history", |v| v["type"] == "message").await;
        said.push((
            v["user"].as_str().unwrap().to_string(),
            v["text"].as_str().unwrap().to_string(),
        ));
    }
    let _ = ws.close(None).await;
    said
}

pub fn said(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(u, t)| (u.to_string(), t.to_string()))
        .collect()
}

pub async fn say(ws: &mut Client, text: &str) {
    ws.send(Message::text(text)).await.unwrap();
}

/// The sockets whose ends `room` was told of, once there are `n` (at most
/// 30 s); checked again a moment later, so that one told twice shows.
pub async fn departures_once(weir: &Weir, room: &str, n: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let told = weir.get(&format!("/rooms/{room}/departures")).await.json();
        let len = told.as_array().map_or(0, Vec::len);
        assert!(len <= n, "told more than {n}: {told}");
        if len == n {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let again = weir.get(&format!("/rooms/{room}/departures")).await.json();
            assert_eq!(again, told, "told again");
            return told;
        }
        assert!(Instant::now() < deadline, "{told}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
