//! WebSocket clients of a test: the client type and how it sees a close.

use std::time::Duration;

use futures::StreamExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// A client connected with `tokio_tungstenite::connect_async`.
pub type Client = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// The next close the client sees (data messages before it are skipped),
/// or the error the connection ended with; neither within 30 s fails the
/// test.
pub async fn close_of(ws: &mut Client) -> Result<(u16, String), String> {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
            // A close that must come: its absence fails the test, and is
            // never taken for a connection that ended without one.
            Err(_) => panic!("the socket neither closed nor ended within 30 s"),
            Ok(None) => return Err("ended without a close frame".into()),
            Ok(Some(Err(e))) => return Err(e.to_string()),
            Ok(Some(Ok(Message::Close(frame)))) => {
                let frame = frame.expect("a close with a code");
                // Reading on sends the client's reply, as a browser does.
                let _ = tokio::time::timeout(Duration::from_secs(5), async {
                    while let Some(Ok(_)) = ws.next().await {}
                })
                .await;
                return Ok((u16::from(frame.code), frame.reason.to_string()));
            }
            Ok(Some(Ok(_))) => continue,
        }
    }
}
