//! The doors for operators, from outside: a real `weir serve` and the
//! `weir` commands. The admin address keeps serving its operators through
//! a flood of idle and token-less connections, shows only health without
//! the token, and refuses a `Host` a web page could rebind; the data dir
//! is this user's alone, and a planted one, or a planted token, is
//! refused; the commands never take the token on their command line nor
//! send it to an address no server recorded; and what a guest chose
//! reaches the operator's terminal as text.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::Value;

use common::actors::{data_dir, post, start};
use common::{Weir, run_weir, send_to, weir_command};

/// The number of file descriptors the server holds open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// `host: value` to the admin address, without the token.
async fn with_host(weir: &Weir, path: &str, host: &str) -> common::Resp {
    let admin = weir.admin.unwrap();
    send_to(
        admin,
        Request::get(path)
            .header("host", host)
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_and_tokenless_connections_crowds_no_operator_out() {
    let dir = data_dir("admin-flood");
    let weir = start(&dir, &[]);
    assert_eq!(post(&weir, "/probe/a/incr", Vec::new()).await.text(), "1");
    let admin = weir.admin.unwrap();
    let before = open_fds(weir.pid());
    // 2,000 connections that say nothing, and 2,000 that ask for the
    // status without the token and then keep their connection.
    let mut held = Vec::new();
    for _ in 0..2000 {
        held.push(TcpStream::connect(admin).unwrap());
    }
    for _ in 0..2000 {
        let mut s = TcpStream::connect(admin).unwrap();
        s.write_all(format!("GET /status HTTP/1.1\r\nhost: {admin}\r\n\r\n").as_bytes())
            .unwrap();
        held.push(s);
    }
    // The operator still gets in, with the token, and the app serves.
    let r = weir.admin_get("/actors/probe/a").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(weir.admin_get("/healthz").await.status, 200);
    assert_eq!(post(&weir, "/probe/a/incr", Vec::new()).await.text(), "2");
    // The server keeps a bounded number of them open, not 4,000.
    let now = open_fds(weir.pid());
    assert!(
        now < before + 300,
        "{now} descriptors open with 4,000 connections held (before: {before})"
    );
    // A connection that said nothing was closed.
    let mut first = held.remove(0);
    first
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(first.read(&mut buf).unwrap_or(0), 0, "closed, unanswered");
}

#[tokio::test]
async fn status_without_the_token_is_health_only_and_a_foreign_host_is_refused() {
    let dir = data_dir("admin-host");
    let weir = start(&dir, &[]);
    post(&weir, "/probe/a/incr", Vec::new()).await;
    let admin = weir.admin.unwrap().to_string();
    // Without the token: health, and nothing else.
    let r = with_host(&weir, "/status", &admin).await;
    assert_eq!(r.status, 200);
    let status = r.json();
    assert_eq!(status["healthy"], true, "{status}");
    let keys: Vec<&String> = status.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["full", "healthy"], "{status}");
    // With it: the whole document.
    let full = weir.status().await;
    assert!(full["apps"].is_array(), "{full}");
    // A Host that is a name other than localhost: a page that rebound its
    // name to this address. Refused, with or without the token.
    for path in ["/status", "/metrics", "/healthz"] {
        with_host(&weir, path, "rebound.example:80")
            .await
            .assert_weir_error(421, "admin_host_refused");
        let r = with_host(&weir, path, "localhost").await;
        assert_eq!(r.status, 200, "{path}");
        let r = with_host(&weir, path, "[::1]:9").await;
        assert_eq!(r.status, 200, "{path}");
    }
    let token = weir.token.clone().unwrap();
    let r = send_to(
        weir.admin.unwrap(),
        Request::get("/actors")
            .header("host", "rebound.example")
            .header("authorization", format!("Bearer {token}"))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    r.assert_weir_error(421, "admin_host_refused");
}

#[tokio::test]
async fn the_data_dir_is_this_users_alone_and_a_planted_one_is_refused() {
    // Made 0700, and so is the lock file's content private.
    let made = data_dir("private");
    let weir = start(&made, &[]);
    assert_eq!(mode(&made), 0o700);
    assert_eq!(mode(&made.join("admin-token")), 0o600);
    drop(weir);
    // One that others may read is closed to them.
    let open = data_dir("readable");
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let weir = start(&open, &[]);
    assert_eq!(mode(&open), 0o700);
    drop(weir);
    // One that others may write, or that another user owns: refused, and
    // nothing in it is trusted.
    let writable = data_dir("writable");
    std::fs::create_dir_all(&writable).unwrap();
    std::fs::set_permissions(&writable, std::fs::Permissions::from_mode(0o777)).unwrap();
    let probe = common::probe();
    let out = run_weir(&[
        "serve",
        probe.to_str().unwrap(),
        "--data-dir",
        writable.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("others may write it"), "{}", out.stderr);
    assert!(!writable.join("admin-token").exists());
    let out = common::output_within(
        weir_command()
            .args(["images", "list", "--data-dir"])
            .arg(&writable),
        common::EXITS_WITHIN,
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("others may write it"));
    let theirs = data_dir("theirs");
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
    chown_nobody(&theirs);
    let out = run_weir(&[
        "serve",
        probe.to_str().unwrap(),
        "--data-dir",
        theirs.to_str().unwrap(),
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("not by this user"), "{}", out.stderr);
    // A token planted in a data dir of ours: another user's, one others
    // may read, or a link.
    for (name, plant) in [
        ("token-theirs", Plant::Theirs),
        ("token-readable", Plant::Readable),
        ("token-link", Plant::Link),
    ] {
        let dir = data_dir(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let token = dir.join("admin-token");
        match plant {
            Plant::Theirs => {
                std::fs::write(&token, "known-to-them").unwrap();
                std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
                chown_nobody(&token);
            }
            Plant::Readable => {
                std::fs::write(&token, "known-to-them").unwrap();
                std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
            }
            Plant::Link => {
                let target = dir.with_extension("their-token");
                std::fs::write(&target, "known-to-them").unwrap();
                std::os::unix::fs::symlink(&target, &token).unwrap();
            }
        }
        let out = run_weir(&[
            "serve",
            probe.to_str().unwrap(),
            "--admin",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ]);
        assert_eq!(out.code, Some(1), "{name}: {}", out.stderr);
        assert!(out.stderr.contains("admin token"), "{name}: {}", out.stderr);
    }
}

enum Plant {
    Theirs,
    Readable,
    Link,
}

fn chown_nobody(path: &Path) {
    let ok = std::process::Command::new("chown")
        .arg("nobody")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(
        ok,
        "chown nobody {} (the tests run as root)",
        path.display()
    );
}

#[tokio::test]
async fn the_commands_take_no_token_on_their_command_line_and_send_it_only_where_a_server_said() {
    let dir = data_dir("cli-doors");
    let weir = start(&dir, &[]);
    post(&weir, "/probe/a/incr", Vec::new()).await;
    let actors = |args: &[&str], env: &[(&str, &str)]| {
        let mut all = vec!["actors"];
        all.extend_from_slice(args);
        let mut command = weir_command();
        command.args(&all).env_remove("WEIR_ADMIN_TOKEN");
        for (k, v) in env {
            command.env(k, v);
        }
        common::output_within(&mut command, common::EXITS_WITHIN)
    };
    let data = dir.to_str().unwrap();
    // The token on the command line: refused, naming why.
    let out = actors(&["--data-dir", data, "--token", "x", "list"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/proc/*/cmdline"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // No --admin: the address the server running on the data dir recorded.
    let out = actors(&["--data-dir", data, "list", "--json"], &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["actors"][0]["name"], "a");
    // A token from a file.
    let token_file = dir.with_extension("token");
    std::fs::write(&token_file, weir.token.as_ref().unwrap()).unwrap();
    let admin = weir.admin.unwrap().to_string();
    let elsewhere = data_dir("cli-elsewhere");
    let out = actors(
        &[
            "--admin",
            &admin,
            "--data-dir",
            elsewhere.to_str().unwrap(),
            "--token-file",
            token_file.to_str().unwrap(),
            "list",
        ],
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A data dir no server runs on, holding a token: no address to send it
    // to, and nothing is sent anywhere.
    let stopped = data_dir("cli-stopped");
    drop(start(&stopped, &[]));
    let out = actors(&["--data-dir", stopped.to_str().unwrap(), "list"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no admin address"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_guests_timer_reason_reaches_the_operators_terminal_as_text() {
    let dir = data_dir("escapes");
    let weir = start(&dir, &[]);
    // Clear the screen, set the window title, write the clipboard (OSC
    // 52), a C1 control sequence, and reverse what follows.
    let reason = "\u{1b}[2J\u{1b}]0;owned\u{7}\u{1b}]52;c;aGk=\u{7}\u{9b}31m\u{202e}evil\n\r";
    let r = post(
        &weir,
        "/probe/esc/schedule?in_ms=3600000",
        reason.as_bytes().to_vec(),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let admin = weir.admin.unwrap().to_string();
    let inspect = |json: bool| {
        let mut args = vec!["actors", "--admin", &admin, "--data-dir"];
        args.push(dir.to_str().unwrap());
        args.extend(["inspect", "probe", "esc"]);
        if json {
            args.push("--json");
        }
        common::stdout_of(common::output_within(
            weir_command().args(&args),
            common::EXITS_WITHIN,
        ))
    };
    for json in [false, true] {
        let out = inspect(json);
        let acting: Vec<char> = out
            .chars()
            .filter(|c| {
                (c.is_control() && *c != '\n')
                    || matches!(*c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
            })
            .collect();
        assert!(acting.is_empty(), "json: {json}: {acting:?} in\n{out}");
    }
    let table = inspect(false);
    assert!(table.contains("\\u{1b}[2J"), "{table}");
    // The JSON still says exactly what the guest chose.
    let detail: Value = serde_json::from_str(&inspect(true)).unwrap();
    assert_eq!(detail["timers"][0]["reason"], reason);
}
