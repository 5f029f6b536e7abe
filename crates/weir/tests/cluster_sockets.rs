//! Actors' WebSockets in cluster mode, from outside: real nodes on a real
//! PostgreSQL, real WebSocket clients of the chat example. A socket is
//! held by the actor's owner whichever node its client reached (relayed
//! from the others); it ends when the owner dies, stops or loses the
//! actor, and a client that connects again finds the room's history.
//! The relay's door does not open to a guess, and what nodes tell each
//! other never reaches a guest.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::Weir;
use common::chat::{chat_node, history, join, message_of, presence_of, room_key, said, say};
use common::cluster::{Postgres, SECRET, node, node_dir};
use common::websocket::{Client, close_of};
use futures::{SinkExt, StreamExt};
use http::Request;
use http_body_util::Full;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

async fn counters(node: &Weir) -> Value {
    node.admin_get("/status").await.json()["cluster"]["counters"].clone()
}

/// Two nodes of the chat example, and a room with a client through each:
/// Ann through n1, Bob through n2, both seen in the room.
struct Room {
    pg: Postgres,
    nodes: [(&'static str, Weir); 2],
    name: &'static str,
    /// The room's owner among `nodes`.
    owner_at: usize,
    /// The client of the owner, and the one relayed to it.
    direct: Client,
    relayed: Client,
}

impl Room {
    async fn open(test: &str, name: &'static str) -> Room {
        Room::open_with(test, name, &[]).await
    }

    /// [`Room::open`] with more arguments for both nodes.
    async fn open_with(test: &str, name: &'static str, extra: &[&str]) -> Room {
        let pg = Postgres::start();
        let nodes = [
            ("n1", chat_node(&pg, "n1", &node_dir(test, "n1"), extra)),
            ("n2", chat_node(&pg, "n2", &node_dir(test, "n2"), extra)),
        ];
        let mut ann = join(&nodes[0].1, name, "ann").await;
        let mut bob = join(&nodes[1].1, name, "bob").await;
        presence_of(&mut ann, &["ann", "bob"]).await;
        presence_of(&mut bob, &["ann", "bob"]).await;
        let owner = pg.owner(&room_key(name)).expect("the room has an owner");
        let owner_at = nodes.iter().position(|(n, _)| *n == owner).unwrap();
        let (direct, relayed) = if owner_at == 0 {
            (ann, bob)
        } else {
            (bob, ann)
        };
        Room {
            pg,
            nodes,
            name,
            owner_at,
            direct,
            relayed,
        }
    }

    fn owner(&self) -> &Weir {
        &self.nodes[self.owner_at].1
    }

    fn other(&self) -> &Weir {
        &self.nodes[1 - self.owner_at].1
    }

    /// Who joined through the owner.
    fn direct_user(&self) -> &'static str {
        ["ann", "bob"][self.owner_at]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rooms_sockets_through_either_node_are_held_by_its_owner_and_end_with_it() {
    let mut room = Room::open("sockets", "lobby").await;
    say(&mut room.direct, "hello").await;
    let direct_user = room.direct_user();
    message_of(&mut room.relayed, direct_user, "hello").await;
    say(&mut room.relayed, "hi").await;
    let relayed_user = ["ann", "bob"][1 - room.owner_at];
    message_of(&mut room.direct, relayed_user, "hi").await;
    // One socket was relayed by the node that does not own the room and
    // taken by the one that does.
    assert_eq!(counters(room.other()).await["sockets_relayed"], 1);
    assert_eq!(counters(room.owner()).await["sockets_taken"], 1);
    assert_eq!(counters(room.owner()).await["sockets_relayed"], 0);
    // The owner killed: both clients see their connection end without a
    // close frame, the relayed one too.
    room.owner().signal("KILL");
    assert!(close_of(&mut room.direct).await.is_err());
    let ended = close_of(&mut room.relayed).await;
    assert!(
        ended.is_err(),
        "a relayed socket of a killed owner: {ended:?}"
    );
    // An upgrade through the survivor while the dead owner's lease lasts
    // is answered owner_unreachable (it may also come after the lease,
    // and be taken over at once).
    let r = room
        .other()
        .send(upgrade("/rooms/lobby/?user=early", &[]))
        .await;
    if r.status != 101 {
        assert_eq!(r.status, 502, "{:?}", r.body);
        assert_eq!(r.json()["error"], "owner_unreachable");
    }
    // The relaying node's receipt says the owner's end went first.
    let receipt = room
        .other()
        .first_logged("weir::socket", |r| r["message"] == "socket relayed")
        .await;
    assert_eq!(receipt["actor"], "room/lobby", "{receipt}");
    assert_eq!(receipt["ended_by"], "owner", "{receipt}");
    // Through the survivor, once it took the room over: its history whole.
    assert_eq!(
        history(room.other(), room.name, 2).await,
        said(&[(direct_user, "hello"), (relayed_user, "hi")])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_owner_closes_its_rooms_sockets_going_away_and_the_other_takes_the_room_over() {
    let mut room = Room::open("sockets-stop", "hall").await;
    say(&mut room.relayed, "before").await;
    let relayed_user = ["ann", "bob"][1 - room.owner_at];
    message_of(&mut room.direct, relayed_user, "before").await;
    // Both sockets close as the owner's do at a graceful stop, the
    // relayed one with the owner's own close frame.
    room.owner().signal("TERM");
    let going_away = (1001, "the server is shutting down".to_string());
    assert_eq!(close_of(&mut room.direct).await, Ok(going_away.clone()));
    assert_eq!(close_of(&mut room.relayed).await, Ok(going_away));
    // The room goes on through the other node, history whole.
    let mut ann = join(room.other(), room.name, "ann").await;
    say(&mut ann, "after").await;
    message_of(&mut ann, "ann", "after").await;
    assert_eq!(
        history(room.other(), room.name, 2).await,
        said(&[(relayed_user, "before"), ("ann", "after")])
    );
    assert_eq!(
        room.pg.owner(&room_key(room.name)),
        Some(room.nodes[1 - room.owner_at].0.to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relaying_node_that_stops_closes_its_sockets_going_away_and_the_owner_learns_they_ended()
{
    let mut room = Room::open("sockets-relayer", "porch").await;
    room.other().signal("TERM");
    // Closed as the owner's own sockets are at a graceful stop: the node
    // the client reached is the one shutting down.
    let ended = close_of(&mut room.relayed).await;
    assert_eq!(
        ended,
        Ok((1001, "the server is shutting down".to_string())),
        "a relayed socket at its relayer's stop"
    );
    // The owner saw that socket end: the room says so, and the socket's
    // receipt there names who relayed it and that Weir closed it.
    let stayed = room.direct_user();
    presence_of(&mut room.direct, &[stayed]).await;
    let receipt = room
        .owner()
        .first_logged("weir::socket", |r| r["relayed_by"].is_string())
        .await;
    let other = room.nodes[1 - room.owner_at].0;
    assert!(
        receipt["relayed_by"]
            .as_str()
            .is_some_and(|m| m.starts_with(&format!("{other}@"))),
        "{receipt}"
    );
    assert_eq!(receipt["close_code"], 1001, "{receipt}");
    assert_eq!(receipt["closed_by"], "weir", "{receipt}");
    // The relayer's own receipt: the owner's end went first.
    let relayed = room
        .other()
        .first_logged("weir::socket", |r| r["message"] == "socket relayed")
        .await;
    assert_eq!(relayed["ended_by"], "owner", "{relayed}");
    // The direct socket was never the relayer's: it stays open.
    say(&mut room.direct, "still here").await;
    message_of(&mut room.direct, stayed, "still here").await;
    // The relayer started again under its name: the sockets it relays now
    // are not the ones its last run left, and stay open.
    let at = 1 - room.owner_at;
    assert!(
        room.nodes[at]
            .1
            .wait_exit(Duration::from_secs(30))
            .is_some()
    );
    let dir = common::cluster::node_path("sockets-relayer", other);
    room.nodes[at].1 = chat_node(&room.pg, other, &dir, &[]);
    let mut cy = join(room.other(), room.name, "cy").await;
    presence_of(&mut cy, &[stayed, "cy"]).await;
    assert_eq!(counters(room.other()).await["sockets_relayed"], 1);
    say(&mut room.direct, "welcome").await;
    message_of(&mut cy, stayed, "welcome").await;
    say(&mut cy, "thanks").await;
    message_of(&mut room.direct, "cy", "thanks").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relaying_node_that_stops_while_the_owner_cannot_answer_drops_its_sockets_in_bounded_time()
 {
    // A lease of 10 s: the owner is frozen for as long as the relayer
    // waits for it (2 s), and must still hold its lease when it runs
    // again (with the tests' 1 s lease it may or may not, by a race).
    let mut room = Room::open_with(
        "sockets-relayer-stuck",
        "attic",
        &["--limit", "cluster_lease_ms=10000"],
    )
    .await;
    // The owner stops answering (frozen, not dead: its lease is still
    // good, so it stays the owner).
    room.owner().signal("STOP");
    room.other().signal("TERM");
    let ended = close_of(&mut room.relayed).await;
    room.owner().signal("CONT");
    assert!(
        ended.as_ref().is_err_and(|e| !e.starts_with("no close")),
        "dropped, not closed and not held: {ended:?}"
    );
    // The relayer gave up on the owner and ended the socket itself, before
    // its shutdown's grace would have cut it without a receipt.
    let relayed = room
        .other()
        .first_logged("weir::socket", |r| r["message"] == "socket relayed")
        .await;
    assert_eq!(relayed["ended_by"], "shutdown", "{relayed}");
    assert_eq!(
        relayed["detail"], "its owner could not be told this node is leaving",
        "{relayed}"
    );
    // Once thawed, the owner learns the connection ended: the room says so.
    let stayed = room.direct_user();
    presence_of(&mut room.direct, &[stayed]).await;
}

/// A counter of `node`'s `/metrics`, 0 when absent.
/// The value of the series `name` on `node`'s metrics: 0 if its family
/// is there but no such series was counted yet (a labelled series appears
/// on its first count); a family that is not there at all (a metric
/// renamed) fails the test rather than read as 0.
async fn metric(node: &Weir, name: &str) -> u64 {
    let text = node.admin_get("/metrics").await.text();
    let family = name.split('{').next().unwrap_or(name);
    let family = family.strip_suffix("_total").unwrap_or(family);
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("# TYPE {family} "))),
        "no metric family {family} in:\n{text}"
    );
    match text.lines().find(|l| l.starts_with(name)) {
        Some(line) => line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("a value in {line:?}")) as u64,
        None => 0,
    }
}

const WAKES: &str = r#"weir_actor_events_total{class="room",event="wake"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hibernated_room_is_woken_on_its_owner_by_a_relayed_socket_and_pings_wake_it_not() {
    let mut room =
        Room::open_with("sockets-asleep", "attic", &["--limit", "actor_idle_ms=300"]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while room.owner().admin_get("/actors").await.json()["status"]["live"] != 0 {
        assert!(Instant::now() < deadline, "the room did not hibernate");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let woken = metric(room.owner(), WAKES).await;
    assert!(woken >= 1, "the joins woke it");
    // The actor's auto-response answers through the relay, waking nobody.
    room.relayed.send(Message::text("ping")).await.unwrap();
    text_of(&mut room.relayed, "pong").await;
    assert_eq!(metric(room.owner(), WAKES).await, woken);
    // A message wakes it, on its owner, from its durable copy.
    say(&mut room.relayed, "up").await;
    let relayed_user = ["ann", "bob"][1 - room.owner_at];
    message_of(&mut room.direct, relayed_user, "up").await;
    // Counted with the turn's receipt, just after its broadcast left.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(room.owner(), WAKES).await == woken {
        assert!(Instant::now() < deadline, "the message woke no room");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metric(room.owner(), WAKES).await, woken + 1);
    assert_eq!(
        metric(room.other(), WAKES).await,
        0,
        "never woken off its owner"
    );
}

/// Waits for the text message `want` (others are skipped), within 30 s.
async fn text_of(ws: &mut Client, want: &str) {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) if t.as_str() == want => return,
            Ok(Some(Ok(_))) => {}
            other => panic!("waiting for {want:?}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_hold_on_a_room_ended_closes_its_sockets_so_they_reach_the_next_owner() {
    let mut pg = Postgres::start();
    let n1 = chat_node(&pg, "n1", &node_dir("sockets-tenure", "n1"), &[]);
    let mut ann = join(&n1, "den", "ann").await;
    presence_of(&mut ann, &["ann"]).await;
    say(&mut ann, "kept").await;
    message_of(&mut ann, "ann", "kept").await;
    // The database away for three leases: the node's session ends when it
    // returns (anyone may have claimed the room meanwhile), and the room's
    // socket is closed with it, naming why.
    pg.stop("INT");
    tokio::time::sleep(Duration::from_millis(3 * common::cluster::LEASE_MS)).await;
    pg.run();
    assert_eq!(
        close_of(&mut ann).await,
        Ok((1012, "the actor moved to another node".to_string()))
    );
    assert_eq!(history(&n1, "den", 1).await, said(&[("ann", "kept")]));
}

/// An upgrade request to `path`, as a browser sends it, with `extra`
/// headers.
fn upgrade(path: &str, extra: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut request = Request::get(path)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    request.body(Full::new(Bytes::new())).unwrap()
}

/// The status line and body of a raw `GET` of the relay's door at
/// `internal`, with `headers`.
async fn knock(internal: &str, headers: &[(&str, &str)]) -> (u16, String) {
    knock_at(internal, "GET /weir/cluster/socket/v1", headers).await
}

/// The status line and body of a raw request (`what`: its method and
/// target) to the node whose internal listener is at `internal`.
async fn knock_at(internal: &str, what: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(internal).await.unwrap();
    let mut head = format!("{what} HTTP/1.1\r\nhost: {internal}\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("connection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
        .await
        .expect("answered in time")
        .unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer.split_once("\r\n\r\n").unwrap().1.to_string();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relays_door_opens_to_no_guess_and_what_nodes_tell_each_other_reaches_no_guest() {
    let pg = Postgres::start();
    let n1 = node(&pg, "n1", &node_dir("sockets-door", "n1"), &[]);
    let n2 = node(&pg, "n2", &node_dir("sockets-door", "n2"), &[]);
    let status = n2.admin_get("/status").await.json();
    assert_eq!(status["cluster"]["socket_relay_version"], 1);
    let internal = status["cluster"]["address"].as_str().unwrap().to_string();
    let actor = [
        ("x-weir-cluster-app", "gateway"),
        ("x-weir-cluster-class", "probe"),
        ("x-weir-cluster-name", "door"),
        ("x-weir-cluster-path", "/echo"),
        ("upgrade", "websocket"),
    ];
    // Without the secret, or with a guess: refused before anything runs.
    assert_eq!(knock(&internal, &actor).await.0, 401);
    let guessed: Vec<_> = actor
        .iter()
        .copied()
        .chain([("x-weir-cluster-secret", "a guess")])
        .collect();
    assert_eq!(knock(&internal, &guessed).await.0, 401);
    // With it, naming no actor, or not asking for an upgrade: refused.
    let secret = ("x-weir-cluster-secret", SECRET);
    assert_eq!(
        knock(&internal, &[secret]).await,
        (400, "a relayed upgrade names no actor\n".to_string())
    );
    assert_eq!(
        knock(&internal, &[secret, actor[0], actor[1], actor[2], actor[3]]).await,
        (400, "a relayed upgrade must ask for one\n".to_string())
    );
    assert_eq!(
        pg.owner(&common::cluster::actor_key("door")),
        None,
        "nothing ran, nothing was claimed"
    );
    // The door where a relayer says it is leaving: the secret first, then
    // a mark of a relayer's size.
    let leaving = "POST /weir/cluster/socket/v1/relayer-leaving";
    let relayer = ("x-weir-cluster-relayer", "n9@1.2");
    assert_eq!(knock_at(&internal, leaving, &[relayer]).await.0, 401);
    let no_mark = (400, "a relayer's leaving names no relayer\n".to_string());
    assert_eq!(knock_at(&internal, leaving, &[secret]).await, no_mark);
    let long = "n".repeat(257);
    let too_long = ("x-weir-cluster-relayer", long.as_str());
    assert_eq!(
        knock_at(&internal, leaving, &[secret, too_long]).await,
        no_mark
    );
    assert_eq!(
        knock_at(&internal, leaving, &[secret, relayer]).await.0,
        204
    );
    // An actor n2 owns, reached through n1 with forged cluster headers:
    // the actor does not accept the socket and answers with the request
    // it saw, which carries none of them (nor the real secret).
    let mut name = None;
    for i in 0..32 {
        let candidate = format!("echo{i}");
        assert_eq!(common::cluster::incr(&n2, &candidate).await.status, 200);
        if pg.owner(&common::cluster::actor_key(&candidate)).as_deref() == Some("n2") {
            name = Some(candidate);
            break;
        }
    }
    let name = name.expect("an actor of n2's among 32 names");
    let (sent, ran) = (counters(&n1).await, counters(&n2).await);
    let r = n1
        .send(upgrade(
            &format!("/direct/{name}/echo"),
            &[
                ("x-weir-cluster-secret", "a guess"),
                ("x-weir-cluster-app", "another"),
                ("x-weir-cluster-name", "another"),
                ("x-weir-cluster-relayer", "n9@1.2"),
            ],
        ))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let seen = r.json();
    let names: Vec<String> = seen["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h[0].as_str().unwrap().to_string())
        .collect();
    assert!(
        names.contains(&"sec-websocket-key".to_string()),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|n| n.starts_with("x-weir-cluster-")),
        "{names:?}"
    );
    assert!(!r.text().contains(SECRET));
    // Counted as a call handed on and run, not as a socket.
    let (sent_now, ran_now) = (counters(&n1).await, counters(&n2).await);
    assert_eq!(sent_now["sockets_relayed"], 0, "answered, not opened");
    assert_eq!(ran_now["sockets_taken"], 0);
    let grew = |now: &Value, before: &Value, name: &str| {
        now[name].as_u64().unwrap() - before[name].as_u64().unwrap()
    };
    assert_eq!(grew(&sent_now, &sent, "forwarded"), 1);
    assert_eq!(grew(&ran_now, &ran, "served"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_socket_holds_its_place_among_max_sockets_on_the_node_it_reached() {
    let pg = Postgres::start();
    let n1 = chat_node(
        &pg,
        "n1",
        &node_dir("sockets-places", "n1"),
        &["--limit", "max_sockets=1"],
    );
    let n2 = chat_node(&pg, "n2", &node_dir("sockets-places", "n2"), &[]);
    // A room n2 owns.
    let mut room = None;
    for i in 0..32 {
        let candidate = format!("r{i}");
        let mut ws = join(&n2, &candidate, "probe").await;
        presence_of(&mut ws, &["probe"]).await;
        let _ = ws.close(None).await;
        if pg.owner(&room_key(&candidate)).as_deref() == Some("n2") {
            room = Some(candidate);
            break;
        }
    }
    let room = room.expect("a room of n2's among 32 names");
    let mut ann = join(&n1, &room, "ann").await;
    presence_of(&mut ann, &["ann"]).await;
    assert_eq!(counters(&n1).await["sockets_relayed"], 1);
    let relayed_open = r#"weir_sockets_relayed_open{app="chat"}"#;
    assert_eq!(metric(&n1, relayed_open).await, 1);
    // n1's one place is the relayed socket's: one more is refused there,
    // before any actor sees it.
    let r = n1
        .send(upgrade(&format!("/rooms/{room}/?user=bob"), &[]))
        .await;
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert_eq!(r.json()["error"], "socket_capacity_exceeded");
    // Once it ends (its client gone without a close), its place is given
    // back, and its receipt says the client's end went first.
    drop(ann);
    let receipt = n1
        .first_logged("weir::socket", |r| r["message"] == "socket relayed")
        .await;
    assert_eq!(receipt["ended_by"], "client", "{receipt}");
    assert_eq!(metric(&n1, relayed_open).await, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let url = format!("ws://{}/rooms/{room}/?user=bob", n1.addr);
        if let Ok((mut bob, _)) = tokio_tungstenite::connect_async(&url).await {
            presence_of(&mut bob, &["bob"]).await;
            break;
        }
        assert!(Instant::now() < deadline, "the place was not given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
