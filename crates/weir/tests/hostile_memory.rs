//! A hostile tenant's reach into the host's memory, from outside: the
//! `hostile` guest (as the app and as an actor class) recurses until its
//! stack runs out, makes the host hold header maps, unsent bodies and
//! unread actor responses through its handles, grows 200 actors against
//! the total budget, asks for one giant table and hands programs' runs
//! more than the budget holds, against a real `weir serve`. Each test
//! names what must hold. The other doors are in `hostile.rs`,
//! `hostile_clients.rs`, `hostile_storage.rs` and `hostile_compiler.rs`.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::{Value, json};

use common::hostile::*;
use common::programs;
use common::*;

#[tokio::test]
async fn a_guest_that_runs_out_of_stack_is_abandoned_and_everyone_else_serves_on() {
    let dir = data_dir("stack");
    let weir = start(&dir, &[]);
    assert_eq!(weir.get("/p/victim/incr").await.text(), "1");
    // Unbounded recursion, as the worker and as an actor, four of each at
    // once: each is stopped at the engine's stack limit by a trap (not a
    // crash of the host thread it runs on), and named.
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let (addr, path) = (
                weir.addr,
                if i % 2 == 0 {
                    "/recurse".to_string()
                } else {
                    format!("/h/deep{i}/recurse")
                },
            );
            tokio::spawn(async move {
                let req = Request::get(path.as_str())
                    .header("host", "x")
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                (path, send_to(addr, req).await)
            })
        })
        .collect();
    for call in calls {
        let (path, r) = call.await.unwrap();
        assert_eq!(r.status, 503, "{path}: {:?}", r.body);
        r.assert_weir_error(503, "instance_abandoned");
    }
    let worker = weir
        .receipt_where(|r| r["outcome"] == "trap" && r["error"] == "instance_abandoned")
        .await;
    assert!(
        worker["detail"].as_str().unwrap_or("").contains("stack"),
        "the receipt says what ran out: {worker}"
    );
    let actor = weir
        .actor_receipt_where(|r| r["class"] == "hostile" && r["error"] == "instance_abandoned")
        .await;
    assert!(
        actor["detail"].as_str().unwrap_or("").contains("stack"),
        "the turn's receipt says what ran out: {actor}"
    );
    // The server, the same app, the same actor and a neighbour all serve on.
    assert_eq!(weir.get("/hello").await.json(), json!("still here"));
    assert_eq!(weir.get("/h/deep1/hello").await.json(), json!("still here"));
    assert_eq!(weir.get("/p/victim/incr").await.text(), "2");
}

#[tokio::test]
async fn what_a_guest_holds_in_the_host_through_handles_counts_against_its_memory_limit() {
    const LIMIT: u64 = 32 << 20;
    let dir = data_dir("handles");
    let weir = start(
        &dir,
        &[
            "--limit",
            &format!("memory_limit_bytes={LIMIT}"),
            "--limit",
            "event_limit_ms=30000",
        ],
    );
    assert_eq!(weir.get("/p/victim/incr").await.text(), "1");
    let pid = weir.pid();
    // 2,000 header maps of 100 KiB each, about 200 MiB of host memory
    // (what one request made the host hold before); 2,000 maps of 3,000
    // empty values each, no bytes of header but an entry of the host's map
    // per value (446 MiB held by one request before they were counted);
    // 64 KiB written into each of 2,000 bodies of responses never sent;
    // and 200 responses of 4 MiB from an actor's internal calls, kept with
    // their bodies unread (868 MB held by one request before they were
    // counted): from a guest whose own linear memory stays near 1 MiB, as
    // the worker and as an actor.
    for path in [
        "/fields?n=2000&kb=100",
        "/h/holder/fields?n=2000&kb=100",
        "/fields?n=2000&kb=0&values=3000",
        "/h/holder/fields?n=2000&kb=0&values=3000",
        "/bodies?n=2000&kb=64",
        "/h/holder/bodies?n=2000&kb=64",
        "/hoard?n=200&mb=4",
        "/h/holder/hoard?n=200&mb=4",
    ] {
        reset_peak(pid);
        let before = proc_kib(pid, "VmRSS:");
        weir.get(path)
            .await
            .assert_weir_error(503, "memory_limit_exceeded");
        // The peak can read below `before`: the peak was reset to the RSS
        // of a moment earlier, and memory the last path's instance held may
        // have gone back since.
        let grown_mib = proc_kib(pid, "VmHWM:").saturating_sub(before) >> 10;
        assert!(
            grown_mib < 2 * (LIMIT >> 20),
            "{path}: the server's peak grew by {grown_mib} MiB for a guest limited to {} MiB",
            LIMIT >> 20
        );
    }
    let worker = weir
        .receipt_where(|r| r["error"] == "memory_limit_exceeded")
        .await;
    let detail = worker["detail"].as_str().unwrap();
    assert!(
        detail.contains("bytes in the host (headers, unsent bodies and unread responses)"),
        "{detail}"
    );
    let actor = weir
        .actor_receipt_where(|r| r["name"] == "holder" && r["error"] == "memory_limit_exceeded")
        .await;
    assert!(
        actor["detail"]
            .as_str()
            .unwrap()
            .contains("in the host (headers, unsent bodies and unread responses)"),
        "{actor}"
    );
    // Empty handles cost no header bytes, but each is an entry in the
    // host's table: their number is bounded too.
    let flood = weir.get("/fields?n=2000000&kb=0").await;
    flood.assert_weir_error(503, "instance_abandoned");
    let full = weir
        .receipt_where(|r| r["error"] == "instance_abandoned")
        .await;
    assert!(
        full["detail"].as_str().unwrap().contains("resource table"),
        "{full}"
    );
    // Within the limit nothing is refused, and everyone serves on.
    assert_eq!(weir.get("/fields?n=100&kb=100").await.json()["made"], 100);
    assert_eq!(weir.get("/bodies?n=100&kb=64").await.json()["made"], 100);
    assert_eq!(weir.get("/hoard?n=2&mb=4").await.json()["kept"], 2);
    assert_eq!(weir.get("/hello").await.json(), json!("still here"));
    assert_eq!(weir.get("/p/victim/incr").await.text(), "2");
}

