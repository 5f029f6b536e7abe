//! An upstream that holds requests until a test lets them go.

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::wait_for;

/// An upstream HTTP server on 127.0.0.1 that holds every request it reads
/// until it is released: by [`HoldServer::release`], or by the arrival of
/// its `barrier`-th request. Each request is answered `released`, or
/// `timeout` if nothing released it within 60 s. Tests use it to hold a
/// lane or an actor's turn open exactly as long as they need, instead of
/// guessing how long a sleep takes.
pub struct HoldServer {
    pub port: u16,
    state: Arc<(Mutex<HoldState>, std::sync::Condvar)>,
}

#[derive(Default)]
struct HoldState {
    arrived: usize,
    /// Requests held right now.
    held: usize,
    /// Most requests held at once.
    max_held: usize,
    released: bool,
}

impl HoldServer {
    pub fn start(barrier: Option<usize>) -> HoldServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new((Mutex::new(HoldState::default()), std::sync::Condvar::new()));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let state = shared.clone();
                std::thread::spawn(move || {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let (lock, wake) = &*state;
                    let mut s = lock.lock().unwrap();
                    s.arrived += 1;
                    s.held += 1;
                    s.max_held = s.max_held.max(s.held);
                    if barrier.is_some_and(|b| s.arrived >= b) {
                        s.released = true;
                    }
                    wake.notify_all();
                    let (mut s, timeout) = wake
                        .wait_timeout_while(s, Duration::from_secs(60), |s| !s.released)
                        .unwrap();
                    s.held -= 1;
                    drop(s);
                    let body = if timeout.timed_out() {
                        "timeout"
                    } else {
                        "released"
                    };
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                });
            }
        });
        HoldServer { port, state }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// Requests that have arrived so far.
    pub fn arrived(&self) -> usize {
        self.state.0.lock().unwrap().arrived
    }

    /// Most requests held at the same time so far.
    pub fn max_held(&self) -> usize {
        self.state.0.lock().unwrap().max_held
    }

    /// Waits until `n` requests have arrived.
    pub async fn wait_arrived(&self, n: usize) {
        wait_for(&format!("{n} requests at the hold server"), || async {
            let arrived = self.arrived();
            if arrived >= n {
                Ok(())
            } else {
                Err(format!("{arrived} arrived"))
            }
        })
        .await
    }

    /// Answers every held request, and every later one at once.
    pub fn release(&self) {
        self.state.0.lock().unwrap().released = true;
        self.state.1.notify_all();
    }
}
