//! The chat example in a real browser: headless Chromium (Debian's
//! `chromium`, driven by playwright-core from npm) opens two pages of the
//! page the worker serves; they join one room (an actor owning both
//! WebSockets) and exchange messages. The room's code is then replaced:
//! both pages see 1012, come back by themselves, find the history once,
//! and chat on. The test asserts on each page's DOM text and saves a
//! screenshot to `target/test-artifacts/chat.png`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Weir, root};
use serde_json::Value;

/// The playwright-core release the test drives Chromium with.
const PLAYWRIGHT_VERSION: &str = "1.64.1";

/// Where playwright-core is installed (from npm, the first time).
fn playwright() -> PathBuf {
    let dir = root().join(format!("target/tools/playwright-{PLAYWRIGHT_VERSION}"));
    let modules = dir.join("node_modules");
    if !modules.join("playwright-core/package.json").is_file() {
        std::fs::create_dir_all(&dir).unwrap();
        let status = common::status_within(
            Command::new("npm")
                .args([
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--loglevel=error",
                    "--prefix",
                ])
                .arg(&dir)
                .arg(format!("playwright-core@{PLAYWRIGHT_VERSION}")),
            common::FETCHES_WITHIN,
        );
        assert!(
            status.success(),
            "npm install playwright-core@{PLAYWRIGHT_VERSION}"
        );
    }
    modules
}

#[tokio::test]
async fn two_browser_pages_chat_through_a_room_actor() {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&chromium).is_file(),
        "{chromium} is missing: install Debian's chromium (.ci/run does) or set CHROMIUM"
    );
    let modules = playwright();
    let room = common::guest("chat_room");
    let actor = format!("room={}", room.display());
    let weir = Weir::start(
        &common::guest("chat"),
        &["--actor", &actor, "--actor-route", "room=/rooms"],
    );
    let artifacts = root().join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let screenshot = artifacts.join("chat.png");
    let _ = std::fs::remove_file(&screenshot);
    let mut script = Command::new("node")
        .arg(root().join("crates/weir/tests/browser/chat.mjs"))
        .arg(format!("http://{}", weir.addr))
        .arg(&screenshot)
        .env("NODE_PATH", &modules)
        .env("CHROMIUM", &chromium)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node runs");
    // The script takes tens of seconds; one that hangs is killed, which
    // ends its output and fails the test below.
    let _watchdog = common::kill_after(&script, Duration::from_secs(5 * 60));
    let mut said = BufReader::new(script.stdout.take().unwrap()).lines();
    let mut next_json = move || -> Option<Value> {
        said.by_ref()
            .map_while(Result::ok)
            .find(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(&l).unwrap())
    };
    let failed = |script: std::process::Child| -> String {
        let out = script.wait_with_output().unwrap();
        format!(
            "the browser script failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let Some(first) = next_json() else {
        panic!("{}", failed(script))
    };
    let pages = &first["exchanged"];
    for page in ["ada", "bob"] {
        let log = pages[page]["log"].as_str().unwrap();
        assert!(log.contains("ada: hello from ada"), "{page}: {log}");
        assert!(log.contains("bob: hi ada"), "{page}: {log}");
        assert_eq!(pages[page]["presence"], "here: ada, bob", "{page}");
        assert_eq!(pages[page]["status"], format!("in browser as {page}"));
    }
    let png = std::fs::read(&screenshot).expect("the screenshot was saved");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");

    // The room's code replaced under both pages: they come back by
    // themselves, each history shown once, and chat on.
    let bytes = std::fs::read(&room).unwrap();
    let done = common::apps::deploy(&weir, "chat", &bytes, "?class=room&label=room-2").await;
    assert_eq!(done.status, 200, "{:?}", done.body);
    let mut stdin = script.stdin.take().unwrap();
    stdin.write_all(b"deployed\n").unwrap();
    drop(stdin);
    let Some(last) = next_json() else {
        panic!("{}", failed(script))
    };
    assert!(script.wait().unwrap().success());
    for page in ["ada", "bob"] {
        assert_eq!(
            last["closed"][page], "reconnecting in 0.5 s (1012: the code was updated)",
            "{page}"
        );
        let after = &last["after"][page];
        let log = after["log"].as_str().unwrap();
        assert_eq!(
            log.matches("ada: hello from ada").count(),
            1,
            "{page}: {log}"
        );
        assert!(log.contains("ada: back again"), "{page}: {log}");
        assert_eq!(after["status"], format!("in browser as {page}"));
        assert_eq!(after["presence"], "here: ada, bob", "{page}");
    }
    // Both messages are in the room's storage.
    let history = weir.get("/rooms/browser/history").await.json();
    let texts: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["hello from ada", "hi ada", "back again"]);
}