#[tokio::test]
async fn two_hundred_actors_growing_100_mib_fit_a_2_gib_budget() {
    const BUDGET: u64 = 2 << 30;
    const ACTORS: usize = 200;
    const CONNECTIONS: usize = 16;
    let dir = data_dir("budget");
    let gateway = guest("gateway");
    let probe = format!("probe={}", guest("actor_probe").display());
    let budget = format!("max_total_guest_memory_bytes={BUDGET}");
    let weir = Arc::new(Weir::start_with(&[
        gateway.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
        "--actor",
        &probe,
        "--limit",
        &budget,
        "--limit",
        "event_limit_ms=30000",
    ]));
    let pid = weir.pid();
    let baseline = proc_kib(pid, "VmRSS:");
    reset_peak(pid);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let (weir, next) = (weir.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= ACTORS {
                    return answers;
                }
                let r = weir
                    .send(
                        Request::post(format!("/probe/m{i}/grow?mb=100"))
                            .body(Full::new(Bytes::new()))
                            .unwrap(),
                    )
                    .await;
                answers.push((r.status.as_u16(), r.body.unwrap_or_default()));
            }
        }));
    }
    let (mut grown, mut refused) = (0, 0);
    for t in tasks {
        for (status, body) in t.await.unwrap() {
            match status {
                200 => grown += 1,
                503 => {
                    let v: Value = serde_json::from_slice(&body).unwrap();
                    assert_eq!(v["error"], "memory_budget_exceeded", "{v}");
                    refused += 1;
                }
                other => panic!("{other}: {}", String::from_utf8_lossy(&body)),
            }
        }
    }
    let peak = proc_kib(pid, "VmHWM:");
    let status = weir.admin_get("/actors").await.json()["status"].clone();
    println!(
        "{grown} actors grew 100 MiB, {refused} refused memory_budget_exceeded; RSS baseline {baseline} KiB, peak {peak} KiB (budget {} KiB); {} hibernations",
        BUDGET / 1024,
        status["hibernations"]
    );
    // Idle actors were hibernated to make room: far more grew than fit at
    // once.
    assert!(grown > 40, "{grown} grew");
    assert_eq!(grown + refused, ACTORS);
    // Stated overhead: the server itself, and allocator slack.
    const OVERHEAD_KIB: u64 = 512 * 1024;
    assert!(
        peak < baseline + BUDGET / 1024 + OVERHEAD_KIB,
        "peak {peak} KiB over baseline {baseline} + budget + {OVERHEAD_KIB} KiB"
    );
    let metrics = weir.admin_get("/metrics").await.text();
    assert!(
        metrics.contains("weir_guest_memory_budget_bytes"),
        "{metrics}"
    );
}

/// The table bomb with GROW_BY elements, as a component file.
fn table_bomb(grow_by: u64) -> PathBuf {
    let wat = std::fs::read_to_string(root().join("guests/wat/table-bomb.wat"))
        .unwrap()
        .replace("GROW_BY", &grow_by.to_string());
    let path = weir_scratch::dir("table-bomb.wasm");
    std::fs::write(&path, wat::parse_str(&wat).unwrap()).unwrap();
    path
}

#[tokio::test]
async fn one_table_grow_cannot_make_the_host_allocate_without_bound() {
    let dir = data_dir("table");
    let bomb = table_bomb(100_000_000);
    let class = format!("bomb={}", bomb.display());
    let weir = Weir::start_with(&[
        bomb.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
        "--actor",
        &class,
        "--actor-route",
        "bomb=/b",
    ]);
    let pid = weir.pid();
    let before = proc_kib(pid, "VmRSS:");
    reset_peak(pid);
    // Refused growth returns -1 and the guest traps: on the workers'
    // engine (pooled tables) and on the actors' (tables on demand).
    weir.get("/")
        .await
        .assert_weir_error(503, "instance_abandoned");
    weir.get("/b/x/")
        .await
        .assert_weir_error(503, "instance_abandoned");
    let peak = proc_kib(pid, "VmHWM:");
    assert!(
        peak < before + 64 * 1024,
        "a table grow made the server hold {} MiB",
        (peak - before) / 1024
    );
    // A modest table still grows (the bound is not "never").
    let small = table_bomb(1000);
    let weir = Weir::start(&small, &[]);
    weir.get("/")
        .await
        .assert_weir_error(502, "invalid_response");
}

