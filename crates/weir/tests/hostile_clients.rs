//! A hostile tenant and hostile clients, from outside: slow bodies, the
//! connection cap, the admin address and Weir's own addresses, a guest
//! flooding the log, a second server on the same data dir, and actor
//! addresses that must match exactly. Each test names what must hold.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{HoldServer, Weir, guest, send_to, wait_for};
use http::Request;
use http_body_util::Full;

use common::hostile::*;

/// Opens a connection that declares a body of 10 bytes and sends none.
fn silent_body(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"POST /hello HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n")
        .unwrap();
    s
}

/// Reads what the server answers on `s` (until it closes or 30 s pass).
fn answer(mut s: TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
        if out.windows(4).any(|w| w == b"\r\n\r\n") && out.ends_with(b"}") {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn slow_clients_cannot_hold_the_lanes() {
    let dir = data_dir("slow");
    // The whole-body timeout is far away: only the silence and rate bounds
    // can end these bodies within the test's waits.
    let weir = start(
        &dir,
        &[
            "--limit",
            "body_idle_timeout_ms=1000",
            "--limit",
            "header_read_timeout_ms=1000",
            "--limit",
            "body_read_timeout_ms=300000",
        ],
    );
    // 70 bodies that never come: 32 hold lanes, 32 wait, 6 are refused.
    let started = Instant::now();
    let silent: Vec<TcpStream> = (0..70).map(|_| silent_body(weir.addr)).collect();
    let readers: Vec<_> = silent
        .into_iter()
        .map(|s| std::thread::spawn(move || answer(s)))
        .collect();
    // A normal client keeps trying; it is served once the silent bodies
    // have been answered 408.
    wait_for("a normal request to be served", || async {
        let r = weir.get("/hello").await;
        if r.status == 200 {
            Ok(())
        } else {
            Err(r.status.to_string())
        }
    })
    .await;
    println!(
        "a normal request was served {:?} after 70 silent bodies",
        started.elapsed()
    );
    let (mut timed_out, mut refused) = (0, 0);
    for r in readers {
        let answer = r.join().unwrap();
        if answer.contains("{\"error\":\"request_body_timeout\"}") {
            assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
            timed_out += 1;
        } else if answer.contains("event_capacity_exceeded")
            || answer.contains("admission_deadline_exceeded")
        {
            // Refused, or waited in the queue past its deadline: either
            // way it never held a lane.
            refused += 1;
        } else {
            panic!("{answer:?}");
        }
    }
    assert_eq!(timed_out + refused, 70);
    assert!(timed_out >= 32, "{timed_out} timed out, {refused} refused");
    // A trickle (a byte every 300 ms, never silent for a whole second) is
    // below the minimum rate once the first second has passed: it is
    // answered 408 while it still trickles.
    let mut s = TcpStream::connect(weir.addr).unwrap();
    s.write_all(b"POST /hello HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n")
        .unwrap();
    let reader = s.try_clone().unwrap();
    let trickling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let trickle = {
        let trickling = trickling.clone();
        std::thread::spawn(move || {
            while trickling.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(300));
                if s.write_all(b"x").is_err() {
                    break;
                }
            }
        })
    };
    let answer = tokio::task::spawn_blocking(move || answer(reader))
        .await
        .unwrap();
    let still_trickling = !trickle.is_finished();
    trickling.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(still_trickling, "answered only after the trickle stopped");
    // A head that never completes: the server closes the connection.
    let mut s = TcpStream::connect(weir.addr).unwrap();
    s.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\n").unwrap();
    let closed = tokio::task::spawn_blocking(move || closed_by_server(s))
        .await
        .unwrap();
    assert!(closed, "a half-sent head kept its connection open");
}

/// True when the server closes `s` (within 30 s) without answering.
fn closed_by_server(mut s: TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[tokio::test]
async fn connections_past_the_cap_are_refused_with_a_reason() {
    let dir = data_dir("conns");
    let weir = start(&dir, &["--limit", "max_connections=8"]);
    let mut held: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(weir.addr).unwrap())
        .collect();
    // The held connections are accepted.
    wait_for("eight connections accepted", || async {
        let mut s = TcpStream::connect(weir.addr).unwrap();
        s.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let a = answer(s);
        if a.contains("connection_limit_exceeded") {
            Ok(a)
        } else {
            Err(a)
        }
    })
    .await;
    let mut s = TcpStream::connect(weir.addr).unwrap();
    s.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let refused = answer(s);
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.contains("{\"error\":\"connection_limit_exceeded\"}"),
        "{refused}"
    );
    // A held one, under the cap, is served all the same.
    let mut one = held.pop().unwrap();
    one.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let served = answer(one);
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    assert!(served.ends_with("\"still here\""), "{served}");
    drop(held);
    // Once they close, new connections are served.
    wait_for("a connection to be served again", || async {
        let r = common::try_send_to(
            weir.addr,
            Request::get("/hello")
                .header("host", "x")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
        match r {
            Ok(r) if r.status == 200 => Ok(()),
            Ok(r) => Err(r.status.to_string()),
            Err(e) => Err(e),
        }
    })
    .await;
}

