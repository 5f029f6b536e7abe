//! A plain WebSocket echo server (tokio-tungstenite, no Wasm): the ceiling
//! of `bench/websockets.py`. Usage: ws-echo PORT

use futures::{SinkExt, StreamExt};

#[tokio::main]
async fn main() {
    ws_echo::serve_each("ws-echo PORT", |stream| async move {
        let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
            return;
        };
        while let Some(Ok(m)) = ws.next().await {
            if (m.is_text() || m.is_binary()) && ws.send(m).await.is_err() {
                return;
            }
        }
    })
    .await;
}
