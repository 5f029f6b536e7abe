//! The load generator of `bench/websockets.py`: opens SOCKETS WebSockets to
//! URL, and on each sends a SIZE-byte text message and waits for its echo,
//! in a loop, for SECONDS. Prints one JSON line: messages per second (round
//! trips), and the p50 and p99 round-trip latency in microseconds.
//!
//! With RATE (messages per second over all sockets) the load is paced
//! instead (open loop): each socket sends on a fixed schedule, RATE /
//! SOCKETS messages a second, whether or not its earlier echoes are back.
//! A round trip is timed from when its message went out, or from when it
//! was due if the send before it was held up by the server (its socket's
//! buffer full): a server that falls behind is charged for the whole wait,
//! as a client of it would be (no coordinated omission), while the
//! client's own timer lateness (tokio's timers fire up to a millisecond
//! late) is not. This is latency at a given load; the closed loop gives
//! the most a server answers, and its latency is mostly the queue that the
//! loop itself fills.
//!
//! With SIZE 0 the sockets are only held open, idle, for SECONDS (for
//! memory per idle socket); it prints `{"held":N}` once all are open, and
//! then, once every socket has ended or SECONDS have passed, how each
//! ended: `{"ended":{"1001":N,"dropped":M,"open":K}}` (a close frame's
//! code, answered as a browser does; `dropped` for a connection that
//! ended without one).
//!
//! Usage: `ws-load URL SOCKETS SECONDS SIZE [RATE]`

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// What one socket's run measured: round trips in microseconds, and
/// whether it failed.
type Run = (Vec<u64>, u64);

/// How long a paced run waits, after its last message was due, for the
/// echoes still on their way: a message not back by then counts as an
/// error, not as a latency.
const PACED_DRAIN: Duration = Duration::from_secs(5);

/// Holds an idle socket until it ends or `deadline` passes: its close
/// code (answered), `dropped`, or `open`.
async fn idle_until_ended(mut ws: Socket, deadline: tokio::time::Instant) -> String {
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => return "open".into(),
            Ok(None) | Ok(Some(Err(_))) => return "dropped".into(),
            Ok(Some(Ok(Message::Close(frame)))) => {
                // Reading on sends the close's answer, as a browser does.
                let _ = tokio::time::timeout(Duration::from_secs(5), async {
                    while let Some(Ok(_)) = ws.next().await {}
                })
                .await;
                return frame.map_or("1005".into(), |f| u16::from(f.code).to_string());
            }
            Ok(Some(Ok(_))) => continue,
        }
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (url, sockets, seconds, size, rate) = match args.as_slice() {
        [_, url, sockets, seconds, size] => (url, sockets, seconds, size, None),
        [_, url, sockets, seconds, size, rate] => (url, sockets, seconds, size, Some(rate)),
        _ => panic!("usage: ws-load URL SOCKETS SECONDS SIZE [RATE]"),
    };
    let sockets: usize = sockets.parse().expect("SOCKETS");
    let seconds: f64 = seconds.parse().expect("SECONDS");
    let size: usize = size.parse().expect("SIZE");
    let rate: Option<f64> = rate.map(|r| r.parse().expect("RATE"));
    let payload = "x".repeat(size);
    let mut clients = Vec::new();
    for _ in 0..sockets {
        // No Nagle: paced messages may be in flight two at a time, and
        // the second would wait for the first's delayed ACK (up to 40 ms).
        let (ws, _) = tokio_tungstenite::connect_async_with_config(url.as_str(), None, true)
            .await
            .expect("connects");
        clients.push(ws);
    }
    if size == 0 {
        println!("{{\"held\":{}}}", clients.len());
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(seconds);
        let ends: Vec<_> = clients
            .into_iter()
            .map(|ws| tokio::spawn(idle_until_ended(ws, deadline)))
            .collect();
        let mut ended = std::collections::BTreeMap::<String, u64>::new();
        for end in ends {
            *ended
                .entry(end.await.expect("a socket's task"))
                .or_default() += 1;
        }
        let ended: Vec<String> = ended
            .iter()
            .map(|(how, n)| format!("\"{how}\":{n}"))
            .collect();
        println!("{{\"ended\":{{{}}}}}", ended.join(","));
        return;
    }
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, ws)| {
            let payload = payload.clone();
            match rate {
                None => tokio::spawn(closed_loop(ws, payload, end)),
                Some(rate) => {
                    let interval = Duration::from_secs_f64(sockets as f64 / rate);
                    // Spread the sockets' schedules over one interval, so
                    // that they do not all send at once.
                    let first = start + interval.mul_f64(i as f64 / sockets as f64);
                    tokio::spawn(paced(ws, payload, first, interval, end))
                }
            }
        })
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (l, e) = task.await.expect("client task");
        all.extend(l);
        errors += e;
    }
    // Paced, the rate is what was echoed over the schedule's length;
    // closed, over the run's.
    let elapsed = match rate {
        Some(_) => seconds,
        None => start.elapsed().as_secs_f64(),
    };
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64) * p) as usize)
            .copied()
            .unwrap_or(0)
    };
    println!(
        "{{\"messages\":{},\"per_s\":{:.0},\"p50_us\":{},\"p99_us\":{},\"p999_us\":{},\"max_us\":{},\"errors\":{}}}",
        all.len(),
        all.len() as f64 / elapsed,
        pct(0.50),
        pct(0.99),
        pct(0.999),
        all.last().copied().unwrap_or(0),
        errors
    );
}

