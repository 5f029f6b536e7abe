//! Never two owners, from outside: real nodes on a real PostgreSQL whose
//! links and locks the tests hold. A node whose lease could have lapsed
//! answers for nothing it held, even when a late renewal says "renewed";
//! nothing an actor sends on a socket leaves before the cluster has the
//! writes it reports; a node cut off from the database closes its sockets
//! so their clients reach the next owner.

mod common;

use std::time::{Duration, Instant};

use common::Weir;
use common::chat::{
    chat_node, departures_once, history, join, message_of, next_where, presence_of, room_key, said,
    say,
};
use common::cluster::{Postgres, actor_key, actor_of, node, node_dir, put, until_ok};
use common::postgres::Partition;
use common::websocket::{Client, close_of};
use futures::StreamExt;
use tokio_tungstenite::tungstenite::Message;

/// A lease long enough that a renewal held on a row lock can outlast the
/// lease's expiry and still be answered within the node's call timeout
/// (5 s): the renewal goes at a third of the lease, so the lease expires
/// 3 s after it is sent, and the row lock is let go soon after.
const LONG_LEASE: &str = "cluster_lease_ms=4500";

/// Waits (at most 30 s) until `check` holds.
async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "{what} within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn read(node: &Weir, actor: &str) -> (u16, String) {
    let r = node.get(&format!("/direct/{actor}/get?key=k")).await;
    let body = match &r.body {
        Ok(b) => String::from_utf8_lossy(b).into_owned(),
        Err(e) => e.clone(),
    };
    (r.status.as_u16(), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answered_after_the_lease_could_have_lapsed_leaves_the_node_answering_for_nothing()
 {
    let pg = Postgres::start();
    let extra = ["--limit", LONG_LEASE];
    let n1 = node(&pg, "n1", &node_dir("owners-race", "n1"), &extra);
    let n2 = node(&pg, "n2", &node_dir("owners-race", "n2"), &extra);
    let actor = actor_of(&pg, &n1, "n1", "race-").await;
    assert_eq!(put(n1.addr, &actor, "old").await.status, 200);
    assert_eq!(read(&n1, &actor).await, (200, "old".to_string()));
    // n1's lease row held locked: its next renewal waits on the lock, in
    // the database, past the lease's expiry.
    let held = pg.hold("SELECT 1 FROM weir_nodes WHERE name = 'n1' FOR UPDATE");
    until("n1's lease to expire by the database's clock", || {
        pg.owner(&actor_key(&actor)).is_none()
    })
    .await;
    // n2 claims the actor (its claim reads n1's row without the lock) and
    // writes to it.
    let r = put(n2.addr, &actor, "new").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(pg.owner(&actor_key(&actor)).as_deref(), Some("n2"));
    // The renewal goes on, and is answered.
    drop(held);
    // n1 never answers from the copy it held: through it, the actor is
    // the one n2 wrote (or n1 cannot say yet), never "old".
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut answers = Vec::new();
    while Instant::now() < deadline {
        let answer = read(&n1, &actor).await;
        assert_ne!(
            answer,
            (200, "old".to_string()),
            "n1 answered from its old copy after n2 claimed the actor; before: {answers:?}"
        );
        answers.push(answer);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = until_ok(&n1, "GET", &format!("/direct/{actor}/get?key=k"), "").await;
    assert_eq!(r.text(), "new");
    // The node said why it dropped what it owned.
    n1.first_logged("weir_cluster::lease", |r| {
        r["message"]
            .as_str()
            .is_some_and(|m| m.contains("within this node's own end of it"))
    })
    .await;
}

/// The frames `ws` gets until its connection ends, and how it ended.
async fn frames_until_closed(ws: &mut Client) -> (Vec<String>, Result<(u16, String), String>) {
    let mut texts = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
            Err(_) => panic!("the socket neither closed nor ended within 30 s; it had {texts:?}"),
            Ok(None) => return (texts, Err("ended without a close frame".into())),
            Ok(Some(Err(e))) => return (texts, Err(e.to_string())),
            Ok(Some(Ok(Message::Text(t)))) => texts.push(t.to_string()),
            Ok(Some(Ok(Message::Close(frame)))) => {
                let frame = frame.expect("a close with a code");
                return (texts, Ok((u16::from(frame.code), frame.reason.to_string())));
            }
            Ok(Some(Ok(_))) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_reaches_no_client_before_the_cluster_has_it_and_none_if_it_never_does() {
    let pg = Postgres::start();
    let n1 = chat_node(&pg, "n1", &node_dir("owners-gate", "n1"), &[]);
    let mut ann = join(&n1, "gate", "ann").await;
    let mut bob = join(&n1, "gate", "bob").await;
    presence_of(&mut ann, &["ann", "bob"]).await;
    presence_of(&mut bob, &["ann", "bob"]).await;
    say(&mut ann, "kept").await;
    message_of(&mut bob, "ann", "kept").await;
    // The cluster's log held locked: the room's next commit waits.
    let held = pg.lock_table("weir_log");
    say(&mut ann, "hello").await;
    // Nothing reaches Bob while the write it would report is not in the
    // cluster's database.
    let early = tokio::time::timeout(Duration::from_secs(2), bob.next()).await;
    assert!(
        early.is_err(),
        "Bob was told something before the room's write was durable: {early:?}"
    );
    // The commit is never answered (the node gives up on it after 5 s):
    // Bob's socket closes, naming why, and "hello" never reached him.
    let (texts, ended) = frames_until_closed(&mut bob).await;
    assert!(
        texts.iter().all(|t| !t.contains("hello")),
        "Bob was told of a message the cluster never had: {texts:?}"
    );
    assert_eq!(
        ended,
        Ok((
            1012,
            "the actor's writes could not be made durable".to_string()
        ))
    );
    drop(held);
    // The room as the cluster has it: "hello" is not in it, and the next
    // message is kept after "kept".
    let mut carol = join(&n1, "gate", "carol").await;
    message_of(&mut carol, "ann", "kept").await;
    say(&mut carol, "after").await;
    message_of(&mut carol, "carol", "after").await;
    assert_eq!(
        history(&n1, "gate", 2).await,
        said(&[("ann", "kept"), ("carol", "after")])
    );
}

/// A room name the node `owner` owns among `nodes`, found by joining rooms
/// through `owner` until the database says so; the client that joined it.
async fn room_of(pg: &Postgres, owner: &Weir, name: &str, user: &str) -> (String, Client) {
    for i in 0..32 {
        let room = format!("room-{i}");
        let mut ws = join(owner, &room, user).await;
        presence_of(&mut ws, &[user]).await;
        if pg.owner(&room_key(&room)).as_deref() == Some(name) {
            return (room, ws);
        }
        let _ = ws.close(None).await;
    }
    panic!("no room of {name}'s among 32 names");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_database_closes_its_sockets_and_answers_for_nothing_it_held() {
    let pg = Postgres::start();
    let link = Partition::to(&pg);
    let n1 = chat_node(&link, "n1", &node_dir("owners-cut", "n1"), &[]);
    let n2 = chat_node(&pg, "n2", &node_dir("owners-cut", "n2"), &[]);
    let (room, mut ann) = room_of(&pg, &n1, "n1", "ann").await;
    say(&mut ann, "before").await;
    message_of(&mut ann, "ann", "before").await;
    // n1 cut off from the database, not from its clients: within its own
    // end of the lease it closes the room's socket, so Ann can reconnect
    // to whoever owns the room next.
    link.cut();
    assert_eq!(
        close_of(&mut ann).await,
        Ok((1012, "the actor moved to another node".to_string()))
    );
    // The room moves on through n2.
    let mut bob = join(&n2, &room, "bob").await;
    message_of(&mut bob, "ann", "before").await;
    say(&mut bob, "after").await;
    message_of(&mut bob, "bob", "after").await;
    assert_eq!(pg.owner(&room_key(&room)).as_deref(), Some("n2"));
    // Through n1, still cut off: no answer from the copy it held (an
    // error, or the room as n2 has it).
    let r = n1.get(&format!("/rooms/{room}/history")).await;
    if r.status == 200 {
        assert!(r.text().contains("after"), "{:?}", r.body);
    } else {
        assert!(r.status.is_server_error(), "{:?} {:?}", r.status, r.body);
    }
    // Healed, n1 joins again and reaches the room as it is.
    link.heal();
    let r = until_ok(&n1, "GET", &format!("/rooms/{room}/history"), "").await;
    assert!(r.text().contains("after"), "{:?}", r.body);
    assert_eq!(
        history(&n1, &room, 2).await,
        said(&[("ann", "before"), ("bob", "after")])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_shipped_under_two_sessions_are_each_fenced_by_their_own() {
    use weir_cluster::coordinator::{Claimed, Coordinator, Entry, Fence, Registration, ShipBatch};
    let pg = Postgres::start();
    let coord = weir_cluster::postgres::Postgres::connect(
        &pg.url(),
        weir_cluster::postgres::SCHEMA_PATIENCE,
    )
    .await
    .unwrap();
    let register =
        async |name: &str| match coord.register(name, "127.0.0.1:9", 60_000).await.unwrap() {
            Registration::Registered { session, .. } => session,
            other => panic!("{other:?}"),
        };
    let (a, b) = (register("a").await, register("b").await);
    let claim = async |key: &str, session| match coord.claim(key, session, 0).await.unwrap() {
        Claimed::Owned(state) => Fence {
            object: state.id,
            epoch: state.epoch,
            session,
        },
        other => panic!("{other:?}"),
    };
    let (x, y, z) = (
        claim("x", a).await,
        claim("y", a).await,
        claim("z", b).await,
    );
    let batch = |fence: Fence| ShipBatch {
        fence,
        previous: 0,
        entries: vec![Entry {
            head: 1,
            ltx: vec![1; 64],
            checksum: 7,
        }],
        mirror: weir_store::replica::Mirror::alarm(None),
    };
    // In one call: x under its owner's session; y under a session that
    // does not own it; z under its owner's, which is not the first batch's.
    let shipped = coord
        .commit_many(&[batch(x), batch(Fence { session: b, ..y }), batch(z)])
        .await
        .unwrap();
    assert_eq!(shipped, [true, false, true]);
    let heads = pg.psql(
        "weir",
        "SELECT string_agg(key || '=' || head, ',' ORDER BY key) FROM weir_objects",
    );
    assert_eq!(heads, "x=1,y=0,z=1");
}

/// The id of the socket `ws` is, as its room tells it.
async fn socket_id(ws: &mut Client) -> u64 {
    say(ws, "/whoami").await;
    next_where(ws, "whoami", |v| v["type"] == "me").await["socket"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_a_rooms_owner_vanishes_its_relayed_sockets_end_and_the_next_owner_tells_the_room_of_every_end_once()
 {
    let pg = Postgres::start();
    let n1 = chat_node(&pg, "n1", &node_dir("owners-vanish", "n1"), &[]);
    let n2 = chat_node(&pg, "n2", &node_dir("owners-vanish", "n2"), &[]);
    // Ann on the room's owner, n2; Bob relayed to it through n1.
    let (room, mut ann) = room_of(&pg, &n2, "n2", "ann").await;
    let mut bob = join(&n1, &room, "bob").await;
    presence_of(&mut bob, &["ann", "bob"]).await;
    let ids = (socket_id(&mut ann).await, socket_id(&mut bob).await);
    // The owner stops without a word (no reset reaches anyone): Bob's
    // relay notices by the lease that it is gone, and drops his socket.
    n2.signal("STOP");
    let (_, ended) = frames_until_closed(&mut bob).await;
    assert!(
        ended.is_err(),
        "Bob's relayed socket of a vanished owner: {ended:?}"
    );
    // Bob again, through n1, which takes the room over: the room is told
    // of both sockets n2 held, once each, and Bob's new one is not taken
    // for either.
    let mut bob = join(&n1, &room, "bob").await;
    assert_eq!(pg.owner(&room_key(&room)).as_deref(), Some("n1"));
    assert_eq!(
        departures_once(&n1, &room, 2).await,
        serde_json::json!([[ids.0, 1006], [ids.1, 1006]])
    );
    let again = socket_id(&mut bob).await;
    assert!(again > ids.0.max(ids.1), "{again} after {ids:?}");
    // n2 runs again: by its own clock its lease is over, so it closes
    // Ann's socket (she reconnects to n1) and tells the room nothing.
    n2.signal("CONT");
    assert_eq!(
        close_of(&mut ann).await,
        Ok((1012, "the actor moved to another node".to_string()))
    );
    assert_eq!(
        departures_once(&n1, &room, 2).await,
        serde_json::json!([[ids.0, 1006], [ids.1, 1006]])
    );
}
