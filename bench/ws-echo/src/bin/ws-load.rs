//! The load generator of `bench/websockets.py`: opens SOCKETS WebSockets to
//! URL, and on each sends a SIZE-byte text message and waits for its echo,
//! in a loop, for SECONDS. Prints one JSON line: messages per second (round
//! trips), and the p50 and p99 round-trip latency in microseconds.
//!
//! With SIZE 0 the sockets are only held open, idle, for SECONDS (for
//! memory per idle socket); it prints `{"held":N}` once all are open.
//!
//! Usage: ws-load URL SOCKETS SECONDS SIZE

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, sockets, seconds, size] = args.as_slice() else {
        panic!("usage: ws-load URL SOCKETS SECONDS SIZE");
    };
    let sockets: usize = sockets.parse().expect("SOCKETS");
    let seconds: f64 = seconds.parse().expect("SECONDS");
    let size: usize = size.parse().expect("SIZE");
    let payload = "x".repeat(size);
    let mut clients = Vec::new();
    for _ in 0..sockets {
        let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .expect("connects");
        clients.push(ws);
    }
    if size == 0 {
        println!("{{\"held\":{}}}", clients.len());
        use std::io::Write;
        let _ = std::io::stdout().flush();
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        return;
    }
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut ws| {
            let payload = payload.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = 0u64;
                while Instant::now() < end {
                    let sent = Instant::now();
                    if ws.send(Message::text(payload.clone())).await.is_err() {
                        errors += 1;
                        break;
                    }
                    match ws.next().await {
                        Some(Ok(Message::Text(t))) if t.len() == payload.len() => {
                            latencies.push(sent.elapsed().as_micros() as u64);
                        }
                        _ => {
                            errors += 1;
                            break;
                        }
                    }
                }
                let _ = ws.close(None).await;
                (latencies, errors)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (l, e) = task.await.expect("client task");
        all.extend(l);
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64) * p) as usize)
            .copied()
            .unwrap_or(0)
    };
    println!(
        "{{\"messages\":{},\"per_s\":{:.0},\"p50_us\":{},\"p99_us\":{},\"errors\":{}}}",
        all.len(),
        all.len() as f64 / elapsed,
        pct(0.50),
        pct(0.99),
        errors
    );
}
