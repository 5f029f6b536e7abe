//! `lifetime` processes from outside: a real server, the `runner` actor as
//! owner and the `cmdprobe` command spawned from the image store. One run
//! held for the process's life, its stdin written and its output read
//! through the owner, its exit settled once after teardown, kill and
//! failure with their codes, output and stdin bounded, and each contract
//! kept to its own calls.

mod common;

use std::time::{Duration, Instant};

use common::programs::{Owners, push_image};
use common::{guest, thread_ticks};
use serde_json::Value;

/// The processes' test server (see `Owners`), with lifetime calls for
/// actor `o`.
struct Owner(Owners);

impl std::ops::Deref for Owner {
    type Target = Owners;

    fn deref(&self) -> &Owners {
        &self.0
    }
}

impl Owner {
    async fn start(name: &str, limits: &[&str]) -> Owner {
        Owner(Owners::start(&format!("lifetime-{name}"), limits).await)
    }

    /// Spawns `cmdprobe <query's args>` as a lifetime process of actor
    /// `o`: its pid.
    async fn spawn(&self, query: &str) -> u64 {
        let spawned = self
            .call(
                "POST",
                &format!("/r/o/spawn/{}?contract=lifetime&{query}", self.cmdprobe),
                b"",
            )
            .await;
        assert_eq!(spawned.status, 200, "{}", spawned.text());
        spawned.json()["pid"].as_u64().unwrap()
    }

    async fn wait(&self, pid: u64, timeout_ms: u64) -> Value {
        let waited = self
            .call(
                "POST",
                &format!("/r/o/wait/{pid}?timeout={timeout_ms}"),
                b"",
            )
            .await;
        assert_eq!(waited.status, 200, "{}", waited.text());
        waited.json()["exited"].clone()
    }

