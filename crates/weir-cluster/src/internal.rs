//! The internal listener: where other nodes hand this node the calls it
//! owns, and the client that hands calls to them.
//!
//! Invariants owned here:
//! - a call between nodes carries the cluster's shared secret; one
//!   without it is refused (401) before its body is read, on a connection
//!   then closed, and the comparison takes the same time whatever the
//!   guess;
//! - a connection keeps a place only once a call on it bore the secret
//!   ([`ConnectionPlaces`]): until then it is one of a few, the oldest of
//!   which goes when a new one comes, and it must speak at once. So no
//!   number of idle or secret-less connections keeps another node's calls
//!   out; and no connection stays idle or unread without end;
//! - a call is run only if this node owns its target now (claiming it if
//!   nobody does) and is not leaving the cluster ([`crate::leaving`]);
//!   otherwise the answer says it did not run, and nothing ran;
//! - a call is posted as the newest envelope version both nodes speak that
//!   carries it, tried as at most two versions ([`crate::call_versions`]);
//!   an actor's WebSocket is relayed on a connection of its own
//!   ([`crate::socket_relay`]);
//! - a call that was sent and got no answer (the connection broke, the
//!   node did not answer in time) is reported as possibly run, never
//!   retried; only a call that never left (no connection) may be, or one
//!   whose connection broke before any answer came back from a node that
//!   has since left the cluster: a leaving node answers every call it ran
//!   before it lets a connection go, so that call did not run there;
//! - this node, leaving, lets every connection from another node go only
//!   once the answer in flight on it was written (at most
//!   [`CLOSE_TIMEOUT`]).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use weir_actors::call_chain::CallChain;
use weir_actors::{ActorAddress, ActorHost, Forwarded, SocketDoor};
use weir_http::connection_places::{ConnectionPlaces, Place};
use weir_http::shutdown::Stops;

use crate::call_versions::{self, Spoken, VERSIONS_HEADER};
use crate::coordinator::Coordinator;
use crate::counters::{Counters, add};
use crate::envelope::{self, Answer, Target};
use crate::error_code::{ClusterErrorCode, with_causes};
use crate::leaving::Leaving;
use crate::socket_relay;
use crate::stores::StorePlacement;

/// How many times a call is sent at most, each as another version: once
/// as the version expected, once more as the one a refusal named.
const VERSION_TRIES: u32 = 2;

/// What a refusing node's words are read of, at most: one line.
const REFUSAL_BYTES: usize = 1024;

/// The header that carries the shared secret.
pub const SECRET_HEADER: &str = "x-weir-cluster-secret";

/// Largest envelope accepted, either way: a call's body is bounded by the
/// forwarding node's request limits, and an answer's by the response
/// limit (64 MiB by default); the rest is room for the head.
pub const MAX_ENVELOPE_BYTES: usize = (64 << 20) + (1 << 20);

/// Connections from other nodes served at once, at most (those whose
/// calls bore the secret).
pub const MAX_CONNECTIONS: usize = 1024;

/// Connections that have not yet shown the secret, at once: a node's
/// connection shows it in its first call, within moments, so a few are
/// enough; past it the oldest is closed for the newest.
pub const MAX_UNPROVEN_CONNECTIONS: usize = 64;

/// How long a new connection has to send its first call: a node sends it
/// as soon as it connects.
pub const FIRST_CALL_WINDOW: Duration = Duration::from_secs(2);

/// How long a call's head may take to arrive, and a connection may stay
/// idle between calls: other nodes keep theirs for less
/// ([`POOL_IDLE_TIMEOUT`]), so they never send on one this node is about
/// to close.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// How long this node keeps an idle connection to another node for its
/// next call: below the other's [`HEAD_TIMEOUT`].
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a connection to another node may take to open before the call
/// counts as never sent.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a peer may go without acknowledging anything on a connection
/// before the connection is given up: a partition drops packets without a
/// word, and a call sent on the connection would otherwise wait out
/// [`FORWARD_TIMEOUT`]. Data sent and not acknowledged for this long ends
/// it (`TCP_USER_TIMEOUT`), and so does an idle connection whose peer
/// answers none of the keepalive probes sent over this long
/// ([`PEER_PROBE_IDLE`], then [`PEER_PROBES`] a second apart). A slow
/// turn is not silence: the owner's kernel acknowledges the probes.
pub const PEER_SILENCE_LIMIT: Duration = Duration::from_secs(5);

/// Idle time before the first keepalive probe of a peer connection.
pub const PEER_PROBE_IDLE: Duration = Duration::from_secs(2);

