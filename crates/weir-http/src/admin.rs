//! The admin endpoints: `/healthz`, `/status` (JSON) and `/metrics`
//! (Prometheus text).
//!
//! Invariant owned here: the admin listener is separate from the app's, so
//! an app at capacity can still be observed, and it only reads state.

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
use weir_runtime::App;
use weir_runtime::metrics::Metrics;

use crate::response_body::ServeBody;

/// What the admin endpoints look at.
pub struct AdminState {
    pub apps: Vec<Arc<App>>,
    pub metrics: Arc<Metrics>,
}

/// Serves the admin endpoints on `listener` until the process ends.
pub async fn serve_admin(listener: TcpListener, state: Arc<AdminState>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(route(&state, req)) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<ServeBody> {
    let mut response = Response::new(ServeBody::full(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The `/status` document.
pub fn status_json(state: &AdminState) -> serde_json::Value {
    let apps: Vec<_> = state
        .apps
        .iter()
        .map(|app| {
            let counts = app.metrics.counts();
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
                "lanes": app.board.snapshot(),
            })
        })
        .collect();
    json!({ "apps": apps })
}

fn route(state: &AdminState, req: Request<Incoming>) -> Response<ServeBody> {
    if req.method() != Method::GET {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "application/json",
            "{\"error\":\"method_not_allowed\"}".into(),
        );
    }
    match req.uri().path() {
        "/healthz" => {
            if state.apps.iter().all(|a| a.healthy()) {
                respond(StatusCode::OK, "text/plain", "ok\n".into())
            } else {
                respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "unavailable lanes\n".into(),
                )
            }
        }
        "/status" => respond(
            StatusCode::OK,
            "application/json",
            status_json(state).to_string(),
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
