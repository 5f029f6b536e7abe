//! Sockets actors own, from outside: the chat example (`guests/chat` page,
//! `guests/chat-room` actor class) on a real `weir serve`, real WebSocket
//! clients, hibernation, auto-responses, failing turns, slow readers, a
//! kill and a restart.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Weir;
use common::chat::departures_once;
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Client = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

fn start_in(dir: &Path, extra: &[&str]) -> Weir {
    let room = common::guest("chat_room");
    let actor = format!("room={}", room.display());
    let mut args = vec![
        "--actor",
        &actor,
        "--actor-route",
        "room=/rooms",
        "--data-dir",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Weir::start(&common::guest("chat"), &args)
}

fn start(extra: &[&str]) -> Weir {
    start_in(&common::fresh_data_dir(), extra)
}

async fn join(weir: &Weir, room: &str, user: &str) -> Client {
    let url = format!("ws://{}/rooms/{room}/?user={user}", weir.addr);
    let (ws, response) = tokio_tungstenite::connect_async(url).await.expect("joined");
    assert_eq!(response.status(), 101);
    ws
}

/// The next JSON event of `kind` the client gets (others are skipped).
async fn next_of(ws: &mut Client, kind: &str) -> Value {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .unwrap_or_else(|_| panic!("no {kind} within 30 s"));
        match frame {
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(&t).unwrap_or(Value::String(t.to_string()));
                if v["type"] == kind {
                    return v;
                }
            }
            Some(Ok(_)) => {}
            other => panic!("waiting for {kind}: {other:?}"),
        }
    }
}

async fn say(ws: &mut Client, text: &str) {
    ws.send(Message::text(text)).await.unwrap();
}

/// A counter of `/metrics` by its full name and labels, 0 when absent.
async fn metric(weir: &Weir, line_start: &str) -> u64 {
    let text = weir.admin_get("/metrics").await.text();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

async fn wakes(weir: &Weir) -> u64 {
    metric(
        weir,
        r#"weir_actor_events_total{class="room",event="wake"}"#,
    )
    .await
}

async fn wait_none_live(weir: &Weir) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = weir.admin_get("/actors").await.json();
        if status["status"]["live"] == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "actors stayed live: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_room_broadcasts_replays_the_last_50_and_tracks_presence() {
    let weir = start(&[]);
    let page = weir.get("/").await;
    assert_eq!(page.status, 200);
    assert!(page.text().contains("new WebSocket"), "the page");
    let mut ada = join(&weir, "lobby", "ada").await;
    assert_eq!(
        next_of(&mut ada, "presence").await["users"],
        serde_json::json!(["ada"])
    );
    let mut bob = join(&weir, "lobby", "bob").await;
    assert_eq!(
        next_of(&mut ada, "presence").await["users"],
        serde_json::json!(["ada", "bob"])
    );
    for i in 0..55 {
        say(&mut ada, &format!("m{i}")).await;
        let got = next_of(&mut bob, "message").await;
        assert_eq!(got["text"], format!("m{i}"));
        assert_eq!(got["user"], "ada");
    }
    // A newcomer gets the last 50, oldest first, then presence.
    let mut cy = join(&weir, "lobby", "cy").await;
    for i in 5..55 {
        assert_eq!(next_of(&mut cy, "message").await["text"], format!("m{i}"));
    }
    assert_eq!(
        next_of(&mut cy, "presence").await["users"],
        serde_json::json!(["ada", "bob", "cy"])
    );
    // A plain request to the room is the room's own answer.
    assert_eq!(weir.get("/rooms/lobby/").await.status, 426);
    bob.close(None).await.unwrap();
    // Ada hears cy join, then bob leave.
    loop {
        let users = next_of(&mut ada, "presence").await["users"].clone();
        if users == serde_json::json!(["ada", "cy"]) {
            break;
        }
        assert_eq!(users, serde_json::json!(["ada", "bob", "cy"]));
    }
    // The socket's receipt, and the turns it made.
    let r = weir
        .first_logged("weir::socket", |r| r["closed_by"] == "client")
        .await;
    assert_eq!(r["app"], "actor:room");
    let calls = weir
        .actor_receipt_where(|r| {
            r["turn"] == "call" && r["reason"] == "weir:websocket/handler@0.1.0#on-close"
        })
        .await;
    assert_eq!(calls["outcome"], "ok", "{calls}");
}

