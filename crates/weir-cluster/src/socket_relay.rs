//! Socket relays between nodes: an actor's WebSocket whose client reached
//! a node that does not own the actor goes to the owner over a connection
//! of its own to the owner's internal listener, and runs there as a turn
//! of the actor; the node the client reached then only carries bytes.
//!
//! Invariants owned here:
//! - a relayed upgrade carries the cluster's secret (refused 401 without
//!   it, before anything runs) and names its actor in Weir's own headers;
//!   none of the client's `x-weir-cluster-*` headers travel with it;
//! - the owner runs it as a turn of the actor there or not at all
//!   (answered "not run": the sender may locate the actor again, once);
//! - a node of a build without socket relays answers their path as not a
//!   cluster call (404): the client is answered 501 `cluster_unsupported`;
//! - a socket takes a connection of its own, never one of the pooled
//!   connections calls share, so an open socket never holds a call up;
//! - a relayed upgrade carries the mark of the run of the node that
//!   relays it ([`RELAYER_HEADER`]); when that node leaves, it tells each
//!   owner once ([`LEAVING_PATH`]), and the owner closes those sockets
//!   going away while the relayer still carries their bytes. An owner of
//!   a build without that door (404), or one that does not answer within
//!   [`LEAVING_TELL_TIMEOUT`], is not waited for: its sockets are dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::OnceCell;
use weir_actors::socket_relay::{CLUSTER_HEADER_PREFIX, RELAYER_HEADER, relayer_mark};
use weir_actors::{ActorAddress, Relayed, TurnError};

use crate::counters::add;
use crate::error_code::ClusterErrorCode;
use crate::internal::{
    CONNECT_TIMEOUT, FORWARD_TIMEOUT, Forwarder, MAX_ENVELOPE_BYTES, SECRET_HEADER, Served,
};

/// The version of socket relays this build speaks: a build that changes
/// what a relay carries takes a new one (and a new [`SOCKET_PATH`]).
pub const SOCKET_RELAY_VERSION: u32 = 1;

/// Where a node takes relayed upgrades. Versioned on its own, apart from
/// the calls' envelope: a node that does not serve it answers 404.
pub const SOCKET_PATH: &str = "/weir/cluster/socket/v1";

/// Where a node that relays sockets here says it is leaving, naming the
/// mark it relayed them under ([`RELAYER_HEADER`]); answered 204 once they
/// are closing. Added within version 1: an owner of a build without it
/// answers 404, and the relayer drops those sockets as such builds did.
pub const LEAVING_PATH: &str = "/weir/cluster/socket/v1/relayer-leaving";

/// How long a leaving node waits for an owner to say it will close the
/// sockets relayed to it: one round trip to a live node, well inside the
/// shutdown's grace. An owner that has not answered by then is taken as
/// gone, and those sockets are dropped.
pub const LEAVING_TELL_TIMEOUT: Duration = Duration::from_secs(2);

/// What `weir --version` says of socket relays.
pub const RELAYS_SPOKEN: &str = "socket relays: version 1";

/// The app whose actor a relayed upgrade is for.
pub const APP_HEADER: &str = "x-weir-cluster-app";
/// The actor's class.
pub const CLASS_HEADER: &str = "x-weir-cluster-class";
/// The actor's name.
pub const NAME_HEADER: &str = "x-weir-cluster-name";
/// The upgrade's path inside the actor.
pub const PATH_HEADER: &str = "x-weir-cluster-path";
/// On the owner's answer: `answered` (the actor's answer, or a limit's)
/// or `not-run`. An answer without it is the listener's own refusal.
pub const ANSWER_HEADER: &str = "x-weir-cluster-socket";

const ANSWERED: &str = "answered";
const NOT_RUN: &str = "not-run";

