//! `wasi:keyvalue` backed by SQLite: declared stores only, round trips,
//! cursors, atomic increments under concurrency, and durability across
//! SIGKILL.

mod common;

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use common::{Weir, guest, pattern, send_to};
use http::Request;
use http_body_util::Full;

fn data_dir(name: &str) -> PathBuf {
    weir_scratch::dir(&format!("kv-{name}"))
}

fn start(dir: &std::path::Path, extra: &[&str]) -> Weir {
    let mut args = vec![
        "--data-dir",
        dir.to_str().unwrap(),
        "--kv-store",
        "main",
        "--kv-store",
        "other",
    ];
    args.extend_from_slice(extra);
    Weir::start(&guest("kv"), &args)
}

/// Percent-encodes every byte outside unreserved ASCII.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn set(weir: &Weir, store: &str, key: &str, value: Vec<u8>) -> u16 {
    weir.send(
        Request::put(format!("/kv/set?store={store}&key={}", encode(key)))
            .body(Full::new(Bytes::from(value)))
            .unwrap(),
    )
    .await
    .status
    .as_u16()
}

#[tokio::test]
async fn undeclared_stores_are_refused_not_created() {
    let dir = data_dir("undeclared");
    let weir = start(&dir, &[]);
    let resp = weir.get("/kv/open?store=nope").await;
    assert_eq!(resp.status, 500);
    assert_eq!(resp.text(), "Error::NoSuchStore");
    assert!(!dir.join("kv/nope.sqlite3").exists());
    assert_eq!(weir.get("/kv/open?store=main").await.text(), "ok");
}

#[tokio::test]
async fn values_and_unicode_keys_round_trip_and_stores_are_separate() {
    let dir = data_dir("roundtrip");
    let weir = start(&dir, &["--limit", "max_request_body_bytes=8000000"]);
    let big = pattern(5_000_000);
    assert_eq!(set(&weir, "main", "big", big.clone()).await, 200);
    let got = weir.get("/kv/get?store=main&key=big").await;
    assert!(got.body.unwrap() == big, "a 5 MB value round-trips");
    for key in ["ключ", "a b/c?d&e=f", "😀", "nul\0inside", ""] {
        let value = format!("value of {key}").into_bytes();
        assert_eq!(set(&weir, "main", key, value.clone()).await, 200, "{key:?}");
        let got = weir
            .get(&format!("/kv/get?store=main&key={}", encode(key)))
            .await;
        assert_eq!(got.body.unwrap(), value, "{key:?}");
    }
    let other = weir.get("/kv/get?store=other&key=big").await;
    assert_eq!(other.status, 404, "stores do not share keys");
}

