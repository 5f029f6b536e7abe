//! A plain WebSocket echo server on `fastwebsockets` (over hyper's
//! upgrade, no Wasm): a second ceiling for `bench/websockets.py`, to show
//! what the framing crate alone is worth against `ws-echo`'s
//! tokio-tungstenite. Usage: ws-echo-fast PORT

use fastwebsockets::{FragmentCollector, OpCode, WebSocketError, upgrade};
use http_body_util::Empty;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// Sends every text or binary message back as it came; pings and the
/// close handshake are the crate's own.
async fn echo(socket: upgrade::UpgradeFut) -> Result<(), WebSocketError> {
    let mut socket = FragmentCollector::new(socket.await?);
    loop {
        let message = socket.read_frame().await?;
        match message.opcode {
            OpCode::Text | OpCode::Binary => socket.write_frame(message).await?,
            OpCode::Close => return Ok(()),
            _ => {}
        }
    }
}

async fn accept(mut request: Request<Incoming>) -> Result<Response<Empty<Bytes>>, WebSocketError> {
    let (response, socket) = upgrade::upgrade(&mut request)?;
    tokio::spawn(async move {
        let _ = echo(socket).await;
    });
    Ok(response)
}

#[tokio::main]
async fn main() {
    ws_echo::serve_each("ws-echo-fast PORT", |stream| async move {
        let _ = http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service_fn(accept))
            .with_upgrades()
            .await;
    })
    .await;
}