/// Keepalive probes of a peer connection, a second apart, before it is
/// given up (with [`PEER_PROBE_IDLE`]: [`PEER_SILENCE_LIMIT`]).
pub const PEER_PROBES: u32 = 3;

/// How long a forwarded call may take in all: past a turn's own deadlines
/// and its wait in the owner's mailbox, so only a node that stopped
/// answering reaches it.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the connections from other nodes have, once this node has
/// left, to take the answers being written to them: the calls ran already
/// ([`crate::leaving`]), so this only carries bytes.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The secret as compared: its digest, so a comparison's time does not
/// depend on how much of a guess was right.
#[derive(Clone)]
pub struct Secret([u8; 32]);

impl Secret {
    pub fn new(secret: &str) -> Secret {
        Secret(Sha256::digest(secret.as_bytes()).into())
    }

    fn admits(&self, offered: &[u8]) -> bool {
        let offered: [u8; 32] = Sha256::digest(offered).into();
        offered
            .iter()
            .zip(self.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

/// What this node serves to the others: each app's actors, stores and
/// databases.
pub struct Served {
    actors: OnceLock<HashMap<String, Arc<ActorHost>>>,
    stores: OnceLock<HashMap<String, Arc<StorePlacement>>>,
    /// Where each app's actors take the sockets other nodes relay here.
    doors: OnceLock<HashMap<String, Arc<dyn SocketDoor>>>,
    pub(crate) counters: Arc<Counters>,
    /// Whether calls still run here, as this node leaves the cluster.
    pub leaving: Leaving,
    /// The node's lease: without it, nothing runs here.
    lease: Arc<crate::lease::Lease>,
}

impl Served {
    pub fn new(counters: Arc<Counters>, lease: Arc<crate::lease::Lease>) -> Served {
        Served {
            actors: OnceLock::new(),
            stores: OnceLock::new(),
            doors: OnceLock::new(),
            counters,
            leaving: Leaving::default(),
            lease,
        }
    }

    /// Binds the apps' actor hosts and stores once they exist (later
    /// calls are ignored); until then calls are answered "not run".
    pub fn connect(
        &self,
        actors: HashMap<String, Arc<ActorHost>>,
        stores: HashMap<String, Arc<StorePlacement>>,
        doors: HashMap<String, Arc<dyn SocketDoor>>,
    ) {
        let _ = self.actors.set(actors);
        let _ = self.stores.set(stores);
        let _ = self.doors.set(doors);
    }

    /// Where `app`'s actors take relayed sockets.
    pub(crate) fn door(&self, app: &str) -> Option<&Arc<dyn SocketDoor>> {
        self.doors.get().and_then(|d| d.get(app))
    }

    /// Every app's door.
    pub(crate) fn doors(&self) -> impl Iterator<Item = &Arc<dyn SocketDoor>> {
        self.doors.get().into_iter().flat_map(|d| d.values())
    }

    /// True while this node holds no lease: it owns nothing, and runs
    /// nothing another node sends it (each is answered "not run").
    pub(crate) fn runs_nothing(&self) -> bool {
        self.lease.held().is_none()
    }

    fn stores_of(&self, app: &str) -> Option<&Arc<StorePlacement>> {
        self.stores.get().and_then(|s| s.get(app))
    }

    async fn call(&self, target: Target, mut request: Request<Bytes>) -> Answer {
        match target {
            Target::Actor {
                app,
                class,
                name,
                chain,
            } => {
                if !chain.is_empty() {
                    request.extensions_mut().insert(CallChain::carried(chain));
                }
                let Some(host) = self.actors.get().and_then(|a| a.get(&app)) else {
                    return Answer::NotRun;
                };
                let Ok(address) = ActorAddress::new(&class, &name) else {
                    return Answer::NotRun;
                };
                match host.call_forwarded(address, request).await {
                    Some(response) => Answer::Answered(response),
                    None => Answer::NotRun,
                }
            }
            Target::Kv { app, store } => {
                let Some(stores) = self.stores_of(&app) else {
                    return Answer::NotRun;
                };
                match stores.forwarded_kv(&store, request.into_body()).await {
                    Some(body) => Answer::Answered(Response::new(body)),
                    None => Answer::NotRun,
                }
            }
            Target::Sql { app, database } => {
                let Some(stores) = self.stores_of(&app) else {
                    return Answer::NotRun;
                };
                match stores.forwarded_sql(&database, request.into_body()).await {
                    Some(body) => Answer::Answered(Response::new(body)),
                    None => Answer::NotRun,
                }
            }
            Target::Operator {
                app,
                class,
                name,
                call,
            } => {
                let Some(host) = self.actors.get().and_then(|a| a.get(&app)) else {
                    return Answer::NotRun;
                };
                let Ok(address) = ActorAddress::new(&class, &name) else {
                    return Answer::NotRun;
                };
                match host.operate_forwarded(address, call).await {
                    Some(response) => Answer::Answered(response),
                    None => Answer::NotRun,
                }
            }
        }
    }
}

fn plain(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
}

/// The answer of a call to `target` that may have run and whose end this
/// node does not know: as the target's own failures are told.
fn may_have_run(target: &Target) -> http::Response<Bytes> {
    let unknown = || {
        format!(
            "outcome_unknown: {} (the call may have run)",
            weir_runtime::WeirError::as_str(ClusterErrorCode::OwnerUnreachable)
        )
    };
    match target {
        Target::Kv { .. } => http::Response::new(crate::store_wire::encode_kv_answer(&Err(
            weir_store::StoreError::Unavailable(unknown()),
        ))),
        Target::Sql { .. } => http::Response::new(crate::store_wire::encode_sql_answer(&Err(
            weir_store::sql::BatchError::OutcomeUnknown(unknown()),
        ))),
        Target::Actor { .. } | Target::Operator { .. } => {
            weir_runtime::error_code::error_response(ClusterErrorCode::OwnerUnreachable)
        }
    }
}

/// A response after which the connection is closed.
fn closing(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = plain(status, body);
    response.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    response
}

async fn handle(
    request: Request<Incoming>,
    secret: &Secret,
    served: &Served,
    place: &Place,
) -> Response<Full<Bytes>> {
    place.spoke();
    let offered = request
        .headers()
        .get(SECRET_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !secret.admits(offered) {
        return closing(StatusCode::UNAUTHORIZED, "the cluster secret is required\n");
    }
    if !place.earn() {
        return closing(
            StatusCode::SERVICE_UNAVAILABLE,
            "every connection place of this node is taken\n",
        );
    }
    if request.method() == http::Method::GET && request.uri().path() == socket_relay::SOCKET_PATH {
        return socket_relay::take(request, served).await;
    }
    if request.method() == http::Method::POST && request.uri().path() == socket_relay::LEAVING_PATH
    {
        return socket_relay::relayer_leaving(&request, served);
    }
    if request.method() != http::Method::POST {
        return plain(StatusCode::NOT_FOUND, "not a cluster call\n");
    }
    let Some(offered) = call_versions::call_version(request.uri().path()) else {
        return plain(StatusCode::NOT_FOUND, "not a cluster call\n");
    };
    let Some(version) = call_versions::served(offered) else {
        let (versions, why) = call_versions::refusal(offered);
        tracing::warn!("{why}");
        let mut refused = plain(StatusCode::BAD_REQUEST, why + "\n");
        if let Ok(value) = http::HeaderValue::from_str(&versions) {
            refused.headers_mut().insert(VERSIONS_HEADER, value);
        }
        return refused;
    };
    // Read within the time a sender waits for its answer at most.
    let body = match tokio::time::timeout(
        FORWARD_TIMEOUT,
        Limited::new(request.into_body(), MAX_ENVELOPE_BYTES).collect(),
    )
    .await
    {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(_)) => return closing(StatusCode::PAYLOAD_TOO_LARGE, "envelope too large\n"),
        Err(_) => return closing(StatusCode::REQUEST_TIMEOUT, "envelope not sent in time\n"),
    };
    let (target, call) = match envelope::decode_request(body, version) {
        Ok(decoded) => decoded,
        Err(e) => {
            tracing::warn!(error = %e, "a malformed call from another node");
            return plain(StatusCode::BAD_REQUEST, "malformed envelope\n");
        }
    };
    let answer = match served.leaving.admit().await {
        // A node that holds no lease (its own end of it passed, or it is
        // registering again) owns nothing and runs nothing: "not run", so
        // the sender looks the object up again rather than pass on this
        // node's failure, and finds the node that may own it now.
        Some(_) if served.runs_nothing() => Answer::NotRun,
        Some(running) => {
            let unsure = may_have_run(&target);
            let answer = tokio::select! {
                answer = served.call(target, call) => answer,
                // This node leaves without waiting for the call any more:
                // it may have run, and its sender is told so (never "not
                // run", which it would send again).
                _ = served.leaving.given_up() => Answer::Answered(unsure),
            };
            drop(running);
            answer
        }
        // This node is leaving: the sender takes the call over.
        None => Answer::NotRun,
    };
    match answer {
        Answer::Answered(_) => add(&served.counters.served, 1),
        Answer::NotRun => add(&served.counters.not_run, 1),
    }
    match envelope::encode_answer(&answer) {
        Ok(bytes) => Response::new(Full::new(bytes)),
        Err(e) => {
            tracing::warn!(error = %e, "an answer that cannot travel back");
            plain(StatusCode::INTERNAL_SERVER_ERROR, "unencodable answer\n")
        }
    }
}

/// Serves the internal listener until this node has left the cluster
/// ([`Leaving::closed`]), then lets each connection go once the answer
/// in flight on it is written (at most [`CLOSE_TIMEOUT`]).
pub async fn serve(listener: TcpListener, secret: Secret, served: Arc<Served>) {
    let places =
        ConnectionPlaces::new(MAX_CONNECTIONS, MAX_UNPROVEN_CONNECTIONS, FIRST_CALL_WINDOW);
    let stops = Arc::new(Stops::default());
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection from another node");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = served.leaving.closed() => break,
        };
        let _ = stream.set_nodelay(true);
        let place = places.take();
        let secret = secret.clone();
        let served = served.clone();
        let (ticket, stop) = stops.register();
        let connection_place = place.clone();
        let service = hyper::service::service_fn(move |request| {
            let secret = secret.clone();
            let served = served.clone();
            let place = place.clone();
            async move { Ok::<_, Infallible>(handle(request, &secret, &served, &place).await) }
        });
        // With upgrades: a relayed socket takes its connection over
        // (and gives its place among the connections back).
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                biased;
                _ = connection.as_mut() => {}
                // Silent, or pushed out before it showed the secret.
                _ = connection_place.ended() => {}
                _ = stop => {
                    // No new call on this connection; the answer in flight
                    // is written first.
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(ticket);
            drop(connection_place);
        });
    }
    drop(listener);
    stops.stop();
    // Every connection has gone when each has given its place back.
    if !places.drained(CLOSE_TIMEOUT).await {
        tracing::warn!(
            open = places.earned(),
            "connections from other nodes still open as this node stops (an answer not taken in time); they are cut"
        );
    }
}

