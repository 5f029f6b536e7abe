//! A plain WebSocket echo server (tokio-tungstenite, no Wasm): the ceiling
//! of `bench/websockets.py`. Usage: ws-echo PORT

use futures::{SinkExt, StreamExt};
use tokio::net::TcpListener;

#[tokio::main]
async fn main() {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("usage: ws-echo PORT");
    let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("bind");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                return;
            };
            while let Some(Ok(m)) = ws.next().await {
                if (m.is_text() || m.is_binary()) && ws.send(m).await.is_err() {
                    return;
                }
            }
        });
    }
}
