//! The examples, each served with its own weir.toml: the link shortener
//! (guests/shortener: SQL for links, key-value counters, outbound HTTP
//! checks), the rate limiter (guests/ratelimit: a worker in front of one
//! durable `bucket` actor per client) and the durable app (guests/notes-owner
//! running guests/notes-app as a resident process over a durable slot).

mod common;

use bytes::Bytes;
use common::{Weir, guest, root};
use http::Request;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A target that answers every request with 200.
async fn target() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    port
}

/// A fresh data dir for one example, and its config file.
fn example(name: &str, config: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let data = weir_scratch::dir(&format!("example-{name}"));
    (data, root().join(config))
}

fn serve_example(config: &std::path::Path, data: &std::path::Path) -> Weir {
    Weir::start_with(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ])
}

/// Makes a short link to a page that answers; its code and target.
async fn create_link(weir: &Weir) -> (String, String) {
    let port = target().await;
    let url = format!("http://127.0.0.1:{port}/page");
    let created = weir
        .send(
            Request::post("/links")
                .body(Full::new(Bytes::from(url.clone())))
                .unwrap(),
        )
        .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert_eq!(created.json()["url"], url.as_str());
    (created.json()["code"].as_str().unwrap().to_string(), url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_link_shortener_creates_follows_and_counts() {
    guest("shortener");
    let (data, config) = example("shortener", "guests/shortener/weir.toml");
    let weir = serve_example(&config, &data);
    let (code, url) = create_link(&weir).await;

    for _ in 0..3 {
        let follow = weir.get(&format!("/{code}")).await;
        assert_eq!(follow.status, 302);
        assert_eq!(follow.headers["location"], url.as_str());
    }
    let stats = weir.get(&format!("/{code}/stats")).await.json();
    assert_eq!(stats["hits"], 3);

    // A target that does not answer is refused; so is a denied host.
    let dead = weir
        .send(
            Request::post("/links")
                .body(Full::new(Bytes::from("http://127.0.0.1:1/")))
                .unwrap(),
        )
        .await;
    assert_eq!(dead.status, 422);
    let denied = weir
        .send(
            Request::post("/links")
                .body(Full::new(Bytes::from("http://denied.invalid/")))
                .unwrap(),
        )
        .await;
    assert_eq!(denied.status, 422);
    assert!(
        denied.json()["reason"]
            .as_str()
            .unwrap()
            .contains("HttpRequestDenied")
    );
    assert_eq!(weir.get("/nope").await.status, 404);

    // Codes are distinct and links survive a restart.
    let second = weir
        .send(
            Request::post("/links")
                .body(Full::new(Bytes::from(url.clone())))
                .unwrap(),
        )
        .await
        .json();
    assert_ne!(second["code"], code.as_str());
    drop(weir);
    let weir = Weir::start_with(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert_eq!(weir.get(&format!("/{code}/stats")).await.json()["hits"], 3);
}

async fn limited(weir: &Weir, client: &str) -> (u16, String) {
    let r = weir
        .send(
            Request::get("/")
                .header("x-client-id", client)
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    let retry = r
        .headers
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    assert_eq!(
        r.status == 429,
        !retry.is_empty(),
        "429 carries retry-after"
    );
    (r.status.as_u16(), r.text())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_two_apps_example_serves_the_shortener_and_the_rate_limiter_side_by_side() {
    guest("shortener");
    guest("ratelimit");
    guest("ratelimit_bucket");
    let (data, config) = example("two", "guests/two-apps/weir.toml");
    let weir = serve_example(&config, &data);
    let (code, _) = create_link(&weir).await;
    assert_eq!(weir.get(&format!("/{code}")).await.status, 302);
    // The rate limiter by path and by host, its bucket its own.
    let by_path = weir
        .send(
            Request::get("/limited")
                .header("x-client-id", "ada")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(by_path.text(), "hello ada: 4 requests left\n");
    let by_host = weir
        .send(
            Request::get("/anything")
                .header("host", "limits.localhost")
                .header("x-client-id", "ada")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(by_host.text(), "hello ada: 3 requests left\n");
    // Each app's data under its own directory.
    assert!(data.join("apps/shortener/sql").is_dir());
    assert!(data.join("apps/shortener/kv/counters.sqlite3").is_file());
    assert!(
        data.join("apps/ratelimit/actors/bucket/ada.sqlite3")
            .is_file()
    );
    for root_level in ["sql", "kv", "actors"] {
        assert!(
            !data.join(root_level).exists(),
            "no {root_level} at the data dir's root"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limiter_keeps_one_bucket_per_client_across_restarts() {
    guest("ratelimit");
    guest("ratelimit_bucket");
    let data = weir_scratch::dir("example-rl");
    let config = root().join("guests/ratelimit/weir.toml");
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ];
    let weir = Weir::start_with(&args);
    // A full bucket holds five tokens; the sixth request in a burst waits.
    for left in (0..5).rev() {
        let (status, body) = limited(&weir, "ada").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body, format!("hello ada: {left} requests left\n"));
    }
    assert_eq!(limited(&weir, "ada").await.0, 429);
    // Another client has a bucket of its own.
    assert_eq!(limited(&weir, "grace").await.0, 200);
    // The bucket is durable: a restart does not refill it.
    drop(weir);
    let weir = Weir::start_with(&args);
    assert_eq!(limited(&weir, "ada").await.0, 429);
    // Its forget timer is pending, as operators can see.
    let detail = weir.admin_get("/actors/bucket/ada").await.json();
    assert_eq!(detail["timers"][0]["reason"], "forget");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_durable_app_keeps_its_notes_across_sigkill_and_a_kill_and_comes_back_each_time() {
    guest("notes_owner");
    let data = weir_scratch::dir("example-notes");
    let config = root().join("guests/notes-owner/weir.toml");
    let app = guest("notes_app");
    // Pushed with the CLI, straight into the data dir's image store.
    let pushed = common::output_within(
        common::weir_command()
            .args(["images", "push", "--data-dir"])
            .arg(&data)
            .arg(&app),
        common::EXITS_WITHIN,
    );
    assert!(pushed.status.success());
    let digest = String::from_utf8(pushed.stdout).unwrap();
    let digest = digest.split_whitespace().next().unwrap().to_string();
    let start = || {
        Weir::start_with(&[
            "--config",
            config.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ])
    };
    let weir = start();
    let nothing = call(&weir, "GET", "/notes/mine/notes/todo", b"").await;
    assert_eq!(nothing.status, 503);
    assert_eq!(
        nothing.text(),
        "nothing deployed: POST /deploy/<digest> first\n"
    );
    let deployed = call(&weir, "POST", &format!("/notes/mine/deploy/{digest}"), b"").await;
    assert_eq!(deployed.text(), "deployed as pid 1000001\n");
    let kept = call(&weir, "PUT", "/notes/mine/notes/todo", b"buy milk").await;
    assert_eq!(
        (kept.status.as_u16(), kept.text()),
        (201, "kept\n".to_string())
    );
    call(&weir, "PUT", "/notes/mine/notes/later", b"call home").await;
    let list = call(&weir, "GET", "/notes/mine/notes", b"").await;
    assert_eq!(list.text(), "later\ntodo");
    // Another owner has an app and notes of its own (none deployed yet).
    let theirs = call(&weir, "GET", "/notes/yours/notes/todo", b"").await;
    assert_eq!(theirs.status, 503);

    weir.signal("KILL");
    drop(weir);
    let weir = start();
    let read = call(&weir, "GET", "/notes/mine/notes/todo", b"").await;
    assert_eq!(
        (read.status.as_u16(), read.text()),
        (200, "buy milk".to_string())
    );
    let status = weir.admin_get("/processes").await.json();
    let pid = status["processes"][0]["pid"].as_u64().unwrap();
    assert!(pid > 2_000_000, "a new incarnation's pid: {pid}");

    // Killed by an operator: the owner's next request starts it again
    // over the same slot, not to the process that ended.
    let killed = weir
        .admin_send("DELETE", &format!("/processes/notes/mine/{pid}"))
        .await;
    assert_eq!(killed.json()["killed"], true, "{:?}", killed.body);
    let read = call(&weir, "GET", "/notes/mine/notes/todo", b"").await;
    assert_eq!(
        (read.status.as_u16(), read.text()),
        (200, "buy milk".to_string())
    );
    let status = weir.admin_get("/processes").await.json();
    let again = status["processes"][0]["pid"].as_u64().unwrap();
    assert!(
        again > pid,
        "started again by the owner: {again} after {pid}"
    );
    let _ = std::fs::remove_dir_all(&data);
}

async fn call(weir: &Weir, method: &str, path: &str, body: &'static [u8]) -> common::Resp {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    weir.send(req).await
}
