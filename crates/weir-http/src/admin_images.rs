//! The image store through the admin address: `PUT /images` (the body is
//! the component), `GET /images`, `DELETE /images/<digest>`, and
//! `POST /images/sweep`. The admin token is checked before any of these
//! is reached ([`crate::admin`]).
//!
//! Invariant owned here: a push is read up to `max_image_bytes` and no
//! further — a longer body is refused (413 `image_too_large`) without being
//! held whole in memory — and is stored by the store's own protocol.

use std::collections::HashSet;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use weir_programs::{Digest, ImageError, ImageStore};
use weir_runtime::WeirError;

use crate::admin::{BodyRefused, PrepareImage, error, json_response, read_limited};
use crate::response_body::ServeBody;

fn image_error(e: ImageError) -> Response<ServeBody> {
    let code = e.code();
    let status = StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error(status, code.as_str(), &e.to_string())
}

/// Serves `/images…`; `rest` is the path after `/images`.
pub async fn route(
    store: &ImageStore,
    prepare: Option<&PrepareImage>,
    req: Request<Incoming>,
    rest: &str,
) -> Response<ServeBody> {
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    match (req.method().clone(), parts.as_slice()) {
        (Method::GET, []) => match store.list() {
            Ok(images) => json_response(&json!({ "images": images })),
            Err(e) => image_error(e),
        },
        (Method::PUT, []) => {
            let limit = store.max_image_bytes();
            let body = match read_limited(req.into_body(), limit as usize).await {
                Ok(body) => body,
                Err(BodyRefused::TooLarge) => {
                    return image_error(ImageError::TooLarge {
                        bytes: limit + 1,
                        limit,
                    });
                }
                Err(BodyRefused::Broken(response)) => return response,
            };
            push(store, prepare, &body).await
        }
        (Method::DELETE, [digest]) => match digest.parse::<Digest>() {
            Ok(digest) => match store.remove(&digest) {
                Ok(existed) => json_response(&json!({ "digest": digest, "deleted": existed })),
                Err(e) => image_error(e),
            },
            Err(e) => image_error(e),
        },
        (Method::POST, ["sweep"]) => match store.sweep(&HashSet::new()) {
            Ok(report) => json_response(&report),
            Err(e) => image_error(e),
        },
        (Method::GET | Method::PUT | Method::DELETE | Method::POST, _) => {
            error(StatusCode::NOT_FOUND, "not_found", "no such image path")
        }
        _ => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "images are pushed with PUT, listed with GET, removed with DELETE and swept with POST /images/sweep",
        ),
    }
}

/// Stores the image, then compiles it for the programs that may run it
/// (a push answers once the image is ready to spawn: compiling a large
/// image inside the first spawning turn would run into that turn's
/// deadline). Bytes that do not compile are still stored, as pushed; the
/// answer says why they will not run.
async fn push(
    store: &ImageStore,
    prepare: Option<&PrepareImage>,
    bytes: &Bytes,
) -> Response<ServeBody> {
    match store.push(bytes) {
        Ok((root, stored)) => {
            let digest = root.digest();
            let mut body = json!({
                "digest": digest,
                "bytes": bytes.len(),
                "stored": stored,
            });
            if let Some(prepare) = prepare {
                let prepare = prepare.clone();
                let compiled = tokio::task::spawn_blocking(move || prepare(&digest))
                    .await
                    .unwrap_or_else(|e| Err(format!("compiling the image failed: {e}")));
                body["compiled"] = json!(compiled.is_ok());
                if let Err(why) = compiled {
                    body["compile_error"] = json!(why);
                }
            }
            drop(root);
            let mut response = json_response(&body);
            if stored {
                *response.status_mut() = StatusCode::CREATED;
            }
            response
        }
        Err(e) => image_error(e),
    }
}
