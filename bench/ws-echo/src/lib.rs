//! What the two no-Wasm echo servers share: the port from the command
//! line, the listener on 127.0.0.1, and one task per accepted connection.

use std::future::Future;

use tokio::net::{TcpListener, TcpStream};

/// Listens on 127.0.0.1 at the port given as the first argument (`usage`
/// is printed without one) and runs `serve` on its own task for each
/// connection, with Nagle off as every server in the benchmark has it.
pub async fn serve_each<F, Fut>(usage: &str, serve: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("usage: {usage}"));
    let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("bind");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve(stream));
    }
}