/// The head of an upgrade relayed to the node at `node`: the client's
/// headers but Weir's own and `host`, then the actor's names, the secret
/// and the relayer's mark.
fn relayed_head(
    node: &str,
    (secret, relayer): (&str, &str),
    app: &str,
    actor: &ActorAddress,
    path: &str,
    client: &HeaderMap,
) -> Result<Request<Full<Bytes>>, http::Error> {
    let mut request = Request::get(format!("http://{node}{SOCKET_PATH}"));
    let headers = request.headers_mut().expect("a fresh builder");
    for (name, value) in client {
        if name == header::HOST || name.as_str().starts_with(CLUSTER_HEADER_PREFIX) {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    request
        .header(header::HOST, node)
        .header(SECRET_HEADER, secret)
        .header(RELAYER_HEADER, relayer)
        .header(APP_HEADER, app)
        .header(CLASS_HEADER, actor.class.as_str())
        .header(NAME_HEADER, actor.name.as_str())
        .header(PATH_HEADER, path)
        .body(Full::new(Bytes::new()))
}

/// The actor and path a relayed upgrade names, if it names them well.
fn named(headers: &HeaderMap) -> Option<(String, ActorAddress, String)> {
    let text = |name: &str| headers.get(name)?.to_str().ok();
    let app = text(APP_HEADER)?;
    let actor = ActorAddress::new(text(CLASS_HEADER)?, text(NAME_HEADER)?).ok()?;
    let path = text(PATH_HEADER).filter(|p| p.starts_with('/'))?;
    Some((app.to_string(), actor, path.to_string()))
}

fn marked(mut response: Response<Full<Bytes>>, how: &'static str) -> Response<Full<Bytes>> {
    response
        .headers_mut()
        .insert(ANSWER_HEADER, HeaderValue::from_static(how));
    response
}

/// Takes an upgrade another node relayed here (its secret already
/// checked): runs it as a turn of the actor it names, if this node owns
/// the actor and is not leaving; otherwise answers "not run".
pub(crate) async fn take(request: Request<Incoming>, served: &Served) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, body: &'static str| {
        let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *response.status_mut() = status;
        response
    };
    let Some((app, actor, path)) = named(request.headers()) else {
        return plain(
            StatusCode::BAD_REQUEST,
            "a relayed upgrade names no actor\n",
        );
    };
    if !request.headers().contains_key(header::UPGRADE) {
        return plain(
            StatusCode::BAD_REQUEST,
            "a relayed upgrade must ask for one\n",
        );
    }
    let Some(door) = served.door(&app) else {
        return marked(plain(StatusCode::CONFLICT, "not run\n"), NOT_RUN);
    };
    // Admitted like a call (a leaving node runs nothing new); once the
    // actor accepted it, the socket is the hub's, closed at its shutdown.
    let Some(running) = served.leaving.admit().await else {
        add(&served.counters.not_run, 1);
        return marked(plain(StatusCode::CONFLICT, "not run\n"), NOT_RUN);
    };
    // Nor does a node without a lease (see `Served::runs_nothing`).
    if served.runs_nothing() {
        add(&served.counters.not_run, 1);
        return marked(plain(StatusCode::CONFLICT, "not run\n"), NOT_RUN);
    }
    let answer = door.open(actor, path, request).await;
    drop(running);
    match answer {
        Some(response) => {
            // A socket taken, or a turn that ran and answered without one.
            let counter = if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                &served.counters.sockets_taken
            } else {
                &served.counters.served
            };
            add(counter, 1);
            let (head, body) = response.into_parts();
            marked(Response::from_parts(head, Full::new(body)), ANSWERED)
        }
        None => {
            add(&served.counters.not_run, 1);
            marked(plain(StatusCode::CONFLICT, "not run\n"), NOT_RUN)
        }
    }
}