/// Hands calls to other nodes.
#[derive(Clone)]
pub struct Forwarder {
    pub(crate) client: Client<HttpConnector, Full<Bytes>>,
    pub(crate) secret: Arc<str>,
    pub(crate) counters: Arc<Counters>,
    /// The nodes found to speak an older version than this build.
    spoken: Arc<Spoken>,
    /// What this node relays sockets as, and the owners told it is leaving.
    pub(crate) relays: Arc<socket_relay::Relayer>,
    /// Asked, when a connection breaks before an answer, whether its node
    /// has left the cluster.
    coordinator: Arc<dyn Coordinator>,
}

impl Forwarder {
    /// The forwarder of node `node` (its name in the cluster).
    pub fn new(
        secret: &str,
        node: &str,
        counters: Arc<Counters>,
        coordinator: Arc<dyn Coordinator>,
    ) -> Forwarder {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        // A peer cut off by a partition is found out within
        // PEER_SILENCE_LIMIT, whether a call waits on it or not.
        connector.set_tcp_user_timeout(Some(PEER_SILENCE_LIMIT));
        connector.set_keepalive(Some(PEER_PROBE_IDLE));
        connector.set_keepalive_interval(Some(Duration::from_secs(1)));
        connector.set_keepalive_retries(Some(PEER_PROBES));
        Forwarder {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .build(connector),
            secret: Arc::from(secret),
            counters,
            spoken: Arc::default(),
            relays: Arc::new(socket_relay::Relayer::new(node)),
            coordinator,
        }
    }

