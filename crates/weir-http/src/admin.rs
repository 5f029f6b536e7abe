//! The admin endpoints: `/healthz`, `/status` (JSON), `/metrics`
//! (Prometheus text), the operators' view of actors (`/actors…`), the
//! image store (`/images…`, in [`crate::admin_images`]), the resident
//! processes (`/processes…`, in [`crate::admin_processes`]) and the apps
//! and their deploys (`/apps…`, in [`crate::admin_apps`]). On a server of
//! several apps, `/actors` and `/processes` take `?app=NAME`.
//!
//! Invariants owned here: the admin listener is separate from the app's, so
//! an app at capacity can still be observed. `/healthz`, `/metrics` and
//! the health part of `/status` are open (monitoring reads them); the
//! rest of `/status` (owners, pids, images, nodes) and everything under
//! `/actors`, `/images`, `/processes` and `/apps` — actor names, key
//! dumps, deletion, images, processes, deploys — answers only a request that bears the
//! admin token (`Authorization: Bearer <token>`), and 401 otherwise, on a
//! connection then closed. A request whose `Host` is not an IP address or
//! `localhost` is refused (421) before anything else: a web page that
//! rebinds its own name to the admin address reads nothing. Connections
//! take places of [`ConnectionPlaces`]: only those that showed the token
//! keep one, so idle connections cannot crowd operators out.
//! `DELETE /actors/<class>/<name>` waits for the actor's turn like any
//! caller.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::net::TcpListener;
use weir_actors::operators::{LIST_PAGE, MAX_LIST_PAGE};
use weir_actors::{ActorAddress, ActorHost, AdminError};
use weir_programs::ImageStore;
use weir_programs::process_table::ProcessTable;
use weir_runtime::metrics::Metrics;

use crate::admin_apps::Deployer;
use crate::connection_places::{ConnectionPlaces, Place};
use crate::response_body::ServeBody;
use crate::routing::Router;

/// Admin connections that showed the token, at once: a dashboard, a CLI
/// and a few scrapers each need one, and every one is a file descriptor
/// the app listener and the actors' databases also need.
pub const MAX_ADMIN_CONNECTIONS: usize = 64;

/// Admin connections that have not shown the token (health checks,
/// scrapers that send none, and whatever else connects), at once: past
/// it, the oldest of them is closed for the newest.
pub const MAX_ADMIN_UNPROVEN: usize = 64;

/// How long a new admin connection has to send its first request: a
/// client sends it at once; a connection that sends nothing is closed.
pub const ADMIN_FIRST_REQUEST: std::time::Duration = std::time::Duration::from_secs(2);

/// How long an admin request's head may take to arrive, and an idle
/// keep-alive connection may wait for the next one.
pub const ADMIN_HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the admin endpoints look at.
pub struct AdminState {
    /// The apps served now.
    pub router: Arc<Router>,
    pub metrics: Arc<Metrics>,
    /// Each app's actors and resident processes, in name order.
    pub tenants: Vec<Tenant>,
    /// The data dir's image store.
    pub images: Option<Arc<ImageStore>>,
    /// Compiles a pushed image for the programs that may run it, before
    /// the push is answered (blocking; run off the runtime's threads).
    pub prepare_image: Option<PrepareImage>,
    /// Cluster mode: the images the nodes share; `/images` pushes to,
    /// lists, removes from and sweeps by them as well.
    pub image_mirror: Option<Arc<weir_programs::shared_images::ImageMirror>>,
    /// What `/apps/<name>/deploy` and `/rollback` call.
    pub deployer: Option<Arc<dyn Deployer>>,
    /// The bearer token `/actors`, `/images`, `/processes` and `/apps`
    /// require.
    pub token: String,
    /// More of `/status`, by name, from the layers this crate does not
    /// know (the cluster).
    pub sections: Vec<(&'static str, StatusSection)>,
}

/// See [`AdminState::prepare_image`].
pub type PrepareImage = weir_programs::shared_images::PrepareImage;

/// One named part of `/status`, read when it is asked for.
pub type StatusSection = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// What one app holds besides its versions: its actor host and its
/// resident processes.
pub struct Tenant {
    pub app: String,
    pub actors: Option<Arc<ActorHost>>,
    pub processes: Option<Arc<ProcessTable>>,
}

impl AdminState {
    /// The tenant a request names with `?app=`, or the one app that has
    /// `what` when it names none; else the refusal to answer.
    fn tenant<'a, T>(
        &'a self,
        req: &Request<Incoming>,
        what: &str,
        has: impl Fn(&'a Tenant) -> Option<&'a T>,
    ) -> Result<&'a T, (StatusCode, &'static str, String)> {
        if let Some(name) = query(req, "app") {
            let Some(tenant) = self.tenants.iter().find(|t| t.app == name) else {
                return Err((
                    StatusCode::NOT_FOUND,
                    "app_unknown",
                    format!("no app `{name}` is served"),
                ));
            };
            return has(tenant).ok_or_else(|| {
                (
                    StatusCode::NOT_FOUND,
                    "not_found",
                    format!("app `{name}` has no {what}"),
                )
            });
        }
        let mut with: Vec<&T> = self.tenants.iter().filter_map(&has).collect();
        match with.len() {
            0 => Err((
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no app has {what}"),
            )),
            1 => Ok(with.remove(0)),
            _ => Err((
                StatusCode::BAD_REQUEST,
                "app_required",
                format!("several apps have {what}: name one with ?app=NAME"),
            )),
        }
    }
}

