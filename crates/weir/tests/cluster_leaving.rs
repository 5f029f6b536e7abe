//! A node leaving the cluster (stopped gracefully, to be upgraded or
//! moved), from outside: the calls the other nodes send it while it goes
//! are handed on, not failed, and none runs twice.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::cluster::{
    Postgres, actor_of, free_port, incr, incr_at, node, node_dir, node_listening,
};
use common::guest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A node's internal listener as its peers meet it: bytes pass both ways
/// until the door is told to cut; from then on, each connection is cut (a
/// reset) as soon as a call arrives on it, before the node sees the call:
/// what a peer meets when a node goes away just as a call is sent.
struct CuttingDoor {
    addr: SocketAddr,
    cutting: Arc<AtomicBool>,
    cut: Arc<AtomicUsize>,
}

impl CuttingDoor {
    async fn open(behind: SocketAddr) -> CuttingDoor {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let door = CuttingDoor {
            addr: listener.local_addr().unwrap(),
            cutting: Arc::default(),
            cut: Arc::default(),
        };
        let (cutting, cut) = (door.cutting.clone(), door.cut.clone());
        tokio::spawn(async move {
            loop {
                let Ok((peer, _)) = listener.accept().await else {
                    return;
                };
                // Closed with a reset, not a FIN.
                peer.set_zero_linger().unwrap();
                let (cutting, cut) = (cutting.clone(), cut.clone());
                tokio::spawn(async move {
                    let (mut from_peer, to_peer) = peer.into_split();
                    let mut to_peer = Some(to_peer);
                    let mut to_node = None;
                    let mut back = None;
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = match from_peer.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if cutting.load(Ordering::SeqCst) {
                            cut.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        if to_node.is_none() {
                            let Ok(node) = tokio::net::TcpStream::connect(behind).await else {
                                break;
                            };
                            let (mut from_node, w) = node.into_split();
                            let mut to_peer = to_peer.take().unwrap();
                            back = Some(tokio::spawn(async move {
                                let _ = tokio::io::copy(&mut from_node, &mut to_peer).await;
                            }));
                            to_node = Some(w);
                        }
                        if to_node
                            .as_mut()
                            .unwrap()
                            .write_all(&buf[..n])
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    if let Some(back) = back {
                        back.abort();
                        let _ = back.await;
                    }
                });
            }
        });
        door
    }
}

/// A call whose connection to the owner breaks before any answer is
/// handed on only once the owner has left the cluster (it writes the
/// answer of every call it ran before it lets a connection go); while the
/// owner holds its lease, the call may have run there, and is failed, not
/// sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cut_on_its_way_is_handed_on_once_its_owner_has_left_and_only_then() {
    let pg = Postgres::start();
    let n1 = node(&pg, "n1", &node_dir("cut", "n1"), &[]);
    let behind: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let door = CuttingDoor::open(behind).await;
    let advertised = door.addr.to_string();
    let mut n2 = node_listening(
        &pg,
        "n2",
        &node_dir("cut", "n2"),
        &guest("gateway"),
        &behind.to_string(),
        &[
            "--actor",
            &format!("probe={}", guest("actor_probe").display()),
            "--actor-route",
            "probe=/direct",
            "--cluster-advertise",
            &advertised,
        ],
    );
    let actor = actor_of(&pg, &n2, "n2", "cut").await;
    // Through n1, through the door, which now cuts: n2 holds its lease, so
    // the call may have run there; it is failed, not sent again.
    door.cutting.store(true, Ordering::SeqCst);
    let r = incr(&n1, &actor).await;
    assert_eq!(r.status, 502, "{:?}", r.body);
    assert_eq!(r.json()["error"], "owner_unreachable");
    assert_eq!(door.cut.load(Ordering::SeqCst), 1);
    // It did not run (the door cut it before n2 saw it): the next write
    // through n2 itself is the second.
    assert_eq!(incr_at(&n2, &actor).await, "2");
    // n2 leaves; a call through n1 meets the door at n2's address again
    // and is cut: n2 has left, so the call did not run there, and is
    // handed on (n1 takes the actor over and runs it, once).
    n2.signal("TERM");
    assert!(
        n2.wait_exit(std::time::Duration::from_secs(30))
            .is_some_and(|s| s.success()),
        "a graceful stop"
    );
    assert_eq!(incr_at(&n1, &actor).await, "3");
    assert_eq!(door.cut.load(Ordering::SeqCst), 2);
    let counters = n1.admin_get("/status").await.json()["cluster"]["counters"].clone();
    assert_eq!(counters["cut_not_run"], 1, "{counters}");
    assert_eq!(
        pg.owner(&common::cluster::actor_key(&actor)).as_deref(),
        Some("n1")
    );
    assert_eq!(incr_at(&n1, &actor).await, "4");
}

