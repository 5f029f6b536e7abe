//! Resident processes from outside: a real server, the `runner` actor as
//! owner, and the `resident` server spawned from the image store. Boot
//! once, requests through the owner intact, only the owner, kill and
//! failure loud, slots bounded and reused, refusals that name holders.
//! Storage slots are `storage_slots.rs`'s.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::programs::Owners;
use common::send_to;
use http::Request;
use http_body_util::Full;
use serde_json::Value;

fn all(headers: &http::HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_process_answers_its_owner_intact_and_started_once_across_twenty_requests() {
    let o = Owners::start("boot", &[]).await;
    let (pid, payload) = o
        .spawn("owner", "start=hello&arg=--port&arg=3000&env=MODE=dev")
        .await;
    assert_eq!(
        pid, 1_000_001,
        "pid_base + 1 of the owner's first incarnation"
    );
    assert_eq!(
        payload, "booted with hello",
        "spawn returned once start had"
    );

    for i in 0..20u32 {
        let method = ["POST", "PUT", "GET", "DELETE", "PATCH"][i as usize % 5];
        let body = if method == "GET" {
            Vec::new()
        } else {
            format!("body {i} ").repeat(i as usize + 1).into_bytes()
        };
        let status = [200, 201, 204, 400, 418, 500, 203][i as usize % 7];
        let req = Request::builder()
            .method(method)
            .uri(format!("/r/owner/proc/{pid}/echo?status={status}&i={i}"))
            .header("x-test", format!("value-{i}"))
            .header("x-multi", "one")
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap();
        let answer = o.weir.send(req).await;
        assert_eq!(
            answer.status.as_u16(),
            status as u16,
            "{i}: {:?}",
            answer.body
        );
        let h = &answer.headers;
        assert_eq!(
            h["x-method"],
            format!("Method::{}{}", &method[..1], method[1..].to_lowercase()).as_str()
        );
        assert_eq!(h["x-path"], format!("/echo?status={status}&i={i}").as_str());
        assert_eq!(h["x-echo-x-test"], format!("value-{i}").as_str());
        assert_eq!(h["x-echo-x-multi"], "one");
        assert_eq!(
            all(h, "set-cookie"),
            ["a=1; Path=/", "b=2; Path=/"],
            "two cookies, in order"
        );
        // A 204 carries no body, on this path as on every other.
        let expected: &[u8] = if status == 204 { b"" } else { &body };
        assert_eq!(answer.body.as_ref().unwrap().as_ref(), expected, "{i}");
    }
    let starts = o
        .call("GET", &format!("/r/owner/proc/{pid}/starts"), b"")
        .await
        .json();
    assert_eq!(starts["starts"], 1, "start ran once: {starts}");
    assert_eq!(starts["requests"], 21, "one instance served all of them");
    assert_eq!(starts["start_args"], "hello");
    assert_eq!(
        starts["args"],
        serde_json::json!([o.resident, "--port", "3000"])
    );
    assert_eq!(starts["env"], serde_json::json!([["MODE", "dev"]]));

    let status = o
        .call("GET", &format!("/r/owner/status/{pid}"), b"")
        .await
        .json();
    assert_eq!(status["state"], "running");
    assert_eq!(status["slot"], 0);
    assert_eq!(status["requests"], 21);
    assert_eq!(status["image"], o.resident.as_str());
    let ledger = o.weir.status().await["processes"].clone();
    assert_eq!(ledger["live"], 1, "{ledger}");
    assert_eq!(ledger["holders"][0]["owner"]["name"], "owner");
    assert_eq!(ledger["holders"][0]["pids"], serde_json::json!([pid]));
    assert_eq!(
        ledger["holders"][0]["images"],
        serde_json::json!([o.resident.as_str()]),
        "the images it holds"
    );
    assert_eq!(ledger["holders"][0]["peak"], 1);
    assert!(ledger["holders"][0]["memory_bytes"].as_u64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_reaches_its_process() {
    let o = Owners::start("owner-only", &[]).await;
    let (pid, _) = o.spawn("owner", "").await;
    assert_eq!(
        o.call("GET", &format!("/r/owner/proc/{pid}/starts"), b"")
            .await
            .status,
        200
    );
    // Another actor of the same class, and a worker: as if no such pid.
    for path in [
        format!("/r/other/proc/{pid}/starts"),
        format!("/proc/{pid}/starts"),
    ] {
        let answer = o.call("GET", &path, b"").await;
        answer.assert_weir_error(404, "process_not_found");
    }
    o.call("GET", "/r/owner/proc/99/starts", b"")
        .await
        .assert_weir_error(404, "process_not_found");
    o.call("GET", &format!("/r/owner/proc/0{pid}/starts"), b"")
        .await
        .assert_weir_error(400, "process_address_invalid");
    // The other actor's own view: no process of its.
    let list = o.call("GET", "/r/other/list", b"").await.json();
    assert_eq!(list, serde_json::json!([]));
    let status = o.call("GET", &format!("/r/other/status/{pid}"), b"").await;
    assert_eq!(status.json()["error"], "no-such-process");
    let kill = o
        .call("POST", &format!("/r/other/kill/{pid}"), b"")
        .await
        .json();
    assert_eq!(kill["killed"], false, "another actor cannot kill it");
    assert_eq!(
        o.call("GET", &format!("/r/owner/proc/{pid}/starts"), b"")
            .await
            .status,
        200
    );
    // A worker cannot spawn.
    let worker = o.call("POST", &format!("/spawn/{}", o.resident), b"").await;
    assert_eq!(worker.json()["error"], "not-an-actor");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_reaches_no_actor_and_not_weir_itself_so_it_cannot_close_a_cycle() {
    // The owner's turn waits on its process; a process that could call
    // the owner back (or any actor, or Weir's own listener) would hold
    // that turn until its deadline. Even with the patterns allowing
    // loopback and the owner's actor address, nothing it sends arrives.
    let data = weir_scratch::dir("processes-no-reach");
    let o = Owners::start_with(
        data,
        &[],
        &[
            "--allow-outbound",
            "http://127.0.0.1:*",
            "--allow-outbound",
            "http://owner.runner.actor.internal",
        ],
    )
    .await;
    let (pid, _) = o.spawn("owner", "").await;
    let own = o.weir.addr.to_string();
    for (authority, path) in [
        ("owner.runner.actor.internal", "list"),
        ("other.runner.actor.internal", "list"),
        (own.as_str(), "r/owner/list"),
        (own.as_str(), "hello"),
    ] {
        let started = Instant::now();
        let answer = o
            .call(
                "GET",
                &format!("/r/owner/proc/{pid}/call?authority={authority}&path={path}"),
                b"",
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let said = answer.text();
        assert!(
            said.starts_with("refused ") && said.contains("HttpRequestDenied"),
            "{authority}/{path}: {said}"
        );
        println!("{authority}/{path}: {said} in {:?}", started.elapsed());
    }
    // The owner's turns went on.
    assert_eq!(o.call("GET", "/r/owner/list", b"").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_is_idempotent_and_an_ended_process_is_loud() {
    let o = Owners::start("kill", &[]).await;
    let (pid, _) = o.spawn("owner", "").await;
    let kill = o
        .call("POST", &format!("/r/owner/kill/{pid}"), b"")
        .await
        .json();
    assert_eq!(kill["killed"], true);
    let kill = o
        .call("POST", &format!("/r/owner/kill/{pid}"), b"")
        .await
        .json();
    assert_eq!(kill["killed"], false, "killing twice is not an error");
    let gone = o
        .call("GET", &format!("/r/owner/proc/{pid}/starts"), b"")
        .await;
    gone.assert_weir_error(410, "process_ended");
    assert_eq!(gone.json()["ended"], "killed");
    assert_eq!(gone.json()["pid"], pid);
    let status = o
        .call("GET", &format!("/r/owner/status/{pid}"), b"")
        .await
        .json();
    assert_eq!(
        status["state"], "ended: killed",
        "status tells how it ended: {status}"
    );
    assert_eq!(status["slot"], 0);

    // A trap ends the process: that request fails, the next is told why.
    let (pid, _) = o.spawn("owner", "").await;
    o.call("GET", &format!("/r/owner/proc/{pid}/trap"), b"")
        .await
        .assert_weir_error(503, "instance_abandoned");
    let gone = o
        .call("GET", &format!("/r/owner/proc/{pid}/starts"), b"")
        .await;
    gone.assert_weir_error(410, "process_ended");
    assert!(
        gone.json()["ended"]
            .as_str()
            .unwrap()
            .starts_with("instance_abandoned: wasm trap"),
        "{}",
        gone.text()
    );
    let status = o
        .call("GET", &format!("/r/owner/status/{pid}"), b"")
        .await
        .json();
    assert!(
        status["state"]
            .as_str()
            .unwrap()
            .starts_with("ended: instance_abandoned: wasm trap"),
        "{status}"
    );
    assert_eq!(status["requests"], 1);

    // A request that spins past event_limit_ms ends it too, not hangs.
    let (pid, _) = o.spawn("owner", "").await;
    let started = Instant::now();
    let spun = o
        .call("GET", &format!("/r/owner/proc/{pid}/spin"), b"")
        .await;
    assert_eq!(spun.status, 503, "{}", spun.text());
    assert!(started.elapsed() < Duration::from_secs(10));
    let gone = o
        .call("GET", &format!("/r/owner/proc/{pid}/starts"), b"")
        .await;
    gone.assert_weir_error(410, "process_ended");

    let deadline = Instant::now() + Duration::from_secs(30);
    while o.weir.logged("weir::process").len() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let receipts = o.weir.logged("weir::process");
    let outcomes: Vec<&str> = receipts
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes.len(), 3, "{receipts:#?}");
    assert_eq!(outcomes[0], "killed");
    assert!(outcomes[1..].iter().all(|o| *o == "failed"), "{outcomes:?}");
    let first = &receipts[0];
    assert_eq!(first["class"], "runner");
    assert_eq!(first["name"], "owner");
    assert_eq!(first["contract"], "boot");
    assert_eq!(first["image"], o.resident.as_str());
    assert!(first["peak_memory_bytes"].as_u64().unwrap() > 0);
    let list = o.call("GET", "/r/owner/list", b"").await.json();
    assert_eq!(list, serde_json::json!([]), "nothing left running");
    assert_eq!(o.weir.status().await["processes"]["slots"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_are_bounded_and_reused_lowest_first_and_a_refusal_names_its_holders() {
    let o = Owners::start("slots", &["max_processes_per_actor=2", "max_processes=3"]).await;
    let (a, _) = o.spawn("owner", "").await;
    let (b, _) = o.spawn("owner", "").await;
    let slot = |pid: u64| {
        let o = &o;
        async move {
            o.call("GET", &format!("/r/owner/status/{pid}"), b"")
                .await
                .json()["slot"]
                .clone()
        }
    };
    assert_eq!((slot(a).await, slot(b).await), (0.into(), 1.into()));
    let refused = o
        .call("POST", &format!("/r/owner/spawn/{}", o.resident), b"")
        .await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    let message = refused.json()["message"].as_str().unwrap().to_string();
    assert!(
        message.starts_with(&format!(
            "max_processes_per_actor (2) reached: runner/owner holds 2 (pids [{a}, {b}], "
        )),
        "{message}"
    );
    // Another owner takes the server's last slot, then the server is full.
    o.spawn("second", "").await;
    let refused = o
        .call("POST", &format!("/r/third/spawn/{}", o.resident), b"")
        .await;
    let message = refused.json()["message"].as_str().unwrap().to_string();
    assert!(
        message.starts_with("max_processes (3) reached: runner/owner holds 2")
            && message.contains("; runner/second holds 1"),
        "{message}"
    );
    // The lowest slot comes back after its process is gone; pids never do.
    o.call("POST", &format!("/r/owner/kill/{a}"), b"").await;
    let (c, _) = o.spawn("owner", "").await;
    assert_eq!(c, b + 1);
    assert_eq!(slot(c).await, 0);
    // A start that fails gives its slot back.
    o.call("POST", &format!("/r/owner/kill/{c}"), b"").await;
    let failed = o
        .call(
            "POST",
            &format!("/r/owner/spawn/{}?start=fail", o.resident),
            b"",
        )
        .await;
    assert_eq!(failed.status, 500);
    assert_eq!(
        failed.json()["message"],
        "the program's start failed: told to fail"
    );
    let (d, _) = o.spawn("owner", "").await;
    assert_eq!(slot(d).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawn_of_what_is_not_a_server_or_not_stored_is_refused_and_holds_nothing() {
    let o = Owners::start("refused", &[]).await;
    let not_a_server = o
        .call("POST", &format!("/r/owner/spawn/{}", o.cmdprobe), b"")
        .await;
    assert_eq!(not_a_server.status, 422, "{}", not_a_server.text());
    assert!(
        not_a_server.json()["message"]
            .as_str()
            .unwrap()
            .contains("does not export wasi:http/incoming-handler"),
        "{}",
        not_a_server.text()
    );
    let missing = format!("sha256:{}", "1".repeat(64));
    let refused = o
        .call("POST", &format!("/r/owner/spawn/{missing}"), b"")
        .await;
    assert_eq!(refused.status, 404);
    assert!(
        refused.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("image_not_found")
    );
    // A spec the host would journal and hold for the process's life is
    // bounded: one byte past 1 MiB (the variable `PAD` and its value) is
    // refused by name, before anything is journaled.
    let oversized = o
        .call(
            "POST",
            &format!("/r/owner/spawn/{}?pad={}", o.resident, 1 << 20),
            b"",
        )
        .await;
    assert_eq!(oversized.status, 429, "{}", oversized.text());
    assert_eq!(
        oversized.json()["message"],
        format!(
            "the spawn's arguments, environment and start arguments take {} bytes; at most {} may be journaled and held for a process",
            (1 << 20) + 3,
            1 << 20
        )
        .as_str()
    );
    let ledger: Value = o.weir.status().await["processes"].clone();
    assert_eq!(
        (ledger["live"].clone(), ledger["slots"].clone()),
        (0.into(), 0.into())
    );
    // Exactly 1 MiB is a spec like any other.
    let fits = o
        .call(
            "POST",
            &format!("/r/owner/spawn/{}?pad={}", o.resident, (1 << 20) - 3),
            b"",
        )
        .await;
    assert_eq!(fits.status, 200, "{}", fits.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_inspect_and_kill_processes_and_read_their_metrics() {
    let o = Owners::start("operators", &[]).await;
    let (a, _) = o.spawn("one", "").await;
    let (b, _) = o.spawn("two", "").await;
    o.call("GET", &format!("/r/one/proc/{a}/starts"), b"").await;

    let admin = o.weir.admin.unwrap();
    let without = send_to(
        admin,
        Request::get("/processes")
            .header("host", admin.to_string())
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(without.status, 401, "the process list needs the token");

    let list = o.weir.admin_get("/processes").await.json();
    assert_eq!(list["live"], 2, "{list}");
    let pids: Vec<u64> = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(pids, [a, b], "by owner, then pid");
    assert_eq!(list["processes"][0]["owner"]["name"], "one");
    assert_eq!(list["processes"][0]["requests"], 1);

    let one = o
        .weir
        .admin_get(&format!("/processes/runner/one/{a}"))
        .await
        .json();
    assert_eq!(one["image"], o.resident.as_str());
    assert_eq!(one["state"], "running");

    // The CLI: the same endpoints, the token read from the data dir.
    let cli = |args: &[&str]| {
        let mut command = common::weir_command();
        command
            .arg("processes")
            .args(["--admin", &admin.to_string(), "--data-dir"])
            .arg(&o.data)
            .args(args);
        common::output_within(&mut command, common::EXITS_WITHIN)
    };
    let b_ = b.to_string();
    // `list` prints a table: a row per process, owner first; `--json` the
    // answer whole.
    let table = common::stdout_of(cli(&["list"]));
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "CLASS", "NAME", "PID", "CONTRACT", "STATE", "REQUESTS", "MEMORY", "IMAGE"
        ],
        "{table}"
    );
    let short_image = &o.resident.strip_prefix("sha256:").unwrap()[..12];
    assert_eq!(
        lines[1][..6],
        ["runner", "one", &a.to_string(), "boot", "running", "1"],
        "{table}"
    );
    assert_eq!(lines[1][8], short_image, "{table}");
    assert_eq!(
        lines[2][..6],
        ["runner", "two", &b_, "boot", "running", "0"],
        "{table}"
    );
    assert_eq!(
        lines[3],
        ["2", "processes", "running,", "2", "slots", "held"],
        "{table}"
    );
    let out = cli(&["list", "--json"]);
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["processes"][1]["pid"], b);
    // `inspect` a fact a line, `kill` a line; `--json` the answers whole.
    let shown = common::stdout_of(cli(&["inspect", "runner", "two", &b_]));
    let facts: Vec<&str> = shown.lines().collect();
    assert_eq!(facts[0], format!("process   runner/two {b}"), "{shown}");
    assert_eq!(facts[1], "contract  boot", "{shown}");
    assert_eq!(facts[2], "state     running", "{shown}");
    assert!(facts[3].starts_with("image     sha256:"), "{shown}");
    let out = cli(&["inspect", "runner", "two", &b_, "--json"]);
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["owner"]["name"], "two");
    assert_eq!(
        common::stdout_of(cli(&["kill", "runner", "two", &b_])),
        format!("process runner/two {b} killed\n")
    );
    let out = cli(&["kill", "runner", "two", &b_, "--json"]);
    let killed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(killed["killed"], false, "idempotent");
    let out = cli(&["inspect", "runner", "two", &b_]);
    assert_eq!(out.status.code(), Some(2), "an ended pid is not found");
    // The other owner's process of the same pid number is untouched.
    assert_eq!(a, b, "pids are per owner");
    assert_eq!(
        o.call("GET", &format!("/r/one/proc/{a}/starts"), b"")
            .await
            .status,
        200
    );
    o.call("GET", &format!("/r/two/proc/{b}/starts"), b"")
        .await
        .assert_weir_error(410, "process_ended");

    let metrics = o.weir.admin_get("/metrics").await.text();
    // Each series names the app whose actors run the processes.
    for (start, end) in [
        ("weir_processes_live{app=\"", "\"} 1"),
        ("weir_process_spawns_total{app=\"", "\",outcome=\"ok\"} 2"),
        (
            "weir_process_exits_total{app=\"",
            "\",outcome=\"killed\"} 1",
        ),
    ] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with(start) && l.ends_with(end)),
            "{start}…{end} in:\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_grows_past_its_memory_ends_alone_and_its_neighbours_go_on() {
    let o = Owners::start("grow", &["memory_limit_bytes=33554432"]).await;
    let (bomb, _) = o.spawn("owner", "").await;
    let (neighbour, _) = o.spawn("other", "").await;
    o.call("GET", &format!("/r/owner/proc/{bomb}/grow"), b"")
        .await
        .assert_weir_error(503, "memory_limit_exceeded");
    let status = o
        .call("GET", &format!("/r/owner/status/{bomb}"), b"")
        .await
        .json();
    assert!(
        status["state"]
            .as_str()
            .unwrap()
            .starts_with("ended: memory_limit_exceeded"),
        "{status}"
    );
    let receipt = o
        .weir
        .first_logged("weir::process", |r| {
            r["pid"] == bomb && r["name"] == "owner"
        })
        .await;
    let peak = receipt["peak_memory_bytes"].as_u64().unwrap();
    assert!(peak <= 32 << 20, "held to memory_limit_bytes: {peak}");
    let other = o
        .call("GET", &format!("/r/other/proc/{neighbour}/starts"), b"")
        .await;
    assert_eq!(other.status, 200, "the neighbour is untouched");
    assert_eq!(o.weir.status().await["processes"]["live"], 1);
}