    /// Hands a call to `target` to the node at `node`, as the newest
    /// version of the envelope both nodes speak that carries it.
    pub async fn call(&self, node: &str, target: &Target, request: Request<Bytes>) -> Forwarded {
        add(&self.counters.forwarded, 1);
        let failed = |why: &str, sent: bool| {
            tracing::warn!(node, why, sent, "a call to another node failed");
            let code = ClusterErrorCode::OwnerUnreachable.into();
            if sent {
                Forwarded::Failed(code)
            } else {
                Forwarded::NotRun(code)
            }
        };
        let body = match envelope::encode_request(target, &request) {
            Ok(body) => body,
            Err(e) => return failed(&e.to_string(), false),
        };
        let needed = target.since();
        let mut version = self.spoken.to(node, needed);
        let mut tries = 0;
        // The whole exchange, answer body included: a node that sends a
        // head and then stalls is one that did not answer in time.
        let deadline = tokio::time::Instant::now() + FORWARD_TIMEOUT;
        let response = loop {
            tries += 1;
            let Ok(call) = Request::post(format!(
                "http://{node}{}",
                call_versions::call_path(version)
            ))
            .header(SECRET_HEADER, self.secret.as_ref())
            .body(Full::new(body.clone())) else {
                return failed("an unusable node address", false);
            };
            let response = match tokio::time::timeout_at(deadline, self.client.request(call)).await
            {
                Ok(Ok(response)) => response,
                // No connection was made: the call never left.
                Ok(Err(e)) if e.is_connect() => return failed(&with_causes(&e), false),
                Ok(Err(e)) => return self.cut(node, &with_causes(&e)).await,
                Err(_) => return failed("no answer in time", true),
            };
            if response.status() == StatusCode::OK {
                break response;
            }
            // Refused before it ran (a wrong secret, a malformed call, a
            // node of another build): its own words, briefly.
            let status = response.status();
            let (head, body) = response.into_parts();
            let said =
                tokio::time::timeout_at(deadline, Limited::new(body, REFUSAL_BYTES).collect())
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_string())
                    .unwrap_or_default();
            let agreed = (status == StatusCode::BAD_REQUEST)
                .then(|| call_versions::spoken_by(&head.headers, &said))
                .flatten()
                .and_then(call_versions::agreed);
            match agreed {
                // A node of another build that speaks a version this one
                // does too: the call did not run, it goes again as that
                // (once: a node that refuses that too is refused).
                Some(v) if v != version && v >= needed && tries < VERSION_TRIES => {
                    tracing::info!(
                        node,
                        version = v,
                        "a node of another Weir build: calls to it are sent as the version it speaks"
                    );
                    self.spoken.found(node, v);
                    version = v;
                }
                Some(v) if v < needed => {
                    tracing::warn!(
                        node,
                        version = v,
                        needed,
                        "a node of an older Weir build cannot take this call (its version does not carry it); it can once it is upgraded"
                    );
                    return Forwarded::Failed(ClusterErrorCode::Unsupported.into());
                }
                _ => return failed(&format!("refused with {status}: {said}"), false),
            }
        };
        if version < call_versions::CALL_VERSION {
            add(&self.counters.sent_older, 1);
        } else if needed > call_versions::OLDEST_CALL_VERSION {
            // Taken as this build's version, which the node was perhaps
            // once found not to speak: it has been upgraded since.
            self.spoken.found(node, version);
        }
        let body = match tokio::time::timeout_at(
            deadline,
            Limited::new(response.into_body(), MAX_ENVELOPE_BYTES).collect(),
        )
        .await
        {
            Ok(Ok(body)) => body.to_bytes(),
            Ok(Err(e)) => return failed(&e.to_string(), true),
            Err(_) => return failed("its answer did not arrive in time", true),
        };
        match envelope::decode_answer(body) {
            Ok(Answer::Answered(response)) => Forwarded::Answered(response),
            Ok(Answer::NotRun) => Forwarded::NotRun(ClusterErrorCode::OwnerUnreachable.into()),
            Err(e) => failed(&e.to_string(), true),
        }
    }
}