/// A runner server for the runs' memory test, under a 160 MiB guest
/// memory budget, with `extra` limits.
async fn run_budget_server(name: &str, extra: &[&str]) -> (Weir, String) {
    let data = weir_scratch::dir(name);
    let mut limits = vec![
        "max_total_guest_memory_bytes=167772160",
        "memory_limit_bytes=33554432",
        "run_time_limit_ms=3000",
        "event_limit_ms=30000",
    ];
    limits.extend_from_slice(extra);
    let weir = programs::serve_runner(&data, &limits);
    let digest = programs::push_image(&weir, std::path::Path::new(&programs::cmdprobe())).await;
    (weir, digest)
}

/// How a run came out: ran (to its run time), refused by the budget
/// (the message or the stopped reason), or something else.
fn run_outcome(r: &Resp) -> &'static str {
    let body = r.json();
    let message = body["message"].as_str().unwrap_or_default();
    match r.status.as_u16() {
        200 if body["stopped"] == "run_time_limit_exceeded" => "ran",
        429 if message.starts_with("memory_budget_exceeded: the run would hold") => "held out",
        // The actor, or the run's program, refused growth on the way.
        200 if body["stopped"] == "memory_budget_exceeded" => "budget",
        503 if body["error"] == "memory_budget_exceeded" => "budget",
        _ => "other",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_runs_hold_in_the_host_is_held_out_of_the_guest_memory_budget() {
    // Six actors at once each hand a run an 8 MiB environment variable and
    // let it spin for its whole run time. The host holds each run's
    // environment (and arguments and stdin), and up to max_run_output_bytes
    // (16 MiB) of its output, beside the actor's own copy: counted (24 MiB
    // a run), six such runs do not fit a 160 MiB budget beside their actors
    // and take turns in it; uncounted, the budget saw a third of what they
    // held.
    const RUNS: usize = 6;
    let (weir, digest) = run_budget_server("run-budget", &[]).await;
    let runs: Vec<_> = (0..RUNS)
        .map(|i| {
            let (addr, path) = (
                weir.addr,
                format!("/r/run{i}/run/{digest}?arg=spin&pad={}", 8 << 20),
            );
            tokio::spawn(async move {
                let req = Request::post(path.as_str())
                    .header("host", "x")
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                send_to(addr, req).await
            })
        })
        .collect();
    // While they run, the budget counts what their hosts hold: at least
    // four runs' 24 MiB.
    let counted = wait_for("the runs' holds in the budget", || async {
        let metrics = weir.admin_get("/metrics").await.text();
        let used: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("weir_guest_memory_bytes "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if used >= 4 * (24 << 20) {
            Ok(used)
        } else {
            Err(format!("{used} bytes"))
        }
    })
    .await;
    let mut outcomes = Vec::new();
    for run in runs {
        let r = run.await.unwrap();
        outcomes.push(run_outcome(&r));
        assert_ne!(
            outcomes.last(),
            Some(&"other"),
            "{}: {}",
            r.status,
            r.text()
        );
    }
    println!("{RUNS} runs of an 8 MiB environment at once: {outcomes:?}, {counted} bytes counted");
    // Past the budget a run waits for room, then is refused by name; none
    // fails otherwise, and the ones that fit run.
    assert!(outcomes.contains(&"ran"), "a run that fits runs");
    // Every hold was given back: a run fits again.
    assert_a_small_run_fits(&weir, &digest, "run0").await;

    // One run whose hold alone is over the budget (a 24 MiB environment
    // and up to 140 MiB of output): refused at once, before it loads,
    // naming the budget; with a small environment the same run fits
    // (another actor's: that one's memory still holds what it built).
    let (weir, digest) =
        run_budget_server("run-budget-one", &["max_run_output_bytes=146800640"]).await;
    let big = programs::call(
        &weir,
        "POST",
        &format!("/r/one/run/{digest}?arg=spin&pad={}", 24 << 20),
        b"",
    )
    .await;
    assert_eq!(
        run_outcome(&big),
        "held out",
        "{}: {}",
        big.status,
        big.text()
    );
    assert_a_small_run_fits(&weir, &digest, "two").await;
}

/// A run of `cat` with four bytes of stdin, by actor `name`, answers them.
async fn assert_a_small_run_fits(weir: &Weir, digest: &str, name: &str) {
    let path = format!("/r/{name}/run/{digest}?arg=cat");
    let ran = programs::call(weir, "POST", &path, b"fits").await;
    assert_eq!(ran.json()["stdout"], "fits", "{}", ran.text());
}
