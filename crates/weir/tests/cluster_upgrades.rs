//! A cluster upgraded one node at a time, from outside. Weir itself:
//! nodes one build apart serve each other's calls, each sent as the newest
//! version of the envelope both speak, and what the older one cannot carry
//! (an operator's call) is refused by name rather than lost or misread.
//! An app's code: a deploy rolled node by node drops no call.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::Bytes;
use common::apps::deploy;
use common::cluster::{
    Postgres, SECRET, actor_key, actor_of, free_port, incr, incr_at, node, node_dir, node_listening,
};
use common::{guest, try_send_to};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use weir_actors::OperatorCall;
use weir_cluster::envelope::{self, Answer, Target};

/// What a node of version 2 answers a call of another version, word for
/// word (as its build, `a2f75b3`, says it).
const VERSION_2_REFUSAL: &str = "a call of version 3 from a node of another Weir build; this \
                                 node speaks version 2: every node of a cluster must run the \
                                 same build\n";

/// The internal door of a node of the previous build, as the other nodes
/// meet it: in front of a real node's internal listener (`behind`), it
/// refuses a call of any version but 2 as a version 2 node does (400, its
/// words, no versions header) and passes a call of version 2 through.
/// Once `upgraded`, it passes every call through, as the node's new build
/// would take it. While `confused`, it refuses version 2 too, naming 3 (a
/// node that cannot make up its mind, or two behind one address).
struct OlderDoor {
    addr: SocketAddr,
    refused: Arc<AtomicUsize>,
    passed: Arc<AtomicUsize>,
    upgraded: Arc<AtomicBool>,
    confused: Arc<AtomicBool>,
}

impl OlderDoor {
    async fn open(behind: SocketAddr) -> OlderDoor {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let door = OlderDoor {
            addr: listener.local_addr().unwrap(),
            refused: Arc::default(),
            passed: Arc::default(),
            upgraded: Arc::default(),
            confused: Arc::default(),
        };
        let (refused, passed) = (door.refused.clone(), door.passed.clone());
        let (upgraded, confused) = (door.upgraded.clone(), door.confused.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (refused, passed) = (refused.clone(), passed.clone());
                let (upgraded, confused) = (upgraded.clone(), confused.clone());
                let service =
                    hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                        let (refused, passed) = (refused.clone(), passed.clone());
                        let upgraded = upgraded.load(Ordering::SeqCst);
                        let confused = confused.load(Ordering::SeqCst);
                        async move {
                            if confused && request.uri().path() == "/weir/cluster/v2/call" {
                                refused.fetch_add(1, Ordering::SeqCst);
                                let mut r = Response::new(Full::new(Bytes::from("speaks 3\n")));
                                *r.status_mut() = http::StatusCode::BAD_REQUEST;
                                r.headers_mut()
                                    .insert("x-weir-cluster-versions", "3-3".parse().unwrap());
                                return Ok::<_, std::convert::Infallible>(r);
                            }
                            // A relayed socket's upgrade: not a cluster call
                            // to a build without relays.
                            if !upgraded && request.method() == http::Method::GET {
                                refused.fetch_add(1, Ordering::SeqCst);
                                let mut r =
                                    Response::new(Full::new(Bytes::from("not a cluster call\n")));
                                *r.status_mut() = http::StatusCode::NOT_FOUND;
                                return Ok::<_, std::convert::Infallible>(r);
                            }
                            if !upgraded && request.uri().path() != "/weir/cluster/v2/call" {
                                refused.fetch_add(1, Ordering::SeqCst);
                                let mut r =
                                    Response::new(Full::new(Bytes::from(VERSION_2_REFUSAL)));
                                *r.status_mut() = http::StatusCode::BAD_REQUEST;
                                return Ok::<_, std::convert::Infallible>(r);
                            }
                            passed.fetch_add(1, Ordering::SeqCst);
                            let (head, body) = request.into_parts();
                            let body = body.collect().await.unwrap().to_bytes();
                            let mut on = Request::post(head.uri.path())
                                .body(Full::new(body))
                                .unwrap();
                            *on.headers_mut() = head.headers;
                            let answer = try_send_to(behind, on).await.unwrap();
                            let mut r = Response::new(Full::new(answer.body.unwrap()));
                            *r.status_mut() = answer.status;
                            Ok(r)
                        }
                    });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        door
    }
}