#[tokio::test]
async fn the_admin_needs_its_token_and_guests_never_reach_weir_itself() {
    let dir = data_dir("admin");
    let upstream = HoldServer::start(Some(1));
    let weir = start(
        &dir,
        &[
            "--allow-outbound",
            "http://127.0.0.1:*",
            "--allow-outbound",
            "http://localhost:*",
            "--allow-outbound",
            "http://0.0.0.0:*",
        ],
    );
    let admin = weir.admin.unwrap();
    let token_file = dir.join("admin-token");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // Without the token (or with a wrong one): no names, no keys, no
    // deletion. Monitoring stays open.
    assert_eq!(weir.get("/p/secret/incr").await.text(), "1");
    for (method, path, auth) in [
        ("GET", "/actors", None),
        ("GET", "/actors/probe/secret?keys=1", None),
        ("DELETE", "/actors/probe/secret", Some("Bearer wrong")),
        ("GET", "/actors/probe", Some("secret")),
    ] {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", admin.to_string());
        if let Some(auth) = auth {
            req = req.header("authorization", auth);
        }
        let r = send_to(admin, req.body(Full::new(Bytes::new())).unwrap()).await;
        assert_eq!(r.status, 401, "{method} {path}");
        assert_eq!(r.json()["error"], "admin_token_required");
    }
    assert_eq!(
        weir.get("/p/secret/get?key=n").await.text(),
        "1",
        "not deleted"
    );
    assert_eq!(
        weir.admin_get("/actors/probe/secret?keys=1").await.status,
        200
    );
    for path in ["/healthz", "/status", "/metrics"] {
        let r = send_to(
            admin,
            Request::get(path)
                .header("host", admin.to_string())
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
        assert_eq!(r.status, 200, "{path}");
    }
    // Guests cannot reach the admin or the listen address, whatever the
    // allow-list says and however the address is written.
    let listen = weir.addr;
    for url in [
        format!("http://127.0.0.1:{}/actors", admin.port()),
        format!("http://localhost:{}/healthz", admin.port()),
        format!("http://0.0.0.0:{}/healthz", admin.port()),
        format!("http://127.0.0.1:{}/hello", listen.port()),
    ] {
        let r = weir.get(&format!("/fetch?url={url}")).await.json();
        assert_eq!(r["error"], "ErrorCode::HttpRequestDenied", "{url}: {r}");
    }
    // An allowed upstream is reached (the refusal is not of everything).
    let r = weir
        .get(&format!("/fetch?url={}", upstream.url()))
        .await
        .json();
    assert_eq!(r["body"], "released", "{r}");
    let metrics = weir.admin_get("/metrics").await.text();
    assert!(
        metrics.contains("weir_outbound_refused_total{app=\"hostile\",result=\"denied\"} 4"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_guest_cannot_flood_weirs_log() {
    let dir = data_dir("print");
    // Not about time: printing 10 MB a line at a time can take a debug
    // build past the default 1 s event limit.
    let weir = start(&dir, &["--limit", "event_limit_ms=60000"]);
    let log_bytes = |weir: &Weir| weir.log().len();
    let before = log_bytes(&weir);
    let receipts_before = weir.receipts().len();
    for _ in 0..2 {
        let r = weir.get("/print?kb=10000").await.json();
        assert_eq!(r["printed_kb"], 10000);
    }
    // Each event's output is cut at 64 KiB; what reaches the log is the
    // two events' 128 KiB and the receipts.
    common::wait_for("the guest's lines in the log", || async {
        let grown = log_bytes(&weir) - before;
        if grown >= 2 * 60 * 1024 {
            Ok(())
        } else {
            Err(format!("{grown} bytes"))
        }
    })
    .await;
    // Then every receipt: the two events' (each written as its event
    // ends, which may come after its answer) and a marker's, made after
    // both: everything they could have put in the log is there.
    weir.log_flushed("/hello").await;
    common::wait_for("the two events' receipts and the marker's", || async {
        match weir.receipts().len() - receipts_before {
            n if n >= 3 => Ok(()),
            n => Err(format!("{n} receipts")),
        }
    })
    .await;
    let grown = log_bytes(&weir) - before;
    println!("20 MB printed by two events; the log grew {grown} bytes");
    assert!(
        grown < 2 * 64 * 1024 + 8 * 1024,
        "the log grew {grown} bytes"
    );
}

#[tokio::test]
async fn a_guest_cannot_forge_or_break_weirs_log_lines() {
    let dir = data_dir("forge");
    let weir = start(&dir, &[]);
    let say = async |stream: &str, bytes: &[u8]| {
        let r = weir
            .send(
                Request::post(format!("/say?stream={stream}"))
                    .body(Full::new(Bytes::copy_from_slice(bytes)))
                    .unwrap(),
            )
            .await
            .json();
        assert_eq!(r["said"], bytes.len(), "{r}");
    };
    // A receipt of an app that does not exist, on both streams; then a
    // line left unfinished, which would glue Weir's next line to it; then
    // bytes that are not text.
    let forged = r#"{"timestamp":"2026-12-04T00:00:00.000000Z","level":"INFO","target":"weir::receipt","fields":{"message":"receipt","app":"bank","outcome":"ok","status":200}}"#;
    say("stderr", format!("{forged}\n").as_bytes()).await;
    say("stdout", format!("{forged}\n").as_bytes()).await;
    say("stderr", b"{\"glued\":").await;
    say("stderr", b"\x1b[2J\x00\xff\n").await;
    assert_eq!(weir.get("/hello").await.json(), "still here");
    // An actor's lines name the actor.
    let r = weir
        .send(
            Request::post("/h/noisy/say")
                .body(Full::new(Bytes::from_static(b"from an actor\n")))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    wait_for("the last call's receipt", || async {
        let log = weir.log();
        let receipts = log
            .lines()
            .filter(|l| l.contains("\"weir::receipt\""))
            .count();
        if receipts >= 5 && log.contains("from an actor") {
            Ok(())
        } else {
            Err(format!("{receipts} receipts"))
        }
    })
    .await;
    let log = weir.log();
    let mut records = Vec::new();
    for line in log.lines() {
        if line.starts_with("weir: ") {
            continue; // the start's plain lines
        }
        let record: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: a broken line {line:?}"));
        records.push(record);
    }
    // Every receipt is Weir's own: five calls, the hostile app's.
    let receipts: Vec<_> = records
        .iter()
        .filter(|r| r["target"] == "weir::receipt")
        .collect();
    assert_eq!(receipts.len(), 5, "{log}");
    let app = receipts[0]["fields"]["app"].clone();
    assert!(receipts.iter().all(|r| r["fields"]["app"] == app), "{log}");
    assert_ne!(app, "bank");
    // What the guest wrote is in the log as its own records, each line
    // whole, saying which app and stream it came from.
    let from_actor: Vec<_> = records
        .iter()
        .filter(|r| r["fields"]["line"] == "from an actor")
        .collect();
    assert_eq!(from_actor.len(), 1, "{log}");
    let f = &from_actor[0]["fields"];
    assert_eq!(
        (&f["app"], &f["class"], &f["name"]),
        (&app, &"hostile".into(), &"noisy".into())
    );
    let said: Vec<(String, String)> = records
        .iter()
        .filter(|r| r["target"] == "weir::guest" && r["fields"]["class"].is_null())
        .map(|r| {
            assert_eq!(r["fields"]["app"], app, "{r}");
            (
                r["fields"]["stream"].as_str().unwrap().to_string(),
                r["fields"]["line"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let owned = |s: &str, l: &str| (s.to_string(), l.to_string());
    assert_eq!(
        said,
        [
            owned("stderr", forged),
            owned("stdout", forged),
            owned("stderr", "{\"glued\":"),
            owned("stderr", "\x1b[2J\0\u{fffd}"),
        ],
        "{log}"
    );
}

#[tokio::test]
async fn one_server_per_data_dir_and_a_crash_frees_it() {
    let dir = data_dir("lock");
    let first = start(&dir, &[]);
    let out = common::run_weir(&[
        "serve",
        guest("hello").to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("in use by another weir (pid {})", first.pid())),
        "{}",
        out.stderr
    );
    first.signal("KILL");
    drop(first);
    let again = start(&dir, &[]);
    assert_eq!(again.get("/hello").await.status, 200);
}

#[tokio::test]
async fn actor_addresses_are_exact() {
    let dir = data_dir("address");
    let weir = start(&dir, &[]);
    assert_eq!(weir.get("/p/v1/incr").await.text(), "1");
    for authority in [
        "v1.probe.actor.internal:80",
        "v1.probe.actor.internal.",
        "evil@v1.probe.actor.internal",
    ] {
        let r = weir
            .get(&format!("/raw?authority={authority}&path=/incr"))
            .await
            .json();
        // Either the guest's HTTP library refuses the authority, or Weir
        // answers it as an invalid address; nothing reaches the actor.
        let refused = r["error"].is_string()
            || (r["status"] == 400
                && r["body"]
                    .as_str()
                    .unwrap()
                    .contains("actor_address_invalid"));
        assert!(refused, "{authority}: {r}");
    }
    assert_eq!(weir.get("/p/v1/get?key=n").await.text(), "1", "no call ran");
    // Names built from user input cannot redirect a call to another class.
    let gateway = guest("gateway");
    let probe = format!("probe={}", guest("actor_probe").display());
    let dir2 = data_dir("address-gateway");
    let gw = Weir::start_with(&[
        gateway.to_str().unwrap(),
        "--data-dir",
        dir2.to_str().unwrap(),
        "--actor",
        &probe,
    ]);
    for name in ["x.hostile.actor.internal%2F", "a@b", "a:1"] {
        let r = gw.get(&format!("/probe/{name}/incr")).await;
        assert_eq!(r.status, 502, "{name}");
        assert!(
            r.headers["x-call-error"]
                .to_str()
                .unwrap()
                .contains("actor name"),
            "{name}"
        );
    }
}