/// True when the request bears the admin token. The comparison takes the
/// same time wherever the first difference is.
fn authorized(req: &Request<Incoming>, token: &str) -> bool {
    let Some(given) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (given.trim().as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serves the admin endpoints on `listener` until the process ends.
pub async fn serve_admin(listener: TcpListener, state: Arc<AdminState>) {
    let places = ConnectionPlaces::new(
        MAX_ADMIN_CONNECTIONS,
        MAX_ADMIN_UNPROVEN,
        ADMIN_FIRST_REQUEST,
    );
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(ADMIN_HEAD_TIMEOUT);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let state = state.clone();
        let place = places.take();
        let connection_place = place.clone();
        let service = service_fn(move |req| {
            let state = state.clone();
            let place = place.clone();
            async move { Ok::<_, Infallible>(admitted(&state, &place, req).await) }
        });
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            tokio::select! {
                _ = connection => {}
                _ = connection_place.ended() => {}
            }
        });
    }
}

/// A request on a connection that holds `place`: refused if its `Host`
/// could be a web page's, and its connection given a place of its own
/// once it shows the token.
async fn admitted(
    state: &AdminState,
    place: &Place,
    req: Request<Incoming>,
) -> Response<ServeBody> {
    place.spoke();
    if let Some(refused) = foreign_host(&req) {
        return refused;
    }
    if authorized(&req, &state.token) && !place.earn() {
        let mut refused = error(
            StatusCode::SERVICE_UNAVAILABLE,
            "connection_limit_exceeded",
            &format!(
                "{MAX_ADMIN_CONNECTIONS} admin connections with the token are open; close one"
            ),
        );
        refused
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return refused;
    }
    route(state, req).await
}

/// Refuses a request whose `Host` names something other than an IP
/// address or `localhost`: the admin listener has no name of its own, so
/// any other name is a page that rebound its name to this address.
fn foreign_host(req: &Request<Incoming>) -> Option<Response<ServeBody>> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if host_is_ours(host) {
        return None;
    }
    let mut refused = error(
        StatusCode::MISDIRECTED_REQUEST,
        "admin_host_refused",
        "the admin address answers requests whose Host is an IP address or localhost",
    );
    refused
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    Some(refused)
}

/// True for an IP address or `localhost`, with or without a port.
fn host_is_ours(host: &str) -> bool {
    if host.parse::<std::net::SocketAddr>().is_ok() || host.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.parse::<u16>().is_ok() => name,
        _ => host,
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .is_some_and(|n| n.parse::<std::net::Ipv6Addr>().is_ok())
}

