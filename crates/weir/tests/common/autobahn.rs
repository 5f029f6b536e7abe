//! The Autobahn fuzzing client (its cases, as `kosoku` from PyPI runs
//! them), installed on first use into `target/tools/` and run against a
//! WebSocket URL.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

/// The kosoku release the conformance results are recorded with.
pub const KOSOKU_VERSION: &str = "0.1.0";

/// The `kosoku` command, installed into a venv of its own if missing.
pub fn kosoku() -> PathBuf {
    super::pip_tool("kosoku", KOSOKU_VERSION, "kosoku")
}

/// What a run said, case by case.
#[derive(Debug)]
pub struct Report {
    /// Cases whose behaviour was OK, NON-STRICT or INFORMATIONAL.
    pub passed: usize,
    /// Cases outside the compression sections (12, 13) that failed, with
    /// their verdicts.
    pub failed: Vec<String>,
    /// Compression cases, not offered by Weir (UNIMPLEMENTED).
    pub unimplemented: usize,
}

/// Runs every case but compression's against `url`.
pub fn run(kosoku: &PathBuf, url: &str) -> Report {
    let out = tempdir();
    let address = url.trim_start_matches("ws://");
    // The whole suite of cases takes about a minute here.
    let status = super::status_within(
        Command::new(kosoku)
            .args(["-x", "12.*", "-x", "13.*", "-p", "2", "-o"])
            .arg(&out)
            .arg(url),
        Duration::from_secs(10 * 60),
    );
    let index: Value = serde_json::from_slice(
        &std::fs::read(out.join("index.json")).expect("kosoku wrote index.json"),
    )
    .expect("index.json is JSON");
    let cases = index
        .as_object()
        .and_then(|agents| agents.values().next())
        .and_then(Value::as_object)
        .unwrap_or_else(|| panic!("no cases for {address} in {index}"));
    let mut report = Report {
        passed: 0,
        failed: Vec::new(),
        unimplemented: 0,
    };
    for (case, verdict) in cases {
        let behavior = verdict["behavior"].as_str().unwrap_or("?");
        let close = verdict["behaviorClose"].as_str().unwrap_or("?");
        let ok = |b: &str| matches!(b, "OK" | "NON-STRICT" | "INFORMATIONAL");
        if behavior == "UNIMPLEMENTED" {
            report.unimplemented += 1;
        } else if ok(behavior) && ok(close) {
            report.passed += 1;
        } else {
            report.failed.push(format!("{case}: {behavior}/{close}"));
        }
    }
    assert!(
        status.success() || !report.failed.is_empty(),
        "kosoku failed with every case passing"
    );
    report
}

fn tempdir() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = weir_scratch::dir(&format!("autobahn-{n}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
