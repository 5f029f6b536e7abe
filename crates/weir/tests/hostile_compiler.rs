//! A component built to exhaust the compiler, from outside: deployed,
//! served at start and pushed as an image under a small
//! `compile_memory_limit_bytes`, and a server killed while its compiler
//! runs. Each test names what must hold: the compiler is stopped at its
//! limit and named, the server never holds its memory, and no compiler
//! outlives its server. The other memory doors are in `hostile_memory.rs`.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use common::hostile::*;
use common::*;

/// A server of app `site` (the hello guest, routes `/`) with its own data
/// dir and the admin address, for deploys.
fn hello_site(name: &str, extra: &[&str]) -> (Weir, PathBuf) {
    let file = apps::config_file(
        name,
        &apps::app_section("site", &guest("hello"), &["/"], ""),
    );
    let data = weir_scratch::dir(&format!("{name}-data"));
    let mut args = vec![
        "--config",
        file.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    (Weir::start_with(&args), data)
}

/// The files of a data dir's code cache.
fn artifacts(data: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(data.join("code"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// The processes `pid` started that still run.
fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(list) = std::fs::read_to_string(task.unwrap().path().join("children")) else {
            continue;
        };
        found.extend(
            list.split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_built_to_exhaust_the_compiler_is_refused_at_the_compilers_memory_limit() {
    let bomb = std::fs::read(compile_bomb(2, 100_000)).unwrap();
    let (weir, data) = hello_site("compile-bomb", &["--limit", COMPILER_LIMIT]);
    let pid = weir.pid();
    reset_peak(pid);
    let before = proc_kib(pid, "VmHWM:");
    // Watch the compiler processes from outside while the deploy runs.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        std::thread::spawn(move || {
            let (mut peak_kib, mut seen) = (0u64, 0usize);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for child in children(pid) {
                    let Ok(status) = std::fs::read_to_string(format!("/proc/{child}/status"))
                    else {
                        continue;
                    };
                    let anon = status
                        .lines()
                        .find_map(|l| l.strip_prefix("RssAnon:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
                    if let Some(kib) = anon {
                        seen += 1;
                        peak_kib = peak_kib.max(kib);
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            (peak_kib, seen)
        })
    };
    let refused = apps::deploy(&weir, "site", &bomb, "").await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (compiler_peak_kib, samples) = watcher.join().unwrap();
    eprintln!(
        "compiler peak seen: {} MiB over {samples} looks",
        compiler_peak_kib / 1024
    );
    refused.assert_weir_error(422, "component_refused");
    let message = refused.json()["message"].as_str().unwrap().to_string();
    assert!(message.contains(COMPILER_REFUSAL), "{message}");
    // The compiler was seen, and was stopped near its limit (it grows a few
    // MiB between two of the server's looks), far from the 1 GB it wanted.
    assert!(samples > 0, "no compiler process was seen");
    assert!(
        compiler_peak_kib < (256 + 128) * 1024,
        "the compiler reached {} MiB",
        compiler_peak_kib / 1024
    );
    // It is gone, it left no artifact, and the server itself never held
    // its memory.
    assert_eq!(children(pid), Vec::<u32>::new());
    let code = artifacts(&data);
    assert_eq!(
        code.len(),
        1,
        "only the serving version's artifact: {code:?}"
    );
    let grown = proc_kib(pid, "VmHWM:").saturating_sub(before);
    assert!(grown < 64 * 1024, "the server grew by {} MiB", grown / 1024);
    // The old version serves on, and a real component compiles within the
    // same limit: the bound is not "never".
    assert_eq!(weir.get("/").await.text(), apps::V1);
    let next = std::fs::read(guest("hello_next")).unwrap();
    assert_eq!(apps::deploy(&weir, "site", &next, "").await.status, 200);
    assert_eq!(weir.get("/").await.text(), apps::V2);
}

#[test]
fn a_server_whose_component_exhausts_the_compiler_does_not_start_and_says_why() {
    let bomb = compile_bomb(2, 100_000);
    let data = weir_scratch::dir("compile-bomb-start");
    let out = run_weir(&[
        "serve",
        bomb.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
        "--limit",
        COMPILER_LIMIT,
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains(COMPILER_REFUSAL), "{}", out.stderr);
    let code: Vec<_> = std::fs::read_dir(data.join("code")).unwrap().collect();
    assert!(code.is_empty(), "{code:?}");
    let _ = std::fs::remove_dir_all(&data);
}

/// True once process `pid` has ended (gone, or a zombie not yet reaped).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name in parentheses.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_while_it_compiles_leaves_no_compiler_running() {
    // Within the default limit the bomb compiles, in seconds and about
    // 1 GB: long enough to kill the server meanwhile. An orphaned compiler
    // would finish and write its artifact; a compiler that dies with its
    // server writes nothing.
    let bomb = std::fs::read(compile_bomb(2, 100_000)).unwrap();
    let (weir, data) = hello_site("compile-orphan", &[]);
    let pid = weir.pid();
    // The deploy's connection dies with the server: sent as a try.
    let deploying = {
        let (admin, token) = (weir.admin.unwrap(), weir.token.clone().unwrap());
        let request = Request::post("/apps/site/deploy")
            .header("host", admin.to_string())
            .header("authorization", format!("Bearer {token}"))
            .body(Full::new(Bytes::from(bomb)))
            .unwrap();
        tokio::spawn(try_send_to(admin, request))
    };
    let compiler = wait_for("the compiler process", || async {
        children(pid)
            .first()
            .copied()
            .ok_or("not started".to_string())
    })
    .await;
    weir.signal("KILL");
    assert!(
        deploying.await.unwrap().is_err(),
        "the deploy was not answered"
    );
    wait_for("the compiler to end", || async {
        if ended(compiler) {
            Ok(())
        } else {
            Err("running".to_string())
        }
    })
    .await;
    let code = artifacts(&data);
    assert_eq!(
        code.len(),
        1,
        "the compiler wrote nothing after its server died: {code:?}"
    );
}
