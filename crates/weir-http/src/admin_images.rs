//! The image store through the admin address: `PUT /images` (the body is
//! the component), `GET /images`, `DELETE /images/<digest>`, and
//! `POST /images/sweep` (`?dry_run=1`: what it would remove, removing
//! nothing). The admin token is checked before any of these
//! is reached ([`crate::admin`]). In cluster mode each of them is about
//! the images the nodes share as well as this node's store
//! (`weir_programs::shared_images`).
//!
//! Invariants owned here: a push is read up to `max_image_bytes` and no
//! further — a longer body is refused (413 `image_too_large`) without being
//! held whole in memory — and is stored by the store's own protocol; in
//! cluster mode a push is answered as done only once the cluster shares
//! it (503 `images_unavailable` otherwise: pushing again is safe), and a
//! removal removes the cluster's copy only once this node's went.

use std::collections::HashSet;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use weir_programs::shared_images::{ImageMirror, Sharer};
use weir_programs::{Digest, ImageError, ImageStore};
use weir_runtime::WeirError;

use crate::admin::{BodyRefused, PrepareImage, error, json_response, read_limited};
use crate::response_body::ServeBody;

fn image_error(e: ImageError) -> Response<ServeBody> {
    let code = e.code();
    let status = StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error(status, code.as_str(), &e.to_string())
}

/// What the image routes reach besides the store.
#[derive(Clone, Copy)]
pub struct Doors<'a> {
    /// Compiles a pushed image for the programs that may run it.
    pub prepare: Option<&'a PrepareImage>,
    /// Cluster mode: the images the nodes share.
    pub mirror: Option<&'a ImageMirror>,
}

/// Serves `/images…`; `rest` is the path after `/images`.
pub async fn route(
    store: &ImageStore,
    doors: Doors<'_>,
    req: Request<Incoming>,
    rest: &str,
) -> Response<ServeBody> {
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    match (req.method().clone(), parts.as_slice()) {
        (Method::GET, []) => list(store, doors.mirror).await,
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
            push(store, doors, &body).await
        }
        (Method::DELETE, [digest]) => match digest.parse::<Digest>() {
            Ok(digest) => remove(store, doors.mirror, digest).await,
            Err(e) => image_error(e),
        },
        (Method::POST, ["sweep"]) => {
            let dry_run = req.uri().query().is_some_and(|q| {
                q.split('&')
                    .any(|p| p == "dry_run=1" || p == "dry_run=true")
            });
            let swept = match doors.mirror {
                // What the cluster still shares stays.
                Some(mirror) => mirror.sweep(store, dry_run).await,
                None => store.sweep(&HashSet::new(), dry_run),
            };
            match swept {
                Ok(report) => json_response(&report),
                Err(e) => image_error(e),
            }
        }
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
async fn push(store: &ImageStore, doors: Doors<'_>, bytes: &Bytes) -> Response<ServeBody> {
    match store.push(bytes) {
        Ok((root, stored)) => {
            let digest = root.digest();
            let mut body = json!({
                "digest": digest,
                "bytes": bytes.len(),
                "stored": stored,
            });
            // Shared while still rooted here: no sweep removes it first.
            if let Some(mirror) = doors.mirror {
                if let Err(e) = mirror.shared().publish(digest, bytes, Sharer::Push).await {
                    let why = match e {
                        ImageError::Unavailable(why) => why,
                        e => e.to_string(),
                    };
                    return image_error(ImageError::Unavailable(format!(
                        "{digest} could not be shared with the other nodes; push it again: {why}"
                    )));
                }
                body["shared"] = json!(true);
            }
            if let Some(prepare) = doors.prepare {
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

/// This node's images, and in cluster mode the shared ones.
async fn list(store: &ImageStore, mirror: Option<&ImageMirror>) -> Response<ServeBody> {
    let images = match store.list() {
        Ok(images) => images,
        Err(e) => return image_error(e),
    };
    let Some(mirror) = mirror else {
        return json_response(&json!({ "images": images }));
    };
    match mirror.shared().catalog().await {
        Ok(catalog) => {
            let shared: Vec<_> = catalog
                .shared
                .into_iter()
                .map(|(digest, bytes)| json!({ "digest": digest, "bytes": bytes }))
                .collect();
            json_response(&json!({ "images": images, "shared": shared }))
        }
        Err(e) => image_error(e),
    }
}

/// Removes an image from this node's store and, in cluster mode, from
/// the cluster (only once it went from here: an image a run or process
/// holds here stays shared, and the answer is 409 `image_in_use`). Other
/// nodes drop their copies when they next catch up.
async fn remove(
    store: &ImageStore,
    mirror: Option<&ImageMirror>,
    digest: Digest,
) -> Response<ServeBody> {
    let here = match store.remove(&digest) {
        Ok(existed) => existed,
        Err(e) => return image_error(e),
    };
    let Some(mirror) = mirror else {
        return json_response(&json!({ "digest": digest, "deleted": here }));
    };
    match mirror.shared().remove(digest).await {
        Ok(shared) => json_response(&json!({
            "digest": digest,
            "deleted": here || shared,
            "shared_deleted": shared,
        })),
        Err(e) => image_error(e),
    }
}
