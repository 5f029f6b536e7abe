//! The server's apps through the admin address: `GET /apps` (each app's
//! version, routes, lanes, queue and generations), `POST
//! /apps/<name>/deploy` (the body is the new component; `?class=C` deploys
//! actor class `C` instead of the worker; `?label=L` names the version)
//! and `POST /apps/<name>/rollback`. The admin token is checked before any
//! of these is reached ([`crate::admin`]).
//!
//! Invariant owned here: a deploy's component is read up to
//! [`MAX_DEPLOY_COMPONENT_BYTES`] and no further — a longer body is
//! refused (413 `component_too_large`) without being held whole — and
//! everything else about a deploy is the [`Deployer`]'s.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::admin::{BodyRefused, error, json_response, query, read_limited};
use crate::response_body::ServeBody;

/// The largest component a deploy accepts. Components built from Rust,
/// Python or JavaScript toolchains run from hundreds of KiB to a few tens
/// of MiB; this leaves room for the largest without letting a client make
/// the admin endpoint hold an unbounded body.
pub const MAX_DEPLOY_COMPONENT_BYTES: usize = 256 << 20;

/// What one deploy asks for.
pub struct DeployRequest {
    pub app: String,
    /// An actor class of the app; the worker when `None`.
    pub class: Option<String>,
    pub component: Bytes,
    /// A version label given by the operator; the component's sha256
    /// otherwise.
    pub label: Option<String>,
}

/// Why a deploy (or rollback) changed nothing.
#[derive(Debug)]
pub struct DeployRefusal {
    pub status: StatusCode,
    /// A stable code: `app_unknown`, `class_unknown`, `component_refused`,
    /// `no_previous_version`, `config_refused`.
    pub code: &'static str,
    pub message: String,
}

/// What installs new code: the server's composition root implements it.
#[async_trait::async_trait]
pub trait Deployer: Send + Sync {
    /// Installs a component as the app's (or class's) next version; on
    /// success, what is served now (JSON).
    async fn deploy(&self, request: DeployRequest) -> Result<serde_json::Value, DeployRefusal>;
    /// Returns the app to its previous version.
    async fn rollback(&self, app: &str) -> Result<serde_json::Value, DeployRefusal>;
    /// The `/apps` document.
    fn apps(&self) -> serde_json::Value;
}

fn refused(refusal: DeployRefusal) -> Response<ServeBody> {
    error(refusal.status, refusal.code, &refusal.message)
}

/// Serves `/apps…`; `rest` is the path after `/apps`.
pub async fn route(
    deployer: &dyn Deployer,
    req: Request<Incoming>,
    rest: &str,
) -> Response<ServeBody> {
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    match (req.method().clone(), parts.as_slice()) {
        (Method::GET, []) => json_response(&deployer.apps()),
        (Method::POST, [app, "deploy"]) => {
            let class = query(&req, "class");
            let label = query(&req, "label");
            let component = match read_limited(req.into_body(), MAX_DEPLOY_COMPONENT_BYTES).await {
                Ok(body) => body,
                Err(BodyRefused::TooLarge) => {
                    return error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "component_too_large",
                        &format!(
                            "a deployed component is at most {MAX_DEPLOY_COMPONENT_BYTES} bytes"
                        ),
                    );
                }
                Err(BodyRefused::Broken(response)) => return response,
            };
            let request = DeployRequest {
                app: app.to_string(),
                class,
                component,
                label,
            };
            match deployer.deploy(request).await {
                Ok(done) => json_response(&done),
                Err(refusal) => refused(refusal),
            }
        }
        (Method::POST, [app, "rollback"]) => match deployer.rollback(app).await {
            Ok(done) => json_response(&done),
            Err(refusal) => refused(refusal),
        },
        (Method::GET | Method::POST, _) => {
            error(StatusCode::NOT_FOUND, "not_found", "no such apps path")
        }
        _ => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "apps are listed with GET and deployed or rolled back with POST",
        ),
    }
}