pub(crate) fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: String,
) -> Response<ServeBody> {
    let mut response = Response::new(ServeBody::full(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// The `/status` document.
pub fn status_json(state: &AdminState) -> serde_json::Value {
    let served = state.router.table().apps();
    let apps: Vec<_> = served
        .iter()
        .map(|served| {
            let app = &served.app;
            let counts = app.metrics.counts();
            let stores = |list: Vec<weir_store::StoreInfo>| -> Vec<serde_json::Value> {
                list.into_iter()
                    .map(|s| json!({ "name": s.name, "synchronous": s.synchronous }))
                    .collect()
            };
            json!({
                "name": &*app.name,
                "healthy": app.healthy(),
                "queue_depth": app.admission.queue_depth(),
                "generations": {
                    "created": counts.created.load(Ordering::Relaxed),
                    "retired": counts.retired.load(Ordering::Relaxed),
                    "abandoned": counts.abandoned.load(Ordering::Relaxed),
                    "instantiation_failed": counts.instantiation_failed.load(Ordering::Relaxed),
                },
                "retirement": app.retirement.status(),
                "lanes": app.board.snapshot(),
                "stores": {
                    "kv": stores(app.code.kv.describe()),
                    "sql": stores(app.code.sql.describe()),
                },
            })
        })
        .collect();
    let mut status = json!({ "apps": apps });
    // The async runtime's worker threads, which run the guests' code: one
    // per core unless the operator's TOKIO_WORKER_THREADS says otherwise.
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        status["worker_threads"] = runtime.metrics().num_workers().into();
    }
    for (name, section) in &state.sections {
        status[*name] = section();
    }
    // Per app, and at the top when one app has them (a single-app server).
    let actors = |host: &ActorHost| {
        let status = host.status();
        json!({
            "unreadable": status.unreadable,
            "timer_pass": status.timer_pass,
            "pending_timers": status.pending_timers,
        })
    };
    let processes = |table: &ProcessTable| {
        let (live, slots) = table.counts();
        json!({ "live": live, "slots": slots, "holders": table.ledger() })
    };
    let mut tenants = serde_json::Map::new();
    for tenant in &state.tenants {
        let mut entry = serde_json::Map::new();
        if let Some(host) = &tenant.actors {
            entry.insert("actors".into(), actors(host));
        }
        if let Some(table) = &tenant.processes {
            entry.insert("processes".into(), processes(table));
        }
        tenants.insert(tenant.app.clone(), entry.into());
    }
    let with_actors: Vec<_> = state
        .tenants
        .iter()
        .filter_map(|t| t.actors.as_ref())
        .collect();
    if let [host] = with_actors.as_slice() {
        status["actors"] = actors(host);
    }
    let with_processes: Vec<_> = state
        .tenants
        .iter()
        .filter_map(|t| t.processes.as_ref())
        .collect();
    if let [table] = with_processes.as_slice() {
        status["processes"] = processes(table);
    }
    status["tenants"] = tenants.into();
    status
}

/// Why an admin request's body was not read whole.
pub(crate) enum BodyRefused {
    /// It is longer than the endpoint takes.
    TooLarge,
    /// The client broke off or sent a malformed body.
    Broken(Response<ServeBody>),
}

/// An admin request's body, read up to `limit` bytes and no further: a
/// longer one is refused without being held whole.
pub(crate) async fn read_limited(body: Incoming, limit: usize) -> Result<Bytes, BodyRefused> {
    use http_body_util::{BodyExt, Limited};
    match Limited::new(body, limit).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(BodyRefused::TooLarge)
        }
        Err(e) => Err(BodyRefused::Broken(error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            &e.to_string(),
        ))),
    }
}

pub(crate) fn json_response<T: serde::Serialize>(value: &T) -> Response<ServeBody> {
    match serde_json::to_string(value) {
        Ok(body) => respond(StatusCode::OK, "application/json", body),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            &e.to_string(),
        ),
    }
}

pub(crate) fn error(status: StatusCode, code: &str, message: &str) -> Response<ServeBody> {
    respond(
        status,
        "application/json",
        json!({ "error": code, "message": message }).to_string(),
    )
}

fn admin_error(e: AdminError) -> Response<ServeBody> {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error(status, e.code(), &e.to_string())
}

/// The first value of the query parameter `name`, decoded as browsers
/// and `curl` encode it (`%2F`, `+` for a space).
pub(crate) fn query(req: &Request<Incoming>, name: &str) -> Option<String> {
    form_urlencoded::parse(req.uri().query()?.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// The page of a listing a request asks for: `after` (a name in a
/// class's listing, `CLASS/NAME` in the listing of every class) and
/// `limit` (1 to [`MAX_LIST_PAGE`], else [`LIST_PAGE`]).
fn page_asked(
    req: &Request<Incoming>,
    class: Option<&str>,
) -> Result<(Option<ActorAddress>, usize), Box<Response<ServeBody>>> {
    let limit = match query(req, "limit") {
        None => LIST_PAGE,
        Some(n) => match n.parse::<usize>() {
            Ok(n) if (1..=MAX_LIST_PAGE).contains(&n) => n,
            _ => {
                return Err(Box::new(error(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    &format!("limit is a number of actors from 1 to {MAX_LIST_PAGE}"),
                )));
            }
        },
    };
    let Some(after) = query(req, "after") else {
        return Ok((None, limit));
    };
    let address = match class {
        Some(class) => ActorAddress::new(class, &after),
        None => match after.split_once('/') {
            Some((class, name)) => ActorAddress::new(class, name),
            None => {
                return Err(Box::new(error(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "after is CLASS/NAME, the `next` of the page before",
                )));
            }
        },
    };
    match address {
        Ok(address) => Ok((Some(address), limit)),
        Err(e) => Err(Box::new(admin_error(e.into()))),
    }
}

/// `/actors`, `/actors/<class>`, `/actors/<class>/<name>`.
async fn actors_route(
    host: &ActorHost,
    req: &Request<Incoming>,
    rest: &str,
) -> Response<ServeBody> {
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    match (req.method(), parts.as_slice()) {
        (&Method::GET, []) => {
            let (after, limit) = match page_asked(req, None) {
                Ok(asked) => asked,
                Err(refused) => return *refused,
            };
            match host.list(None, after.as_ref(), limit).await {
                Ok(page) => {
                    let next = page.next.map(|a| format!("{}/{}", a.class, a.name));
                    json_response(
                        &json!({ "status": host.status(), "actors": page.actors, "next": next }),
                    )
                }
                Err(e) => admin_error(e),
            }
        }
        (&Method::GET, [class]) => {
            let (after, limit) = match page_asked(req, Some(class)) {
                Ok(asked) => asked,
                Err(refused) => return *refused,
            };
            match host.list(Some(class), after.as_ref(), limit).await {
                Ok(page) => {
                    let next = page.next.map(|a| a.name);
                    json_response(&json!({ "actors": page.actors, "next": next }))
                }
                Err(e) => admin_error(e),
            }
        }
        (&Method::GET, [class, name]) => {
            let keys = query(req, "keys").is_some_and(|v| v != "0" && v != "false");
            let start = query(req, "start");
            match host.inspect(class, name, keys, start).await {
                Ok(detail) => json_response(&detail),
                Err(e) => admin_error(e),
            }
        }
        (&Method::DELETE, [class, name]) => match host.delete(class, name).await {
            Ok(existed) => json_response(&json!({ "deleted": existed })),
            Err(e) => admin_error(e),
        },
        (&Method::GET | &Method::DELETE, _) => {
            error(StatusCode::NOT_FOUND, "not_found", "no such actor path")
        }
        _ => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "actors are read with GET and deleted with DELETE",
        ),
    }
}

/// The rest of `path` after `prefix`, when `path` is `prefix` or under it.
fn under<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    path.strip_prefix(prefix)
        .filter(|r| r.is_empty() || r.starts_with('/'))
}