#[tokio::test]
async fn a_thousand_idle_sockets_on_a_hundred_rooms_hibernate_and_pings_wake_nobody() {
    let weir = start(&["--limit", "actor_idle_ms=300"]);
    let mut clients = Vec::new();
    for room in 0..100 {
        for user in 0..10 {
            clients.push((
                room,
                join(&weir, &format!("r{room}"), &format!("u{user}")).await,
            ));
        }
    }
    // Everyone has seen their room complete.
    for (_, ws) in clients.iter_mut() {
        loop {
            let p = next_of(ws, "presence").await;
            if p["users"].as_array().unwrap().len() == 10 {
                break;
            }
        }
    }
    wait_none_live(&weir).await;
    let open = metric(&weir, r#"weir_sockets_open{app="actor:room"}"#).await;
    assert_eq!(
        open, 1000,
        "every socket stayed open while its room hibernated"
    );
    let before = wakes(&weir).await;
    // 10,000 keepalive pings, answered by Weir: no room wakes.
    for round in 0..10 {
        for (_, ws) in clients.iter_mut() {
            say(ws, "ping").await;
        }
        for (_, ws) in clients.iter_mut() {
            match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => assert_eq!(t.as_str(), "pong", "round {round}"),
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(wakes(&weir).await, before, "auto-responses woke an actor");
    assert_eq!(
        metric(
            &weir,
            r#"weir_socket_messages_total{app="actor:room",direction="auto"}"#
        )
        .await,
        10_000
    );
    // A message wakes its room, with its sockets' tags and attachments
    // intact: every socket of the room (by tag) hears it, from its user
    // (by attachment).
    let (room, ws) = &mut clients[10 * 42 + 3];
    assert_eq!(*room, 42);
    say(ws, "wake up").await;
    for (_, other) in clients[420..430].iter_mut() {
        let got = next_of(other, "message").await;
        assert_eq!(got["text"], "wake up");
        assert_eq!(got["user"], "u3");
    }
    assert_eq!(wakes(&weir).await, before + 1);
}

#[tokio::test]
async fn a_turn_that_traps_is_rolled_back_and_its_socket_stays_open() {
    let weir = start(&[]);
    let mut ada = join(&weir, "r", "ada").await;
    let mut bob = join(&weir, "r", "bob").await;
    next_of(&mut bob, "presence").await;
    say(&mut ada, "before").await;
    next_of(&mut bob, "message").await;
    say(&mut ada, "trap!").await;
    say(&mut ada, "after").await;
    assert_eq!(next_of(&mut bob, "message").await["text"], "after");
    let history = weir.get("/rooms/r/history").await.json();
    let texts: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts,
        ["before", "after"],
        "the trapped turn's write is gone"
    );
    let failed = weir
        .actor_receipt_where(|r| r["turn"] == "call" && r["outcome"] != "ok")
        .await;
    assert_eq!(failed["reason"], "weir:websocket/handler@0.1.0#on-message");
}

#[tokio::test]
async fn a_replacement_key_closes_the_older_socket_and_a_refused_newcomer_evicts_nobody() {
    let weir = start(&["--limit", "max_sockets_per_actor=2"]);
    let url = |q: &str| format!("ws://{}/rooms/k/?{q}", weir.addr);
    let (mut first, _) = tokio_tungstenite::connect_async(url("user=ada&key=tab"))
        .await
        .unwrap();
    let (mut other, _) = tokio_tungstenite::connect_async(url("user=bob"))
        .await
        .unwrap();
    // At the limit, a socket that replaces one still gets in.
    let (mut second, _) = tokio_tungstenite::connect_async(url("user=ada&key=tab"))
        .await
        .unwrap();
    let closed = loop {
        match first.next().await {
            Some(Ok(Message::Close(frame))) => break frame.unwrap(),
            Some(Ok(_)) => continue,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(u16::from(closed.code), 1000);
    assert_eq!(closed.reason.as_str(), "replaced by a new connection");
    // One more without a key is refused, and both stay.
    let refused = tokio_tungstenite::connect_async(url("user=cy"))
        .await
        .expect_err("refused");
    let tokio_tungstenite::tungstenite::Error::Http(response) = refused else {
        panic!("{refused:?}")
    };
    assert_eq!(response.status(), 400);
    let body = String::from_utf8_lossy(response.body().as_deref().unwrap()).to_string();
    assert!(body.contains("max_sockets_per_actor (2)"), "{body}");
    say(&mut second, "still").await;
    assert_eq!(next_of(&mut other, "message").await["text"], "still");
}

#[tokio::test]
async fn deleting_an_actor_closes_its_sockets_and_a_namesake_finds_none_of_them() {
    let weir = start(&[]);
    let mut ada = join(&weir, "gone", "ada").await;
    let mut bob = join(&weir, "gone", "bob").await;
    say(&mut ada, "before").await;
    assert_eq!(next_of(&mut bob, "message").await["text"], "before");
    let r = weir.admin_send("DELETE", "/actors/room/gone").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["deleted"], true);
    // Both sockets are closed by Weir, saying why.
    for ws in [&mut ada, &mut bob] {
        let closed = loop {
            let frame = tokio::time::timeout(Duration::from_secs(30), ws.next())
                .await
                .expect("closed within 30 s");
            match frame {
                Some(Ok(Message::Close(frame))) => break frame.unwrap(),
                Some(Ok(_)) => continue,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(u16::from(closed.code), 1001);
        assert_eq!(closed.reason.as_str(), "the actor was deleted");
        // The client answers the close, and the connection ends: Weir's
        // end of each socket is over.
        let end = tokio::time::timeout(Duration::from_secs(30), async {
            while ws.next().await.is_some() {}
        });
        end.await.expect("the connection ended within 30 s");
    }
    // A newcomer finds an empty room: no history, nobody else present
    // (the old sockets' tags and attachments went with their actor).
    let mut cy = join(&weir, "gone", "cy").await;
    let first = loop {
        match tokio::time::timeout(Duration::from_secs(30), cy.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => break serde_json::from_str::<Value>(&t).unwrap(),
            Ok(Some(Ok(_))) => continue,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(first["type"], "presence", "{first}");
    assert_eq!(first["users"], serde_json::json!(["cy"]));
    // The old sockets' ends ran no turn: the namesake's only turns are
    // cy's.
    tokio::time::sleep(common::SETTLE).await;
    let ends = weir
        .actor_receipts()
        .iter()
        .filter(|r| r["name"] == "gone" && r["reason"] == "weir:websocket/handler@0.1.0#on-close")
        .count();
    assert_eq!(ends, 0);
}

#[tokio::test]
async fn an_actor_can_name_only_its_own_sockets() {
    let weir = start(&[]);
    // Ids are the actor's own: a's second socket is 2, and b has no 2.
    let _first = join(&weir, "a", "ada").await;
    let mut a = join(&weir, "a", "ada").await;
    say(&mut a, "/whoami").await;
    let id = next_of(&mut a, "me").await["socket"].as_u64().unwrap();
    assert_eq!(id, 2);
    let mut b = join(&weir, "b", "bob").await;
    say(&mut b, &format!("/to {id} hello from b")).await;
    assert_eq!(
        next_of(&mut b, "sent").await["result"],
        "Err(Error::NoSuchSocket)"
    );
    say(&mut a, &format!("/to {id} to myself")).await;
    assert_eq!(next_of(&mut a, "sent").await["result"], "Ok(())");
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_with_1008_and_memory_stays_flat() {
    let weir = start(&["--limit", "max_socket_send_queue_bytes=65536"]);
    let mut talker = join(&weir, "s", "talker").await;
    let slow = join(&weir, "s", "slow").await;
    next_of(&mut talker, "presence").await;
    let before = common::rss_kib(weir.pid());
    let big = "x".repeat(60_000);
    for _ in 0..200 {
        say(&mut talker, &big).await;
        next_of(&mut talker, "message").await;
    }
    let r = weir
        .first_logged("weir::socket", |r| r["close_code"] == 1008)
        .await;
    assert_eq!(r["closed_by"], "weir");
    assert!(
        r["detail"]
            .as_str()
            .unwrap()
            .contains("max_socket_send_queue_bytes"),
        "{r}"
    );
    let after = common::rss_kib(weir.pid());
    assert!(
        after < before + 16 * 1024,
        "RSS grew from {before} KiB to {after} KiB for 12 MB the slow client never read"
    );
    drop(slow);
}

#[tokio::test]
async fn a_client_that_vanishes_is_closed_by_weir_and_its_room_hears_on_close() {
    let weir = start(&[
        "--limit",
        "socket_ping_interval_ms=200",
        "--limit",
        "socket_idle_timeout_ms=1000",
    ]);
    let mut ada = join(&weir, "v", "ada").await;
    // Bob joins, then reads nothing, so he answers no ping.
    let bob = join(&weir, "v", "bob").await;
    loop {
        let users = next_of(&mut ada, "presence").await["users"].clone();
        if users == serde_json::json!(["ada", "bob"]) {
            break;
        }
    }
    // Ada keeps answering pings (she reads); bob is dropped, and the room's
    // on-close tells ada he left.
    loop {
        let users = next_of(&mut ada, "presence").await["users"].clone();
        if users == serde_json::json!(["ada"]) {
            break;
        }
    }
    let r = weir
        .first_logged("weir::socket", |r| r["close_code"] == 1001)
        .await;
    assert_eq!(r["closed_by"], "weir");
    assert!(
        r["detail"].as_str().unwrap().contains("without a word"),
        "{r}"
    );
    let closed = weir
        .actor_receipt_where(|r| r["reason"] == "weir:websocket/handler@0.1.0#on-close")
        .await;
    assert_eq!(closed["outcome"], "ok");
    drop(bob);
}

#[tokio::test]
async fn after_a_kill_clients_see_the_drop_reconnect_and_the_history_is_intact() {
    let dir = common::fresh_data_dir();
    let weir = start_in(&dir, &[]);
    let mut ada = join(&weir, "h", "ada").await;
    let mut bob = join(&weir, "h", "bob").await;
    for i in 0..5 {
        say(&mut ada, &format!("kept {i}")).await;
        next_of(&mut bob, "message").await;
    }
    weir.signal("KILL");
    let dropped = loop {
        match tokio::time::timeout(Duration::from_secs(30), ada.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Close(_))) => break "a close frame",
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => break "dropped",
        }
    };
    assert_eq!(dropped, "dropped", "a killed server sends no close");
    drop(weir);
    let weir = start_in(&dir, &[]);
    let mut again = join(&weir, "h", "ada").await;
    for i in 0..5 {
        assert_eq!(
            next_of(&mut again, "message").await["text"],
            format!("kept {i}")
        );
    }
    // The room is told of the ends of the two sockets the killed process
    // held (once each, 1006), and the new socket is not taken for one of
    // them: its id is the room's third.
    assert_eq!(
        departures_once(&weir, "h", 2).await,
        serde_json::json!([[1, 1006], [2, 1006]])
    );
    say(&mut again, "/whoami").await;
    assert_eq!(next_of(&mut again, "me").await["socket"], 3);
    again.close(None).await.unwrap();
    assert_eq!(
        departures_once(&weir, "h", 3).await,
        serde_json::json!([[1, 1006], [2, 1006], [3, 1005]])
    );
}

#[test]
fn the_autobahn_fuzzing_client_passes_every_case_but_compression_against_an_actor_echo() {
    let kosoku = common::autobahn::kosoku();
    let weir = start(&[
        "--limit",
        "max_socket_message_bytes=20000000",
        "--limit",
        "max_socket_send_queue_bytes=20000000",
    ]);
    let report = common::autobahn::run(&kosoku, &format!("ws://{}/rooms/echo/echo", weir.addr));
    assert!(report.passed > 300, "{report:?}");
    assert_eq!(report.failed, Vec::<String>::new(), "{report:?}");
}

#[tokio::test]
async fn under_fsync_durability_a_message_leaves_only_after_the_write_it_reports_is_synced() {
    let dir = common::fresh_data_dir();
    let weir = start_in(&dir, &["--durability", "fsync"]);
    let mut ada = join(&weir, "synced", "ada").await;
    let mut bob = join(&weir, "synced", "bob").await;
    say(&mut ada, "first").await;
    assert_eq!(next_of(&mut bob, "message").await["text"], "first");
    let strace = common::strace::Strace::attach(
        &weir,
        "fsync,fdatasync,write,writev,sendto,sendmsg",
        || async {
            let _ = weir.get("/rooms/other/history").await;
        },
    )
    .await;
    say(&mut ada, "hello-fsync").await;
    assert_eq!(next_of(&mut bob, "message").await["text"], "hello-fsync");
    let lines = strace.finish();
    let log = lines.join("\n");
    // The room's message, as it leaves for a client (its frame's text
    // within the bytes strace shows).
    let sent = lines
        .iter()
        .position(|l| !l.contains("sqlite3") && l.contains("hello-fsync"))
        .unwrap_or_else(|| panic!("the message never left:\n{log}"));
    let room = format!("{}", dir.join("actors/room/synced.sqlite3").display());
    assert!(
        lines[..sent]
            .iter()
            .any(|l| (l.contains("fsync(") || l.contains("fdatasync(")) && l.contains(&room)),
        "the message left before the room's write was synced:\n{}",
        lines[..=sent].join("\n")
    );
}