    /// Reads stdout from `offset` until it holds `want` (at most 30 s);
    /// everything read, from `offset`.
    async fn read_until(&self, pid: u64, offset: u64, want: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut text = String::new();
        let mut at = offset;
        while !text.contains(want) {
            assert!(Instant::now() < deadline, "no `{want}` in {text:?}");
            let read = self
                .call(
                    "GET",
                    &format!("/r/o/output/{pid}?offset={at}&timeout=1000"),
                    b"",
                )
                .await;
            assert_eq!(read.status, 200, "{}", read.text());
            let chunk = read.json();
            assert_eq!(chunk["offset"].as_u64(), Some(at), "nothing was dropped");
            text.push_str(chunk["data"].as_str().unwrap());
            at += chunk["bytes"].as_u64().unwrap();
        }
        text
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifetime_command_reads_its_stdin_writes_its_output_and_settles_its_exit_once() {
    let o = Owner::start("life", &[]).await;
    let pid = o.spawn("arg=hold&env=MODE=dev").await;
    assert_eq!(pid, 1_000_001, "pid_base + 1");

    let first = o.read_until(pid, 0, "env MODE=dev\n").await;
    assert_eq!(
        first, "env MODE=dev\n",
        "its environment is what it was given"
    );
    assert_eq!(o.wait(pid, 50).await, Value::Null, "still running");
    let status = o
        .call("GET", &format!("/r/o/status/{pid}"), b"")
        .await
        .json();
    assert_eq!(
        (status["contract"].as_str(), status["state"].as_str()),
        (Some("lifetime"), Some("running"))
    );

    // Its stdin, line by line, answered as it comes: the run is held.
    let wrote = o
        .call("POST", &format!("/r/o/stdin/{pid}"), b"one\ntwo\n")
        .await;
    assert_eq!(wrote.json()["taken"], 8);
    let answered = o.read_until(pid, first.len() as u64, "got two\n").await;
    assert_eq!(answered, "got one\ngot two\n");
    // A command serves no requests.
    let request = o
        .call("GET", &format!("/r/o/proc/{pid}/anything"), b"")
        .await;
    request.assert_weir_error(409, "process_not_serving");

    let closed = o.call("POST", &format!("/r/o/close/{pid}"), b"").await;
    assert_eq!(closed.status, 200, "{}", closed.text());
    let exited = o.wait(pid, 20_000).await;
    assert_eq!(exited["exit_code"], 0, "{exited}");
    assert_eq!(exited["stopped"], Value::Null);
    assert_eq!(
        exited["stdout"],
        "env MODE=dev\ngot one\ngot two\nstdin closed\n"
    );
    assert_eq!(o.wait(pid, 0).await, exited, "the exit settled once");

    // Gone: its state says how, its stdin refuses, its slot is free.
    let status = o
        .call("GET", &format!("/r/o/status/{pid}"), b"")
        .await
        .json();
    assert_eq!(status["state"], "ended: exited with 0");
    let late = o.call("POST", &format!("/r/o/stdin/{pid}"), b"x").await;
    assert_eq!(late.status, 410, "{}", late.text());
    assert_eq!(late.json()["message"], "exited with 0");
    let listed = o.weir.admin_get("/processes").await.json();
    assert_eq!(listed["live"], 0, "{listed}");
    assert_eq!(listed["slots"], 0, "{listed}");
    let receipt = o
        .weir
        .first_logged("weir::process", |r| r["pid"] == pid)
        .await;
    assert_eq!(
        (
            receipt["contract"].as_str(),
            receipt["outcome"].as_str(),
            receipt["exit_code"].as_i64()
        ),
        (Some("lifetime"), Some("exited"), Some(0)),
        "{receipt}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_lifetime_process_exits_137_and_its_slot_is_reused_lowest_first() {
    let o = Owner::start("kill", &[]).await;
    let first = o.spawn("arg=spin").await;
    let second = o.spawn("arg=spin").await;
    let o = &o;
    let slot = |pid: u64| async move {
        o.call("GET", &format!("/r/o/status/{pid}"), b"")
            .await
            .json()["slot"]
            .as_u64()
    };
    assert_eq!((slot(first).await, slot(second).await), (Some(0), Some(1)));
    // Two spinning commands do not hold their owner's turns.
    assert_eq!(o.call("POST", "/r/o/count", b"").await.json()["n"], 1);

    let killed = o.call("POST", &format!("/r/o/kill/{first}"), b"").await;
    assert_eq!(killed.json()["killed"], true);
    let exited = o.wait(first, 0).await;
    assert_eq!(
        (exited["exit_code"].as_i64(), exited["stopped"].as_str()),
        (Some(137), Some("killed")),
        "settled by the time kill returned: {exited}"
    );
    let again = o.call("POST", &format!("/r/o/kill/{first}"), b"").await;
    assert_eq!(again.json()["killed"], false, "kill is idempotent");
    let third = o.spawn("arg=spin").await;
    assert_eq!(slot(third).await, Some(0), "the lowest free slot");
    // The ledger sees a command's memory while it runs.
    let holder = o.spawn("arg=hold&arg=16").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ledger = o.weir.status().await["processes"]["holders"][0].clone();
        if ledger["memory_bytes"].as_u64().unwrap() >= 16 << 20 {
            break;
        }
        assert!(Instant::now() < deadline, "16 MiB never showed: {ledger}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for pid in [second, third, holder] {
        o.call("POST", &format!("/r/o/kill/{pid}"), b"").await;
    }
    let receipt = o
        .weir
        .first_logged("weir::process", |r| r["pid"] == first)
        .await;
    assert_eq!(
        (receipt["outcome"].as_str(), receipt["exit_code"].as_i64()),
        (Some("killed"), Some(137))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifetime_process_that_traps_or_grows_past_its_memory_ends_with_its_code() {
    let o = Owner::start("fail", &["memory_limit_bytes=67108864"]).await;
    let trapped = o.spawn("arg=panic").await;
    let exited = o.wait(trapped, 20_000).await;
    assert_eq!(
        (exited["exit_code"].as_i64(), exited["stopped"].as_str()),
        (Some(134), Some("run_trapped")),
        "{exited}"
    );
    assert!(
        exited["stderr"]
            .as_str()
            .unwrap()
            .contains("cmdprobe was told to panic"),
        "{exited}"
    );
    let grown = o.spawn("arg=grow").await;
    let exited = o.wait(grown, 20_000).await;
    assert_eq!(
        (exited["exit_code"].as_i64(), exited["stopped"].as_str()),
        (Some(124), Some("memory_limit_exceeded")),
        "{exited}"
    );
    let status = o
        .call("GET", &format!("/r/o/status/{grown}"), b"")
        .await
        .json();
    assert!(
        status["state"]
            .as_str()
            .unwrap()
            .starts_with("ended: memory_limit_exceeded"),
        "{status}"
    );
    // The owner is unharmed.
    assert_eq!(o.call("POST", "/r/o/count", b"").await.json()["n"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_kept_as_a_bounded_tail_and_stdin_takes_only_what_fits() {
    const TAIL: u64 = 64 << 10;
    let o = Owner::start("bounds", &[]).await;
    let writer = o.spawn("arg=write&arg=200000").await;
    let exited = o.wait(writer, 20_000).await;
    assert_eq!(exited["exit_code"], 0, "{exited}");
    assert_eq!(exited["stdout"].as_str().unwrap().len() as u64, TAIL);
    let read = o
        .call("GET", &format!("/r/o/output/{writer}?offset=0"), b"")
        .await
        .json();
    assert_eq!(
        (
            read["offset"].as_u64(),
            read["bytes"].as_u64(),
            read["closed"].as_bool()
        ),
        (Some(200_000 - TAIL), Some(TAIL), Some(true)),
        "the first bytes are gone, and the offset says how many"
    );
    let part = o
        .call(
            "GET",
            &format!("/r/o/output/{writer}?offset=199990&max=4"),
            b"",
        )
        .await
        .json();
    assert_eq!(
        (
            part["offset"].as_u64(),
            part["data"].as_str(),
            part["closed"].as_bool()
        ),
        (Some(199_990), Some("yyyy"), Some(false))
    );

    // A command that never reads: its stdin takes 64 KiB, then nothing.
    let spinner = o.spawn("arg=spin").await;
    let big = vec![b'z'; 100 << 10];
    let taken = o.call("POST", &format!("/r/o/stdin/{spinner}"), &big).await;
    assert_eq!(taken.json()["taken"], TAIL);
    let more = o
        .call("POST", &format!("/r/o/stdin/{spinner}"), b"more")
        .await;
    assert_eq!(more.json()["taken"], 0);
    o.call("POST", &format!("/r/o/close/{spinner}"), b"").await;
    let after = o.call("POST", &format!("/r/o/stdin/{spinner}"), b"x").await;
    assert_eq!(after.status, 500, "{}", after.text());
    assert_eq!(after.json()["message"], "its stdin is closed");
    o.call("POST", &format!("/r/o/kill/{spinner}"), b"").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_contract_keeps_to_its_own_calls() {
    let o = Owner::start("contracts", &[]).await;
    let resident = push_image(&o.weir, &guest("resident")).await;
    let server = o.call("POST", &format!("/r/o/spawn/{resident}"), b"").await;
    assert_eq!(server.status, 200, "{}", server.text());
    let pid = server.json()["pid"].as_u64().unwrap();
    for (method, path) in [
        ("POST", format!("/r/o/wait/{pid}?timeout=0")),
        ("POST", format!("/r/o/stdin/{pid}")),
        ("GET", format!("/r/o/output/{pid}")),
    ] {
        let refused = o.call(method, &path, b"x").await;
        assert_eq!(refused.status, 409, "{path}: {}", refused.text());
        assert_eq!(refused.json()["error"], "wrong-contract");
    }
    // A server is not a command, and a command is not a server.
    let not_command = o
        .call(
            "POST",
            &format!("/r/o/spawn/{resident}?contract=lifetime"),
            b"",
        )
        .await;
    assert_eq!(not_command.status, 422, "{}", not_command.text());
    assert!(
        not_command.json()["message"]
            .as_str()
            .unwrap()
            .contains("not_a_command"),
        "{}",
        not_command.text()
    );
    let not_server = o
        .call("POST", &format!("/r/o/spawn/{}", o.cmdprobe), b"")
        .await;
    assert_eq!(not_server.status, 422, "{}", not_server.text());
    let listed = o.call("GET", "/r/o/list", b"").await.json();
    assert_eq!(
        listed.as_array().unwrap().len(),
        1,
        "only the server runs: {listed}"
    );
    let unknown = o.call("POST", "/r/o/wait/42?timeout=0", b"").await;
    assert_eq!(unknown.status, 404, "{}", unknown.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifetime_process_is_its_owners_alone_and_reaches_nothing_of_the_host() {
    let o = Owner::start("doors", &[]).await;
    // Its own doors: the host's files and sockets are not there, not even
    // a port that is listening.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    for mode in ["files".to_string(), format!("sockets&arg=127.0.0.1:{port}")] {
        let pid = o.spawn(&format!("arg={mode}")).await;
        let exited = o.wait(pid, 20_000).await;
        assert_eq!(exited["exit_code"], 0, "{exited}");
        let out = exited["stdout"].as_str().unwrap();
        assert!(!out.is_empty(), "{mode} said nothing");
        for refused in [
            ": open",
            " bytes",
            "written",
            "connected",
            "bound",
            "resolved",
        ] {
            assert!(!out.contains(refused), "{mode}: `{refused}` in {out}");
        }
    }
    assert!(
        listener.accept().is_err(),
        "no connection reached the listening port"
    );
    // Another actor cannot reach it by its pid: it is told there is none.
    let pid = o.spawn("arg=hold").await;
    for (method, path) in [
        ("POST", format!("/r/intruder/wait/{pid}?timeout=0")),
        ("POST", format!("/r/intruder/stdin/{pid}")),
        ("POST", format!("/r/intruder/close/{pid}")),
        ("GET", format!("/r/intruder/output/{pid}")),
        ("GET", format!("/r/intruder/status/{pid}")),
    ] {
        let refused = o.call(method, &path, b"x").await;
        assert_eq!(refused.status, 404, "{path}: {}", refused.text());
        assert_eq!(refused.json()["error"], "no-such-process", "{path}");
    }
    let killed = o
        .call("POST", &format!("/r/intruder/kill/{pid}"), b"")
        .await;
    assert_eq!(killed.json()["killed"], false);
    let status = o
        .call("GET", &format!("/r/o/status/{pid}"), b"")
        .await
        .json();
    assert_eq!(status["state"], "running", "untouched by the intruder");
    let fed = o
        .call("POST", &format!("/r/o/stdin/{pid}"), b"mine\n")
        .await;
    assert_eq!(fed.json()["taken"], 5);
    assert_eq!(o.read_until(pid, 0, "got mine\n").await, "got mine\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_compute_forever_run_on_the_program_threads_not_the_request_workers() {
    let o = Owner::start("threads", &[]).await;
    let pid = o.weir.pid();
    // Four commands that never stop computing: on the request workers,
    // each would have held one for a 5 ms slice in every round of the
    // scheduler, and every request waited behind all of them.
    let spinning: Vec<u64> = futures::future::join_all((0..4).map(|_| o.spawn("arg=spin"))).await;
    let (workers, programs) = (
        thread_ticks(pid, "weir-worker"),
        thread_ticks(pid, "weir-program"),
    );
    let mut answered = 0;
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        // Their owner and the worker answer meanwhile.
        assert_eq!(o.call("POST", "/r/o/count", b"").await.status, 200);
        // (the worker's own answer to a path it does not serve)
        assert_eq!(o.call("GET", "/", b"").await.status, 404);
        answered += 1;
        // A call now and then: the workers' own work stays small beside
        // what the commands compute.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let workers = thread_ticks(pid, "weir-worker") - workers;
    let programs = thread_ticks(pid, "weir-program") - programs;
    // The computing is charged to the program threads, the workers only
    // answered calls: a ratio between the two, over five seconds, which
    // holds however much of the machine other work takes (an absolute
    // count of ticks does not).
    assert!(
        programs > 0,
        "program threads: {programs} ticks, workers: {workers}"
    );
    assert!(
        workers * 4 < programs,
        "the workers took part in the computing: {workers} ticks against the program threads' {programs} ({answered} rounds of calls)"
    );
    for pid in spinning {
        let exited = o.call("POST", &format!("/r/o/kill/{pid}"), b"").await;
        assert_eq!(exited.json()["killed"], true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_ends_while_its_owner_is_deleted_does_not_bring_the_owner_back() {
    let o = Owner::start("deleted-owner", &[]).await;
    let pid = o.spawn("arg=hold").await;
    // A turn of the owner waits for the process's end; the owner's
    // deletion queues behind it; then an operator kills the process, whose
    // end (the journal row's removal) queues behind the deletion.
    let wait_path = format!("/r/o/wait/{pid}?timeout=800");
    let waited = o.call("POST", &wait_path, b"");
    let script = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let deleting = o.weir.admin_send("DELETE", "/actors/runner/o");
        let kill_path = format!("/processes/runner/o/{pid}");
        let kill = async {
            tokio::time::sleep(Duration::from_millis(250)).await;
            o.weir.admin_send("DELETE", &kill_path).await
        };
        tokio::join!(deleting, kill)
    };
    let (waited, (deleted, killed)) = tokio::join!(waited, script);
    assert_eq!(waited.status, 200, "{}", waited.text());
    assert_eq!(
        waited.json()["exited"]["exit_code"],
        137,
        "{}",
        waited.text()
    );
    assert_eq!(killed.status, 200, "{}", killed.text());
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    assert_eq!(deleted.json()["deleted"], true);
    // The ended process's bookkeeping found its owner gone, and made no
    // new one of that name.
    tokio::time::sleep(common::SETTLE).await;
    let r = o.weir.admin_get("/actors/runner/o").await;
    assert_eq!(r.status, 404, "{}", r.text());
    let listed = o.weir.admin_get("/actors/runner").await.json();
    assert_eq!(listed["actors"], serde_json::json!([]), "{listed}");
}