async fn route(state: &AdminState, req: Request<Incoming>) -> Response<ServeBody> {
    let path = req.uri().path().to_string();
    let guarded = ["/actors", "/images", "/processes", "/apps"]
        .iter()
        .any(|prefix| under(&path, prefix).is_some());
    if guarded && !authorized(&req, &state.token) {
        let mut response = error(
            StatusCode::UNAUTHORIZED,
            "admin_token_required",
            "send the server's admin token (data dir `admin-token`) as `Authorization: Bearer <token>`",
        );
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        // A connection that guesses is not kept.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    if let Some(rest) = under(&path, "/apps") {
        return match &state.deployer {
            Some(deployer) => crate::admin_apps::route(deployer.as_ref(), req, rest).await,
            None => error(
                StatusCode::NOT_FOUND,
                "not_found",
                "this server does not deploy",
            ),
        };
    }
    if let Some(rest) = under(&path, "/processes") {
        return match state.tenant(&req, "process table", |t| t.processes.as_ref()) {
            Ok(table) => crate::admin_processes::route(table, req, rest).await,
            Err((status, code, message)) => error(status, code, &message),
        };
    }
    if let Some(rest) = under(&path, "/images") {
        return match &state.images {
            Some(store) => {
                let doors = crate::admin_images::Doors {
                    prepare: state.prepare_image.as_ref(),
                    mirror: state.image_mirror.as_deref(),
                };
                crate::admin_images::route(store, doors, req, rest).await
            }
            None => error(StatusCode::NOT_FOUND, "not_found", "no image store"),
        };
    }
    if let Some(rest) = under(&path, "/actors") {
        return match state.tenant(&req, "actor classes", |t| t.actors.as_ref()) {
            Ok(host) => actors_route(host, &req, rest).await,
            Err((status, code, message)) => error(status, code, &message),
        };
    }
    if req.method() != Method::GET {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "application/json",
            "{\"error\":\"method_not_allowed\"}".into(),
        );
    }
    match req.uri().path() {
        "/healthz" => {
            if state.router.table().apps().iter().all(|s| s.app.healthy()) {
                respond(StatusCode::OK, "text/plain", "ok\n".into())
            } else {
                respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "unavailable lanes\n".into(),
                )
            }
        }
        // Without the token, health only: the rest names owners, pids,
        // images and nodes.
        "/status" if authorized(&req, &state.token) => respond(
            StatusCode::OK,
            "application/json",
            status_json(state).to_string(),
        ),
        "/status" => respond(
            StatusCode::OK,
            "application/json",
            json!({
                "healthy": state.router.table().apps().iter().all(|s| s.app.healthy()),
                "full": "send the admin token for the whole status",
            })
            .to_string(),
        ),
        "/metrics" => respond(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            state.metrics.encode(),
        ),
        _ => respond(
            StatusCode::NOT_FOUND,
            "application/json",
            "{\"error\":\"not_found\"}".into(),
        ),
    }
}