/// A relayer's word that it is leaving (its secret already checked): the
/// sockets it relayed here under its mark close going away.
pub(crate) fn relayer_leaving(
    request: &Request<Incoming>,
    served: &Served,
) -> Response<Full<Bytes>> {
    let Some(mark) = relayer_mark(request.headers()) else {
        let mut response = Response::new(Full::new(Bytes::from_static(
            b"a relayer's leaving names no relayer\n",
        )));
        *response.status_mut() = StatusCode::BAD_REQUEST;
        return response;
    };
    tracing::info!(
        relayer = mark,
        "a node that relays sockets here is leaving: they close going away"
    );
    for door in served.doors() {
        door.relayer_leaving(mark);
    }
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

/// What this node relays sockets as, and the owners it told it is leaving.
pub(crate) struct Relayer {
    /// This run's mark: the node's name, its process and when it started.
    pub(crate) mark: String,
    /// Each owner's answer, asked once however many sockets ask.
    told: Mutex<HashMap<String, Arc<OnceCell<bool>>>>,
}

impl Relayer {
    pub(crate) fn new(node: &str) -> Relayer {
        let started = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        // A node's name is at most `MAX_NODE_NAME` plain characters
        // (checked at its start), so the mark fits `MAX_RELAYER_BYTES`.
        Relayer {
            mark: format!("{node}@{:x}.{started:x}", std::process::id()),
            told: Mutex::default(),
        }
    }
}

impl Forwarder {
    /// This node is leaving: tells the node at `node` once, however many
    /// of the sockets relayed there ask, and says whether it will close
    /// them (see [`weir_actors::Placement::relayer_leaving`]).
    pub async fn relayer_leaving(&self, node: &str) -> bool {
        let told = self
            .relays
            .told
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(node.to_string())
            .or_default()
            .clone();
        *told.get_or_init(|| self.tell_leaving(node)).await
    }

    async fn tell_leaving(&self, node: &str) -> bool {
        let Ok(request) = Request::post(format!("http://{node}{LEAVING_PATH}"))
            .header(SECRET_HEADER, self.secret.as_ref())
            .header(RELAYER_HEADER, self.relays.mark.as_str())
            .body(Full::new(Bytes::new()))
        else {
            return false;
        };
        let status = match tokio::time::timeout(LEAVING_TELL_TIMEOUT, self.client.request(request))
            .await
        {
            Ok(Ok(response)) => response.status(),
            Ok(Err(e)) => {
                tracing::warn!(node, error = %e, "cannot tell an owner this node is leaving: the sockets relayed to it are dropped");
                return false;
            }
            Err(_) => {
                tracing::warn!(
                    node,
                    "an owner did not answer that this node is leaving in time: the sockets relayed to it are dropped"
                );
                return false;
            }
        };
        match status {
            StatusCode::NO_CONTENT => {
                tracing::info!(
                    node,
                    "told an owner this node is leaving: it closes the sockets relayed to it"
                );
                true
            }
            StatusCode::NOT_FOUND => {
                tracing::warn!(
                    node,
                    "the owner runs a Weir build that cannot close relayed sockets for a leaving node: they are dropped"
                );
                false
            }
            status => {
                tracing::warn!(node, %status, "an owner refused this node's leaving: the sockets relayed to it are dropped");
                false
            }
        }
    }

    /// Relays the upgrade `head` to `actor` of `app` (its `path` inside
    /// the actor) to the node at `node`, on a connection of its own.
    pub async fn relay_socket(
        &self,
        node: &str,
        app: &str,
        actor: &ActorAddress,
        path: &str,
        head: Request<()>,
    ) -> Relayed {
        let refused = |why: &str, sent: bool| {
            tracing::warn!(node, actor = %actor, why, sent, "a socket relayed to another node failed");
            let code = TurnError::from(ClusterErrorCode::OwnerUnreachable);
            if sent {
                Relayed::Failed(code)
            } else {
                Relayed::NotRun(code)
            }
        };
        let request = match relayed_head(
            node,
            (&self.secret, &self.relays.mark),
            app,
            actor,
            path,
            head.headers(),
        ) {
            Ok(request) => request,
            Err(e) => return refused(&e.to_string(), false),
        };
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(node)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return refused(&e.to_string(), false),
            Err(_) => return refused("no connection in time", false),
        };
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) =
            match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
                Ok(pair) => pair,
                Err(e) => return refused(&e.to_string(), false),
            };
        tokio::spawn(async move {
            let _ = connection.with_upgrades().await;
        });
        let mut response =
            match tokio::time::timeout(FORWARD_TIMEOUT, sender.send_request(request)).await {
                Ok(Ok(response)) => response,
                Ok(Err(e)) => return refused(&e.to_string(), true),
                Err(_) => return refused("no answer in time", true),
            };
        let how = response
            .headers()
            .get(ANSWER_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        match (response.status(), how.as_deref()) {
            (StatusCode::SWITCHING_PROTOCOLS, Some(ANSWERED)) => {
                let upgrade = hyper::upgrade::on(&mut response);
                let (mut head, _) = response.into_parts();
                head.headers.remove(ANSWER_HEADER);
                match upgrade.await {
                    Ok(upgraded) => {
                        add(&self.counters.sockets_relayed, 1);
                        Relayed::Opened(
                            Response::from_parts(head, ()),
                            Box::new(TokioIo::new(upgraded)),
                        )
                    }
                    Err(e) => refused(&e.to_string(), true),
                }
            }
            (_, Some(NOT_RUN)) => {
                add(&self.counters.not_run, 1);
                Relayed::NotRun(ClusterErrorCode::OwnerUnreachable.into())
            }
            (_, Some(ANSWERED)) => {
                // Handed on and run, as a call is.
                add(&self.counters.forwarded, 1);
                let (mut head, body) = response.into_parts();
                head.headers.remove(ANSWER_HEADER);
                match Limited::new(body, MAX_ENVELOPE_BYTES).collect().await {
                    Ok(body) => Relayed::Answered(Response::from_parts(head, body.to_bytes())),
                    Err(e) => refused(&e.to_string(), true),
                }
            }
            (StatusCode::NOT_FOUND, None) => {
                tracing::warn!(
                    node,
                    actor = %actor,
                    "the owner runs a Weir build without socket relays; its actors' sockets are reached through it alone until it is upgraded"
                );
                Relayed::Failed(ClusterErrorCode::Unsupported.into())
            }
            (status, _) => refused(&format!("refused with {status}"), false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_actors::socket_relay::MAX_RELAYER_BYTES;

    #[test]
    fn a_relayed_head_keeps_the_clients_headers_but_weirs_own_and_names_its_actor() {
        let mut client = HeaderMap::new();
        client.insert(header::HOST, HeaderValue::from_static("chat.example"));
        client.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        client.insert("sec-websocket-key", HeaderValue::from_static("k"));
        client.append("cookie", HeaderValue::from_static("a=1"));
        client.append("cookie", HeaderValue::from_static("b=2"));
        client.insert(SECRET_HEADER, HeaderValue::from_static("a guess"));
        client.insert(APP_HEADER, HeaderValue::from_static("other-app"));
        client.insert(RELAYER_HEADER, HeaderValue::from_static("a guess"));
        let actor = ActorAddress::new("room", "lobby").unwrap();
        let request = relayed_head(
            "10.0.0.2:7001",
            ("the secret", "n2@1f.2a"),
            "chat",
            &actor,
            "/?user=ann",
            &client,
        )
        .unwrap();
        let h = request.headers();
        assert_eq!(request.uri().path(), SOCKET_PATH);
        assert_eq!(h[header::HOST], "10.0.0.2:7001");
        assert_eq!(h.get_all(header::HOST).iter().count(), 1);
        assert_eq!(h[SECRET_HEADER], "the secret");
        assert_eq!(h.get_all(SECRET_HEADER).iter().count(), 1);
        assert_eq!(h[APP_HEADER], "chat");
        assert_eq!(h.get_all(APP_HEADER).iter().count(), 1);
        assert_eq!(h[RELAYER_HEADER], "n2@1f.2a");
        assert_eq!(h.get_all(RELAYER_HEADER).iter().count(), 1);
        assert_eq!(h[header::UPGRADE], "websocket");
        assert_eq!(h.get_all("cookie").iter().count(), 2);
        assert_eq!(
            named(h),
            Some(("chat".to_string(), actor, "/?user=ann".to_string()))
        );
    }

    #[test]
    fn a_relayers_mark_names_its_node_and_this_run_and_fits_its_bound() {
        let mark = Relayer::new("n2").mark;
        assert!(mark.starts_with("n2@"), "{mark}");
        assert!(mark.contains(&format!("@{:x}.", std::process::id())));
        let longest = "n".repeat(crate::config::MAX_NODE_NAME);
        let mark = Relayer::new(&longest).mark;
        assert!(mark.len() <= MAX_RELAYER_BYTES, "{}", mark.len());
        assert!(HeaderValue::from_str(&mark).is_ok());
        // A node started again relays under another mark.
        let first = Relayer::new("n2").mark;
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert_ne!(first, Relayer::new("n2").mark);
    }

    #[test]
    fn the_path_and_the_words_name_the_relay_version() {
        assert_eq!(
            SOCKET_PATH,
            format!("/weir/cluster/socket/v{SOCKET_RELAY_VERSION}")
        );
        assert!(LEAVING_PATH.starts_with(&format!("{SOCKET_PATH}/")));
        assert_eq!(
            RELAYS_SPOKEN,
            format!("socket relays: version {SOCKET_RELAY_VERSION}")
        );
    }

    #[test]
    fn an_upgrade_naming_no_valid_actor_or_path_is_not_taken() {
        let mut h = HeaderMap::new();
        h.insert(APP_HEADER, HeaderValue::from_static("chat"));
        h.insert(CLASS_HEADER, HeaderValue::from_static("room"));
        h.insert(NAME_HEADER, HeaderValue::from_static("lobby"));
        assert_eq!(named(&h), None, "no path");
        h.insert(PATH_HEADER, HeaderValue::from_static("relative"));
        assert_eq!(named(&h), None, "a path not starting with /");
        h.insert(PATH_HEADER, HeaderValue::from_static("/"));
        assert!(named(&h).is_some());
        h.insert(NAME_HEADER, HeaderValue::from_static("a/b"));
        assert_eq!(named(&h), None, "a name the actor address refuses");
    }
}