/// A node stopped gracefully (SIGTERM, as for an upgrade) and started
/// again on its data directory under a stream of writes through the other
/// node to an actor it owns: no call fails, none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_gracefully_under_writes_fails_no_call_through_the_other() {
    let pg = Postgres::start();
    let n1 = Arc::new(node(&pg, "n1", &node_dir("restarted", "n1"), &[]));
    let mut n2 = node(&pg, "n2", &node_dir("restarted", "n2"), &[]);
    let actor = actor_of(&pg, &n2, "n2", "moved").await;
    let stop = Arc::new(AtomicBool::new(false));
    let caller = {
        let (stop, n1, actor) = (stop.clone(), n1.clone(), actor.clone());
        tokio::spawn(async move {
            let mut answers = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let r = incr(&n1, &actor).await;
                answers.push((r.status.as_u16(), r.text()));
            }
            answers
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    n2.signal("TERM");
    assert!(
        n2.wait_exit(std::time::Duration::from_secs(30))
            .is_some_and(|s| s.success()),
        "a graceful stop"
    );
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let n2 = node(
        &pg,
        "n2",
        &common::cluster::node_path("restarted", "n2"),
        &[],
    );
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let answers = caller.await.unwrap();
    let failed: Vec<_> = answers.iter().filter(|(s, _)| *s != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        answers.len(),
        &failed[..failed.len().min(5)]
    );
    let acked: Vec<u64> = answers.iter().map(|(_, t)| t.parse().unwrap()).collect();
    let n = acked.len() as u64;
    assert!(n > 10, "calls ran through the restart");
    assert_eq!(acked, (2..=n + 1).collect::<Vec<_>>());
    assert_eq!(incr_at(&n2, &actor).await, (n + 2).to_string());
}

/// A node that stops gracefully while a call another node sent it still
/// runs waits for it (at most 30 s), and then tells its sender that the
/// call may have run: it is never sent to the next owner, which would run
/// it a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_still_running_when_its_node_stops_waiting_is_failed_not_sent_again() {
    let pg = Postgres::start();
    let upstream = common::HoldServer::start(None);
    // Long enough that the turn outlives the node's wait for it.
    let extra = [
        "--allow-outbound",
        "http://127.0.0.1:*",
        "--limit",
        "event_limit_ms=120000",
        "--limit",
        "outbound_first_byte_timeout_ms=120000",
    ];
    let n1 = node(&pg, "n1", &node_dir("given-up", "n1"), &extra);
    let mut n2 = node(&pg, "n2", &node_dir("given-up", "n2"), &extra);
    let actor = actor_of(&pg, &n1, "n2", "held").await;
    // Through n1 to n2, whose turn waits on the upstream.
    let call = {
        let (addr, port) = (n1.addr, upstream.port);
        let path = format!("/direct/{actor}/gate?port={port}");
        tokio::spawn(async move {
            common::send_to(
                addr,
                http::Request::post(path)
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap(),
            )
            .await
        })
    };
    common::wait_for("the turn to reach the upstream", || async {
        match upstream.arrived() {
            0 => Err("not yet".to_string()),
            _ => Ok(()),
        }
    })
    .await;
    n2.signal("TERM");
    let r = call.await.unwrap();
    assert_eq!(r.status, 502, "{:?}", r.body);
    assert_eq!(r.json()["error"], "owner_unreachable");
    assert!(
        n2.wait_exit(std::time::Duration::from_secs(30))
            .is_some_and(|s| s.success()),
        "a graceful stop"
    );
    // The call ran once; n1 took the actor over without running it again.
    assert_eq!(incr_at(&n1, &actor).await, "2");
    assert_eq!(upstream.arrived(), 1);
    upstream.release();
}
