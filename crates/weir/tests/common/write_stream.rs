//! A stream of writes at a cluster, and the check that follows it: each
//! writer sends to any node that is up, records what was acknowledged,
//! and at the end every acknowledged write is read back through every
//! node, and the counter never answered one value twice (two owners
//! committing for one actor would each count from the same value).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use super::{Weir, try_send_to};

/// The addresses of the nodes that are up, shared with the writers.
pub type Live = std::sync::Arc<std::sync::Mutex<Vec<std::net::SocketAddr>>>;

/// What the writers saw.
#[derive(Default)]
pub struct Seen {
    /// Keys whose put was acknowledged (200), with the time of the ack.
    pub acked: Vec<(String, Instant)>,
    /// Values the counter answered (200).
    pub counted: Vec<u64>,
    /// Every non-200 answer's error code, and how many.
    pub refused: std::collections::BTreeMap<String, usize>,
    /// Requests that got no HTTP answer (a node killed under them).
    pub cut: usize,
}

/// One request to a random live node: the response, or `None` when the
/// connection was cut or no node is up.
pub async fn to_any(live: &Live, seed: u64, request: Request<Full<Bytes>>) -> Option<super::Resp> {
    let addr = {
        let live = live.lock().unwrap();
        if live.is_empty() {
            return None;
        }
        live[(seed % live.len() as u64) as usize]
    };
    let (mut parts, body) = request.into_parts();
    parts
        .headers
        .insert("host", addr.to_string().parse().unwrap());
    let request = Request::from_parts(parts, body);
    match tokio::time::timeout(Duration::from_secs(30), try_send_to(addr, request)).await {
        Ok(Ok(r)) => Some(r),
        Ok(Err(_)) => None,
        Err(_) => panic!("a request to {addr} hung for 30 s"),
    }
}

/// Writers against actor `actor` until `stop`: writer 0 increments its
/// counter, the others put keys of their own (`w<writer>-<n>`).
pub fn writers(
    live: &Live,
    actor: &'static str,
    n: usize,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    seen: &std::sync::Arc<std::sync::Mutex<Seen>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|w| {
            let (live, stop, seen) = (live.clone(), stop.clone(), seen.clone());
            tokio::spawn(async move {
                let mut seq = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    seq += 1;
                    let key = format!("w{w}-{seq}");
                    let request = if w == 0 {
                        Request::post(format!("/direct/{actor}/incr"))
                            .body(Full::new(Bytes::new()))
                            .unwrap()
                    } else {
                        Request::post(format!("/direct/{actor}/put?key={key}"))
                            .body(Full::new(Bytes::from(key.clone())))
                            .unwrap()
                    };
                    let r = to_any(&live, seq * 7 + w as u64, request).await;
                    let cut = r.is_none();
                    {
                        let mut seen = seen.lock().unwrap();
                        match r {
                            Some(r) if r.status == 200 => {
                                if w == 0 {
                                    seen.counted.push(r.text().parse().unwrap());
                                } else {
                                    seen.acked.push((key, Instant::now()));
                                }
                            }
                            Some(r) => {
                                let code = serde_json::from_slice::<serde_json::Value>(
                                    r.body.as_deref().unwrap_or_default(),
                                )
                                .ok()
                                .and_then(|v| v["error"].as_str().map(str::to_string))
                                .unwrap_or_else(|| format!("status {}", r.status));
                                *seen.refused.entry(code).or_default() += 1;
                            }
                            None => seen.cut += 1,
                        }
                    }
                    if cut {
                        // No node answered: give the survivors a moment.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            })
        })
        .collect()
}

/// Reads every acknowledged key back through the nodes in turn, and
/// checks the counter never answered the same value twice (a lost
/// increment would be counted again).
pub async fn every_ack_is_readable(nodes: &[&Weir], actor: &str, seen: &Seen) {
    for (i, (key, _)) in seen.acked.iter().enumerate() {
        let node = nodes[i % nodes.len()];
        let r = node.get(&format!("/direct/{actor}/get?key={key}")).await;
        assert_eq!(r.status, 200, "acknowledged {key} is gone: {:?}", r.body);
        assert_eq!(r.text(), *key);
    }
    let distinct: std::collections::BTreeSet<u64> = seen.counted.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        seen.counted.len(),
        "an acknowledged increment was lost and counted again"
    );
    // A run in which nothing was acknowledged proves nothing.
    assert!(!seen.acked.is_empty(), "no write was acknowledged");
    let max = seen
        .counted
        .iter()
        .max()
        .expect("no increment was acknowledged");
    let r = nodes[0].get(&format!("/direct/{actor}/get?key=n")).await;
    let now: u64 = r.text().parse().unwrap();
    assert!(now >= *max, "the counter went back: {now} < {max}");
}
