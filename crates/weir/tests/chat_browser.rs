//! The chat example in a real browser: headless Chromium (Debian's
//! `chromium`, driven by playwright-core from npm) opens two pages of the
//! page the worker serves; they join one room (an actor owning both
//! WebSockets) and exchange messages. The test asserts on each page's DOM
//! text and saves a screenshot to `target/test-artifacts/chat.png`.

mod common;

use std::path::PathBuf;
use std::process::Command;

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
        let status = Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "--prefix",
            ])
            .arg(&dir)
            .arg(format!("playwright-core@{PLAYWRIGHT_VERSION}"))
            .status()
            .expect("npm runs");
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
    let out = Command::new("node")
        .arg(root().join("crates/weir/tests/browser/chat.mjs"))
        .arg(format!("http://{}", weir.addr))
        .arg(&screenshot)
        .env("NODE_PATH", &modules)
        .env("CHROMIUM", &chromium)
        .output()
        .expect("node runs");
    assert!(
        out.status.success(),
        "the browser script failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let pages: Value = serde_json::from_slice(
        out.stdout
            .split(|b| *b == b'\n')
            .find(|l| l.starts_with(b"{"))
            .expect("a JSON line"),
    )
    .unwrap();
    for page in ["ada", "bob"] {
        let log = pages[page]["log"].as_str().unwrap();
        assert!(log.contains("ada: hello from ada"), "{page}: {log}");
        assert!(log.contains("bob: hi ada"), "{page}: {log}");
        assert_eq!(pages[page]["presence"], "here: ada, bob", "{page}");
        assert_eq!(pages[page]["status"], format!("in browser as {page}"));
    }
    let png = std::fs::read(&screenshot).expect("the screenshot was saved");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    // Both messages are in the room's storage.
    let history = weir.get("/rooms/browser/history").await.json();
    let texts: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["hello from ada", "hi ada"]);
}