#[tokio::test]
async fn list_keys_pages_with_its_cursor() {
    let dir = data_dir("cursor");
    let weir = start(&dir, &[]);
    for i in 0..2500 {
        assert_eq!(set(&weir, "main", &format!("k{i:05}"), vec![1]).await, 200);
    }
    let mut keys = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    let mut page_sizes = Vec::new();
    loop {
        let path = match &cursor {
            Some(c) => format!("/kv/list?store=main&cursor={c}"),
            None => "/kv/list?store=main".to_string(),
        };
        let resp = weir.get(&path).await;
        let page: Vec<String> = resp.text().lines().map(str::to_string).collect();
        page_sizes.push(page.len());
        keys.extend(page);
        pages += 1;
        match resp.headers.get("x-cursor") {
            Some(c) => cursor = Some(c.to_str().unwrap().to_string()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(page_sizes, [1000, 1000, 500], "pages of 1,000 keys");
    assert_eq!(keys.len(), 2500);
    assert_eq!(keys.iter().collect::<HashSet<_>>().len(), 2500);
    assert_eq!(keys[0], "k00000");
    assert_eq!(keys[2499], "k02499");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_increments_lose_no_update() {
    let dir = data_dir("incr");
    let weir = start(
        &dir,
        &["--limit", "max_concurrent=8", "--limit", "max_queued=64"],
    );
    let clients = 40;
    let each = 50;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let addr = weir.addr;
            tokio::spawn(async move {
                let mut seen = Vec::new();
                for _ in 0..each {
                    let req = Request::post("/kv/incr?store=main&key=hits")
                        .header("host", "x")
                        .body(Full::new(Bytes::new()))
                        .unwrap();
                    let resp = send_to(addr, req).await;
                    assert_eq!(resp.status, 200);
                    seen.push(resp.text().parse::<u64>().unwrap());
                }
                seen
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let total = (clients * each) as u64;
    assert_eq!(all.len() as u64, total);
    let distinct: HashSet<_> = all.iter().collect();
    assert_eq!(
        distinct.len() as u64,
        total,
        "every increment saw its own value"
    );
    assert_eq!(*all.iter().max().unwrap(), total);
    let final_value = weir.get("/kv/get?store=main&key=hits").await;
    assert_eq!(final_value.body.unwrap().as_ref(), total.to_le_bytes());
}

#[tokio::test]
async fn keys_up_to_64_kib_and_values_up_to_32_mib() {
    const KEY: usize = 64 << 10;
    const VALUE: usize = 32 << 20;
    let dir = data_dir("limits");
    let weir = start(
        &dir,
        &[
            "--limit",
            "max_request_head_bytes=300000",
            "--limit",
            "max_request_body_bytes=40000000",
            "--limit",
            "max_response_body_bytes=40000000",
            "--limit",
            "event_limit_ms=20000",
        ],
    );
    // Keys this long do not fit in a URI: the guest reads them from x-key.
    let key = "k".repeat(KEY);
    let with_key = |method: http::Method, path: &str, key: &str, body: Vec<u8>| {
        Request::builder()
            .method(method)
            .uri(path)
            .header("x-key", key)
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    let r = weir
        .send(with_key(
            http::Method::PUT,
            "/kv/set?store=main",
            &key,
            b"at the key limit".to_vec(),
        ))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let got = weir
        .send(with_key(
            http::Method::GET,
            "/kv/get?store=main",
            &key,
            Vec::new(),
        ))
        .await;
    assert_eq!(got.text(), "at the key limit");
    let over = weir
        .send(with_key(
            http::Method::PUT,
            "/kv/set?store=main",
            &format!("{key}k"),
            Vec::new(),
        ))
        .await;
    assert_eq!(over.status, 500);
    assert!(over.text().contains("65537"), "{}", over.text());
    assert!(
        over.text().contains("65536"),
        "the limit is named: {}",
        over.text()
    );

    let value = pattern(VALUE);
    assert_eq!(set(&weir, "main", "big", value.clone()).await, 200);
    let got = weir.get("/kv/get?store=main&key=big").await;
    assert!(got.body.unwrap() == value, "a 32 MiB value round-trips");
    let over = weir
        .send(
            Request::put("/kv/set?store=main&key=bigger")
                .body(Full::new(Bytes::from(pattern(VALUE + 1))))
                .unwrap(),
        )
        .await;
    assert_eq!(over.status, 500);
    assert!(
        over.text().contains("33554432"),
        "the limit is named: {}",
        over.text()
    );
    assert_eq!(weir.get("/kv/get?store=main&key=bigger").await.status, 404);
}

/// Writers that set keys until the server is killed: every write must be
/// acknowledged, and the only failure allowed is a transport error after
/// `killed` is set. Returns the keys acknowledged.
async fn write_until_killed(
    addr: std::net::SocketAddr,
    writer: usize,
    killed: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<String> {
    use std::sync::atomic::Ordering;
    let mut acked = Vec::new();
    for i in 0.. {
        let key = format!("w{writer}-{i}");
        let req = Request::put(format!("/kv/set?store=main&key={key}"))
            .header("host", "x")
            .body(Full::new(Bytes::from(format!("value of {key}"))))
            .unwrap();
        match common::try_send_to(addr, req).await {
            Ok(r) if r.status == 200 && r.body.is_ok() => acked.push(key),
            Ok(r) if r.body.is_err() && killed.load(Ordering::SeqCst) => break,
            Ok(r) => panic!("{key}: {} {:?}", r.status, r.body),
            Err(_) if killed.load(Ordering::SeqCst) => break,
            Err(e) => panic!("{key} failed before the kill: {e}"),
        }
    }
    acked
}

#[tokio::test]
async fn acknowledged_writes_survive_sigkill_in_flight() {
    let dir = data_dir("sigkill");
    let mut acked = Vec::new();
    for round in 0..3 {
        let weir = start(&dir, &[]);
        let killed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..8)
            .map(|w| tokio::spawn(write_until_killed(weir.addr, round * 8 + w, killed.clone())))
            .collect();
        // Killed while eight writers have requests in flight.
        tokio::time::sleep(Duration::from_millis(300)).await;
        killed.store(true, std::sync::atomic::Ordering::SeqCst);
        weir.signal("KILL");
        let before = acked.len();
        for w in writers {
            acked.extend(w.await.unwrap());
        }
        assert!(acked.len() > before, "round {round} acknowledged nothing");
    }
    let weir = start(&dir, &[]);
    for key in &acked {
        let got = weir.get(&format!("/kv/get?store=main&key={key}")).await;
        assert_eq!(got.status, 200, "{key} lost");
        assert_eq!(got.text(), format!("value of {key}"));
    }
    println!("{} acknowledged writes present after 3 kills", acked.len());
}

#[tokio::test]
async fn fsync_durability_is_a_setting_of_the_connection() {
    let dir = data_dir("fsync");
    // What a commit waits for is read from each store's open connection.
    let modes = |weir: Weir| async move {
        let status = weir.status().await;
        let kv = status["apps"][0]["stores"]["kv"].clone();
        assert_eq!(kv.as_array().unwrap().len(), 2, "{status}");
        kv.as_array()
            .unwrap()
            .iter()
            .map(|s| s["synchronous"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(modes(start(&dir, &[])).await, ["normal", "normal"]);
    assert_eq!(
        modes(start(&dir, &["--durability", "fsync"])).await,
        ["full", "full"]
    );
    let out = common::run_weir(&[
        "serve",
        guest("kv").to_str().unwrap(),
        "--durability",
        "sometimes",
    ]);
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("durability"), "{}", out.stderr);
}
