//! `wasi:keyvalue` backed by SQLite: declared stores only, round trips,
//! cursors, atomic increments under concurrency, and durability across
//! SIGKILL.

mod common;

use std::collections::HashSet;
use std::path::PathBuf;

use bytes::Bytes;
use common::{Weir, guest, pattern, send_to};
use http::Request;
use http_body_util::Full;

fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-kv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
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
    loop {
        let path = match &cursor {
            Some(c) => format!("/kv/list?store=main&cursor={c}"),
            None => "/kv/list?store=main".to_string(),
        };
        let resp = weir.get(&path).await;
        keys.extend(resp.text().lines().map(str::to_string));
        pages += 1;
        match resp.headers.get("x-cursor") {
            Some(c) => cursor = Some(c.to_str().unwrap().to_string()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
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
async fn acknowledged_writes_survive_sigkill() {
    let dir = data_dir("sigkill");
    let n = 300;
    {
        let weir = start(&dir, &[]);
        for i in 0..n {
            let value = format!("value-{i}").into_bytes();
            assert_eq!(set(&weir, "main", &format!("key-{i}"), value).await, 200);
        }
        // Killed right after the last acknowledgement: no clean shutdown.
        weir.signal("KILL");
    }
    let weir = start(&dir, &[]);
    for i in 0..n {
        let got = weir.get(&format!("/kv/get?store=main&key=key-{i}")).await;
        assert_eq!(got.status, 200, "key-{i} lost");
        assert_eq!(got.text(), format!("value-{i}"));
    }
}

#[tokio::test]
async fn fsync_durability_is_a_setting() {
    let dir = data_dir("fsync");
    {
        let weir = start(&dir, &["--durability", "fsync"]);
        assert_eq!(set(&weir, "main", "k", b"v".to_vec()).await, 200);
        weir.signal("KILL");
    }
    let weir = start(&dir, &["--durability", "fsync"]);
    assert_eq!(weir.get("/kv/get?store=main&key=k").await.text(), "v");
    let out = common::run_weir(&[
        "serve",
        guest("kv").to_str().unwrap(),
        "--durability",
        "sometimes",
    ]);
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("durability"), "{}", out.stderr);
}
