//! What an actor's socket calls do when their turn fails, from outside:
//! the hostile actor class on a real `weir serve` and real WebSocket
//! clients. A socket effect takes place only if its turn commits (an
//! accept, the replacement it makes, an attachment, an auto-response),
//! and a close is a commit point, as a send is: what the turn wrote before
//! it is kept even when the turn then fails.

mod common;

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use common::hostile::*;

/// How many `on-close` turns actor `name` ran (it adds a byte to
/// `closes` in each).
async fn closes(weir: &common::Weir, name: &str) -> Value {
    weir.get(&format!("/h/{name}/get?key=closes")).await.json()["bytes"].clone()
}

#[tokio::test]
async fn a_socket_accepted_in_a_turn_that_fails_never_opens_nor_replaces_nor_ends() {
    let dir = data_dir("accept-trap");
    let weir = start(&dir, &[]);
    // Accepted, then its turn traps: the client is refused, and the actor
    // never hears of a socket that never opened.
    let refused = hostile_socket(&weir, "a", "trap=1").await;
    let Err((status, _)) = refused else {
        panic!("a socket whose accepting turn trapped was opened")
    };
    assert_eq!(status, 503, "{refused:?}");
    // A socket that replaces another by its key, in a turn that traps:
    // the older one stays open.
    let mut first = hostile_socket(&weir, "a", "key_bytes=3")
        .await
        .expect("accepted");
    let set: Value = serde_json::from_str(&exchange(&mut first, None).await).unwrap();
    assert_eq!(set, json!({ "attachment": null, "auto": null }));
    let refused = hostile_socket(&weir, "a", "key_bytes=3&trap=1").await;
    assert!(refused.is_err(), "a replacement whose turn trapped opened");
    let held: Value =
        serde_json::from_str(&exchange(&mut first, Some("size?".into())).await).unwrap();
    assert_eq!(held, json!({ "attachment_bytes": null }), "still open");
    // Nothing of either refused socket reaches the actor later.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(closes(&weir, "a").await, Value::Null);
    first.close(None).await.unwrap();
    common::wait_for("the open socket's on-close", || async {
        match closes(&weir, "a").await {
            Value::Null => Err("no on-close yet".to_string()),
            n => Ok(n),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        closes(&weir, "a").await,
        1,
        "exactly the socket that opened"
    );
}

#[tokio::test]
async fn an_attachment_or_auto_response_set_in_a_turn_that_fails_is_not_kept() {
    let dir = data_dir("effects-trap");
    let weir = start(&dir, &[]);
    let mut ws = hostile_socket(&weir, "b", "").await.expect("accepted");
    exchange(&mut ws, None).await;
    // The turn sets an attachment, then traps: the socket stays open, and
    // holds no attachment.
    ws.send(Message::text("attach:100:trap")).await.unwrap();
    let held: Value = serde_json::from_str(&exchange(&mut ws, Some("size?".into())).await).unwrap();
    assert_eq!(held, json!({ "attachment_bytes": null }));
    // The same for an auto-response: Weir does not answer with it, the
    // actor does.
    ws.send(Message::text("auto:trap")).await.unwrap();
    let answer = exchange(&mut ws, Some("auto-ping".into())).await;
    assert_eq!(
        serde_json::from_str::<Value>(&answer).ok(),
        Some(json!({ "attachment_bytes": null })),
        "{answer}"
    );
    // A turn that commits keeps what it set.
    let mut kept = hostile_socket(&weir, "b2", "attachment=10&auto=2")
        .await
        .expect("accepted");
    exchange(&mut kept, None).await;
    let held: Value =
        serde_json::from_str(&exchange(&mut kept, Some("size?".into())).await).unwrap();
    assert_eq!(held, json!({ "attachment_bytes": 10 }));
    assert_eq!(exchange(&mut kept, Some("pp".into())).await, "pong");
}

#[tokio::test]
async fn a_close_is_a_commit_point_what_its_turn_wrote_before_it_is_kept() {
    let dir = data_dir("close-commits");
    let weir = start(&dir, &[]);
    let mut ws = hostile_socket(&weir, "c", "").await.expect("accepted");
    exchange(&mut ws, None).await;
    // The turn writes, closes its socket, then traps: the client sees the
    // close, so the write before it must be there.
    ws.send(Message::text("write-close-trap")).await.unwrap();
    let frame = loop {
        match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => break frame,
            Ok(Some(Ok(_))) => {}
            other => panic!("no close: {other:?}"),
        }
    };
    let frame = frame.expect("a close frame");
    assert_eq!(u16::from(frame.code), 1000);
    assert_eq!(frame.reason.as_str(), "bye");
    let r = weir.get("/h/c/get?key=closed").await.json();
    assert_eq!(r, json!({ "bytes": 1 }), "the write before the close");
}
