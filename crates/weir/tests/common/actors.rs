//! Helpers of the actor tests: a server with the `gateway` worker in front
//! of the `actor-probe` class, and what they read of its actors (alarm
//! logs, incarnations, residency, process memory).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::Value;

use super::{Resp, Weir, guest, wait_for};

pub fn data_dir(name: &str) -> PathBuf {
    weir_scratch::dir(&format!("actors-{name}"))
}

pub fn start(dir: &Path, extra: &[&str]) -> Weir {
    let actor = format!("probe={}", guest("actor_probe").display());
    let gateway = guest("gateway");
    let mut args = vec![
        gateway.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
        "--actor",
        &actor,
    ];
    args.extend_from_slice(extra);
    Weir::start_with(&args)
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

pub async fn post(weir: &Weir, path: &str, body: Vec<u8>) -> Resp {
    weir.send(
        Request::post(path)
            .body(Full::new(Bytes::from(body)))
            .unwrap(),
    )
    .await
}

pub async fn incarnation(weir: &Weir, actor: &str) -> u64 {
    let r = weir.get(&format!("/probe/{actor}/whoami")).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let v = r.json();
    assert_eq!(
        v["pid_base"],
        v["incarnation"].as_u64().unwrap() * 1_000_000
    );
    v["incarnation"].as_u64().unwrap()
}

/// The actor's alarm log, as its handlers wrote it.
pub async fn alarm_log(weir: &Weir, actor: &str) -> Vec<String> {
    let r = weir.get(&format!("/probe/{actor}/log")).await;
    assert_eq!(r.status, 200);
    serde_json::from_value(r.json()).unwrap()
}

pub async fn wait_log(weir: &Weir, actor: &str, f: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = alarm_log(weir, actor).await;
        if f(&log) {
            return log;
        }
        assert!(Instant::now() < deadline, "alarm log stayed {log:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Returns once a timer set now for `ms` later has fired on an actor of its
/// own: every timer due before it was dispatched by then, so a count of
/// deliveries taken after this is the count, not the first sight of one.
pub async fn after_a_later_timer(weir: &Weir, ms: u64) {
    static MARKERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let marker = format!(
        "marker{}",
        MARKERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let r = post(
        weir,
        &format!("/probe/{marker}/schedule?reason=tick&in_ms={ms}"),
        Vec::new(),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    wait_log(weir, &marker, |l| !l.is_empty()).await;
}

pub async fn inspect(weir: &Weir, actor: &str) -> Value {
    let r = weir
        .admin_get(&format!("/actors/probe/{actor}?keys=1"))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.json()
}

/// Whether `/actors/probe` lists `name` as live.
pub async fn is_live(weir: &Weir, name: &str) -> bool {
    let list = weir.admin_get("/actors/probe").await.json();
    list["actors"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["name"] == name && a["live"] == true)
}

/// Waits until `/actors/probe` no longer lists `name` as live.
pub async fn wait_hibernated(weir: &Weir, name: &str) {
    wait_for(&format!("{name} to hibernate"), || async {
        if is_live(weir, name).await {
            Err("live".to_string())
        } else {
            Ok(())
        }
    })
    .await
}

/// Waits until every hibernated actor has been closed: evicted instances
/// are freed on the closer thread, which then trims the heap; `closing`
/// counts those not yet done.
pub async fn wait_closed(weir: &Weir) {
    wait_for("evicted actors to be closed", || async {
        let status = weir.admin_get("/actors").await.json()["status"].clone();
        if status["closing"] == 0 {
            Ok(())
        } else {
            Err(status.to_string())
        }
    })
    .await
}

pub async fn wait_live(weir: &Weir, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = weir.admin_get("/actors").await.json();
        if status["status"]["live"] == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "live actors stayed at {}",
            status["status"]["live"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