/// Posts `target`'s call (`request`) to a node's internal listener as
/// `version`.
async fn post_call(
    internal: SocketAddr,
    version: &str,
    target: &Target,
    request: Request<Bytes>,
) -> common::Resp {
    let body = envelope::encode_request(target, &request).unwrap();
    try_send_to(
        internal,
        Request::post(format!("/weir/cluster/v{version}/call"))
            .header("host", internal.to_string())
            .header("x-weir-cluster-secret", SECRET)
            .body(Full::new(body))
            .unwrap(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serves_calls_of_the_previous_version_and_refuses_others_naming_its_own() {
    let pg = Postgres::start();
    let n1 = node(&pg, "n1", &node_dir("versions", "n1"), &[]);
    let status = n1.admin_get("/status").await.json();
    assert_eq!(
        status["cluster"]["call_versions"],
        serde_json::json!([2, 3])
    );
    let internal: SocketAddr = status["cluster"]["address"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let target = Target::Actor {
        app: "gateway".into(),
        class: "probe".into(),
        name: "older".into(),
        chain: vec![],
    };
    // An actor call as a node hands it on: the URI whole, as the caller sent it.
    let incr = || {
        Request::post("http://localhost/incr")
            .body(Bytes::new())
            .unwrap()
    };
    // A call of version 2 (a node of the previous build's) and one of
    // this build's both run, on the one actor.
    for (version, n) in [("2", "1"), ("3", "2"), ("2", "3")] {
        let r = post_call(internal, version, &target, incr()).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        match envelope::decode_answer(r.body.unwrap()).unwrap() {
            Answer::Answered(answer) => {
                assert_eq!(answer.status(), 200, "{:?}", answer.body());
                assert_eq!(answer.body().as_ref(), n.as_bytes(), "version {version}");
            }
            Answer::NotRun => panic!("version {version}: not run"),
        }
    }
    // An operator's call is not one version 2 carries: malformed, and
    // nothing is deleted.
    let delete = Target::Operator {
        app: "gateway".into(),
        class: "probe".into(),
        name: "older".into(),
        call: OperatorCall::Delete,
    };
    let r = post_call(internal, "2", &delete, Request::new(Bytes::new())).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.text(), "malformed envelope\n");
    assert_eq!(
        pg.psql(
            "weir",
            &format!(
                "SELECT head > 0 FROM weir_objects WHERE key = '{}'",
                actor_key("older")
            )
        ),
        "t"
    );
    // Versions this build does not speak: refused before the call is
    // read, naming the versions it speaks, in a header and in words.
    for version in ["1", "4"] {
        let r = post_call(internal, version, &target, incr()).await;
        assert_eq!(r.status, 400);
        assert_eq!(r.headers["x-weir-cluster-versions"], "2-3");
        assert_eq!(
            r.text(),
            format!(
                "a call of version {version} from a node of another Weir build; this node \
                 speaks versions 2 to 3: nodes of a cluster must be at most one version apart\n"
            )
        );
    }
    assert_eq!(incr_at(&n1, "older").await, "4", "none of the refused ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_the_previous_build_is_sent_the_version_it_speaks_and_no_call_it_cannot_carry() {
    let pg = Postgres::start();
    let n1 = node(&pg, "n1", &node_dir("older", "n1"), &[]);
    // n2 is met by the others through the door of a version 2 node.
    let behind: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let door = OlderDoor::open(behind).await;
    let actor = format!("probe={}", guest("actor_probe").display());
    let advertised = door.addr.to_string();
    let n2 = node_listening(
        &pg,
        "n2",
        &node_dir("older", "n2"),
        &guest("gateway"),
        &behind.to_string(),
        &[
            "--actor",
            &actor,
            "--actor-route",
            "probe=/direct",
            "--cluster-advertise",
            &advertised,
        ],
    );
    // An actor n2 owns (called through n2, which hands a name the
    // rendezvous hash gives n1 to n1 directly, not through the door).
    let kept = actor_of(&pg, &n2, "n2", "kept").await;
    assert_eq!(door.refused.load(Ordering::SeqCst), 0);
    // Through n1: the first call is refused as version 3, goes again as
    // version 2 and runs once; the next ones go as version 2 at once.
    for n in 2..=5 {
        assert_eq!(incr_at(&n1, &kept).await, n.to_string());
    }
    assert_eq!(door.refused.load(Ordering::SeqCst), 1);
    assert_eq!(door.passed.load(Ordering::SeqCst), 4);
    let counters = n1.admin_get("/status").await.json()["cluster"]["counters"].clone();
    assert_eq!(counters["sent_older"], 4, "{counters}");
    // An operator's call, which version 2 does not carry, is tried as
    // this build's (the node may have been upgraded since), refused, and
    // answered by name: nothing is inspected or deleted.
    let r = n1.admin_get(&format!("/actors/probe/{kept}")).await;
    assert_eq!(r.status, 501, "{:?}", r.body);
    assert_eq!(r.json()["error"], "cluster_unsupported");
    let r = n1
        .admin_send("DELETE", &format!("/actors/probe/{kept}"))
        .await;
    assert_eq!(r.status, 501, "{:?}", r.body);
    assert_eq!(r.json()["error"], "cluster_unsupported");
    assert_eq!(door.refused.load(Ordering::SeqCst), 3);
    // An actor's WebSocket, which a build without socket relays cannot
    // take: refused by name, before any guest sees it.
    let r = n1
        .send(
            Request::get(format!("/direct/{kept}/echo"))
                .header("connection", "upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-version", "13")
                .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, 501, "{:?}", r.body);
    assert_eq!(r.json()["error"], "cluster_unsupported");
    assert_eq!(door.refused.load(Ordering::SeqCst), 4);
    assert_eq!(door.passed.load(Ordering::SeqCst), 4);
    assert_eq!(incr_at(&n1, &kept).await, "6", "the actor was not deleted");
    assert_eq!(incr_at(&n2, &kept).await, "7");
    assert_eq!(door.passed.load(Ordering::SeqCst), 5);
    // A node that refuses every version, each time naming the other: each
    // of the call's two attempts (the second after a fresh lookup) tries
    // two versions, then the client is answered 502, and nothing ran.
    door.confused.store(true, Ordering::SeqCst);
    let r = incr(&n1, &kept).await;
    assert_eq!(r.status, 502, "{:?}", r.body);
    assert_eq!(r.json()["error"], "owner_unreachable");
    assert_eq!(door.refused.load(Ordering::SeqCst), 4 + 4);
    door.confused.store(false, Ordering::SeqCst);
    assert_eq!(
        incr_at(&n1, &kept).await,
        "8",
        "the refused call did not run"
    );
    assert_eq!(door.passed.load(Ordering::SeqCst), 6);
    // n2 upgraded: the next operator's call is taken as this build's
    // version, and from then on every call goes as that.
    door.upgraded.store(true, Ordering::SeqCst);
    let r = n1.admin_get(&format!("/actors/probe/{kept}")).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(incr_at(&n1, &kept).await, "9");
    assert_eq!(door.passed.load(Ordering::SeqCst), 8);
    let counters = n1.admin_get("/status").await.json()["cluster"]["counters"].clone();
    assert_eq!(counters["sent_older"], 6, "{counters}");
}

/// What build of the probe class answered a call to `actor` through `node`.
async fn build_of(node: &common::Weir, actor: &str) -> String {
    let r = node.get(&format!("/probe/{actor}/whoami")).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.json()["build"].as_str().unwrap().to_string()
}

/// A class deploy rolled over a cluster node by node: no call fails or is
/// lost, and until every node has the new code an actor runs the code of
/// the node that owns it, whichever node the call came through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_deploy_rolled_over_a_cluster_drops_no_call_and_actors_run_their_owners_code() {
    let pg = Postgres::start();
    let n1 = Arc::new(node(&pg, "n1", &node_dir("rolled", "n1"), &[]));
    let n2 = Arc::new(node(&pg, "n2", &node_dir("rolled", "n2"), &[]));
    let on1 = actor_of(&pg, &n2, "n1", "one").await;
    let on2 = actor_of(&pg, &n2, "n2", "two").await;
    // Calls through both nodes in turn, to an actor of each, all along.
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = [on1.clone(), on2.clone()]
        .into_iter()
        .map(|actor| {
            let (stop, nodes) = (stop.clone(), [n1.clone(), n2.clone()]);
            tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0usize.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let r = incr(&nodes[i % 2], &actor).await;
                    assert_eq!(r.status, 200, "{actor}: {:?}", r.body);
                    acked.push(r.text().parse::<u64>().unwrap());
                }
                (actor, acked)
            })
        })
        .collect();
    let next = std::fs::read(guest("actor_probe_next")).unwrap();
    let r = deploy(&n1, "gateway", &next, "?class=probe&label=probe-2").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Half rolled: each actor runs its owner's code, through either node.
    for node in [&n1, &n2] {
        assert_eq!(build_of(node, &on1).await, "actor-probe-next");
        assert_eq!(build_of(node, &on2).await, "actor-probe");
    }
    let r = deploy(&n2, "gateway", &next, "?class=probe&label=probe-2").await;
    assert_eq!(r.status, 200, "{}", r.text());
    for node in [&n1, &n2] {
        for actor in [&on1, &on2] {
            assert_eq!(build_of(node, actor).await, "actor-probe-next");
        }
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        let (actor, acked) = caller.await.unwrap();
        // Each was written once before this loop (by `actor_of`).
        let n = acked.len() as u64;
        assert!(n > 10, "{actor}: calls ran through both deploys");
        assert_eq!(acked, (2..=n + 1).collect::<Vec<_>>(), "{actor}");
    }
}