/// Send, wait for the echo, again, until `end`.
async fn closed_loop(mut ws: Socket, payload: String, end: Instant) -> Run {
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
}

/// Send one message every `interval` from `first` until `end`, and time
/// each echo as the module says.
async fn paced(
    ws: Socket,
    payload: String,
    first: Instant,
    interval: Duration,
    end: Instant,
) -> Run {
    let (mut sink, mut stream) = ws.split();
    // The due time of each message sent, in order: a WebSocket echoes in
    // order. Closed when the last one is sent.
    let (due_tx, mut due_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let expected = payload.len();
    let receiver = tokio::spawn(async move {
        let mut latencies = Vec::new();
        // Each echo is matched with its message's due time; once the
        // sender is done and every message it sent is echoed, the run is.
        while let Some(was_due) = due_rx.recv().await {
            match tokio::time::timeout(PACED_DRAIN, stream.next()).await {
                Ok(Some(Ok(Message::Text(t)))) if t.len() == expected => {
                    latencies.push(was_due.elapsed().as_micros() as u64);
                }
                // Unanswered past the drain, or a wrong answer: this one
                // and every one still due are errors.
                _ => {
                    due_rx.close();
                    let mut lost = 1;
                    while due_rx.recv().await.is_some() {
                        lost += 1;
                    }
                    return (latencies, lost, stream);
                }
            }
        }
        (latencies, 0, stream)
    });
    let mut errors = 0u64;
    let mut next = first;
    // When the previous send finished: a send that waited on the server
    // (its socket's buffer full) past the next message's due time makes
    // that message late on the server's account.
    let mut free = first;
    while next < end {
        tokio::time::sleep_until(next.into()).await;
        // The timer fires up to a millisecond late (tokio's resolution):
        // that lateness is the client's, and not charged to the server.
        let sent = if free > next { next } else { Instant::now() };
        if sink.send(Message::text(payload.clone())).await.is_err() {
            errors += 1;
            break;
        }
        free = Instant::now();
        let _ = due_tx.send(sent);
        next += interval;
    }
    drop(due_tx);
    let (latencies, lost, stream) = receiver.await.expect("receiver");
    if let Ok(mut ws) = sink.reunite(stream) {
        let _ = ws.close(None).await;
    }
    (latencies, errors + lost)
}
