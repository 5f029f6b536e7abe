//! Servers of several apps, from outside: their `weir.toml`, deploys
//! through the admin address, and a keep-alive load that records every
//! answer.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use super::{Resp, Weir, send_to};

pub const V1: &str = "hello from weir\n";
pub const V2: &str = "hello from weir, next version\n";

/// A `weir.toml` in a directory of its own; returns its path.
pub fn config_file(name: &str, text: &str) -> PathBuf {
    let dir = weir_scratch::dir(&format!("apps-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("weir.toml");
    std::fs::write(&file, text).unwrap();
    file
}

pub fn toml_path(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

/// `[apps.NAME]` of `component` at `routes`, with `extra` lines.
pub fn app_section(name: &str, component: &Path, routes: &[&str], extra: &str) -> String {
    let routes: Vec<String> = routes.iter().map(|r| format!("{r:?}")).collect();
    format!(
        "[apps.{name}]\ncomponent = {}\nroutes = [{}]\n{extra}\n",
        toml_path(component),
        routes.join(", ")
    )
}

pub async fn get_with_host(weir: &Weir, host: &str, path: &str) -> Resp {
    weir.send(
        Request::get(path)
            .header("host", host)
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await
}

/// A deploy through the admin address: `query` like `?label=v2`.
pub async fn deploy(weir: &Weir, app: &str, component: &[u8], query: &str) -> Resp {
    let admin = weir.admin.expect("admin listener");
    let req = Request::post(format!("/apps/{app}/deploy{query}"))
        .header("host", admin.to_string())
        .header(
            "authorization",
            format!("Bearer {}", weir.token.as_ref().unwrap()),
        )
        .body(Full::new(Bytes::copy_from_slice(component)))
        .unwrap();
    send_to(admin, req).await
}

/// A rollback of `app` through the admin address.
pub async fn rollback(weir: &Weir, app: &str) -> Resp {
    let admin = weir.admin.expect("admin listener");
    let req = Request::post(format!("/apps/{app}/rollback"))
        .header("host", admin.to_string())
        .header(
            "authorization",
            format!("Bearer {}", weir.token.as_ref().unwrap()),
        )
        .body(Full::new(Bytes::new()))
        .unwrap();
    send_to(admin, req).await
}

/// Every answer's status and body, and every transport error.
pub type Seen = (Vec<(u16, String)>, Vec<String>);

/// Requests on `connections` keep-alive connections until `stop`.
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Seen>>,
}

impl Load {
    pub fn start(addr: std::net::SocketAddr, connections: usize, path: &'static str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..connections)
            .map(|_| {
                let stop = stop.clone();
                tokio::spawn(async move {
                    let (mut answers, mut errors) = (Vec::new(), Vec::new());
                    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                    let (mut sender, conn) =
                        hyper::client::conn::http1::handshake(TokioIo::new(stream))
                            .await
                            .unwrap();
                    tokio::spawn(conn);
                    while !stop.load(Ordering::Relaxed) {
                        let req = Request::get(path)
                            .header("host", "load.test")
                            .body(Full::new(Bytes::new()))
                            .unwrap();
                        match sender.send_request(req).await {
                            Ok(response) => {
                                let status = response.status().as_u16();
                                match response.into_body().collect().await {
                                    Ok(body) => answers.push((
                                        status,
                                        String::from_utf8_lossy(&body.to_bytes()).into_owned(),
                                    )),
                                    Err(e) => errors.push(format!("body: {e}")),
                                }
                            }
                            Err(e) => {
                                errors.push(format!("request: {e}"));
                                break;
                            }
                        }
                    }
                    (answers, errors)
                })
            })
            .collect();
        Load { stop, tasks }
    }

    pub async fn finish(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        let (mut answers, mut errors) = (Vec::new(), Vec::new());
        for task in self.tasks {
            let (a, e) = task.await.unwrap();
            answers.extend(a);
            errors.extend(e);
        }
        (answers, errors)
    }
}