impl Forwarder {
    /// A call whose connection broke before any answer came back: not run
    /// if its node has left the cluster since (a leaving node writes the
    /// answer of every call it ran before it lets a connection go, and
    /// runs none once it starts leaving: this one came too late, on a
    /// connection it was letting go); otherwise perhaps run.
    async fn cut(&self, node: &str, why: &str) -> Forwarded {
        let code = ClusterErrorCode::OwnerUnreachable.into();
        match self.coordinator.left(node).await {
            Ok(true) => {
                tracing::info!(
                    node,
                    why,
                    "a call to a node that has left the cluster did not run there; it is handed on"
                );
                add(&self.counters.cut_not_run, 1);
                Forwarded::NotRun(code)
            }
            Ok(false) => {
                tracing::warn!(node, why, sent = true, "a call to another node failed");
                Forwarded::Failed(code)
            }
            Err(e) => {
                tracing::warn!(node, why, sent = true, error = %e, "a call to another node failed (whether its node left the cluster cannot be told)");
                Forwarded::Failed(code)
            }
        }
    }
}

/// Binds the internal listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_secret_itself_is_admitted() {
        let secret = Secret::new("0123456789abcdef");
        assert!(secret.admits(b"0123456789abcdef"));
        assert!(!secret.admits(b"0123456789abcdeF"));
        assert!(!secret.admits(b""));
        assert!(!secret.admits(b"0123456789abcdef0"));
    }
}
