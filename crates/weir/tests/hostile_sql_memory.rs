//! A hostile tenant's SQL against SQLite's memory, from outside: sorts,
//! `DISTINCT`s and recursive queues that never end, run by the `hostile`
//! guest as a worker (after its headers, under the session's deadline)
//! and as actors. They must write no temporary file, stop at their own
//! statement's bound (`max_sql_statement_memory_bytes`) naming it, and
//! leave every other tenant's statements the memory they need; a
//! configuration whose statements could take SQLite's whole heap is
//! refused at start.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use common::hostile::*;
use common::*;

/// A sort of rows it never stops making: it holds more and more until
/// something stops it.
const ENDLESS_SORT: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) \
                            SELECT x FROM c ORDER BY randomblob(1000)";

/// A sort that needs about 6 MiB (5,000 rows of 1,000 bytes) and ends.
const MODEST_SORT: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 5000) \
                           SELECT count(*) FROM (SELECT x FROM c ORDER BY randomblob(1000))";

/// SQLite's heap for the whole server in these tests, and one statement's
/// share: the default four SQL threads at their bound hold half the heap.
const HEAP: &str = "max_sql_memory_bytes=268435456";
const STATEMENT: &str = "max_sql_statement_memory_bytes=33554432";
const STATEMENT_REFUSAL: &str =
    "out of memory: the statement needed more than max_sql_statement_memory_bytes (33554432 bytes)";

fn start_bounded(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Weir {
    let mut args = vec!["--limit", HEAP, "--limit", STATEMENT];
    args.extend_from_slice(extra);
    start_with_env(dir, &args, env)
}

/// The error of an actor's one statement.
fn actor_error(answers: &[Value]) -> String {
    answers[0]["error"].as_str().unwrap_or_default().to_string()
}
/// Bytes of the files under `dir` that process `pid` holds open (SQLite
/// unlinks its temporary files as it opens them: only the open handles
/// show them).
fn open_file_bytes_under(pid: u32, dir: &Path) -> u64 {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.filter_map(|fd| {
        let fd = fd.ok()?.path();
        let target = std::fs::read_link(&fd).ok()?;
        target
            .starts_with(dir)
            .then(|| std::fs::metadata(&fd).map(|m| m.len()).unwrap_or(0))
    })
    .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sort_without_end_writes_no_temporary_file_and_stops_at_its_statement_bound() {
    // A statement that sorts rows it never stops making, run by a worker
    // after its headers (under the session's deadline, two minutes here)
    // and by an actor: SQLite held such rows in temporary files, which
    // nothing bounded but the disk (2 GB in 20 s from one statement), and
    // then in its heap up to the whole process's bound.
    const SORT: &str = ENDLESS_SORT;
    let dir = data_dir("temp-sort");
    let temp = weir_scratch::dir("temp-sort-tmpdir");
    std::fs::create_dir_all(&temp).unwrap();
    let weir = start_bounded(
        &dir,
        &[
            "--limit",
            "session_limit_ms=120000",
            "--limit",
            "event_limit_ms=120000",
        ],
        &[("SQLITE_TMPDIR", temp.to_str().unwrap())],
    );
    assert_eq!(weir.get("/p/bystander/incr").await.text(), "1");
    let pid = weir.pid();
    reset_peak(pid);
    let before = proc_kib(pid, "VmHWM:");
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (done, temp) = (done.clone(), temp.clone());
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(open_file_bytes_under(pid, &temp));
                std::thread::sleep(Duration::from_millis(5));
            }
            peak
        })
    };
    let worker = post_json(
        &weir,
        "/sql?after_headers=1",
        json!({ "db": "app", "statements": [SORT] }),
    )
    .await;
    let actor = exec(&weir, "sorter", &[SORT]).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let temp_peak = watcher.join().unwrap();
    // Each ended at its statement's bound, named, long before its
    // deadline.
    assert_eq!(worker.status, 200, "{:?}", worker.body);
    let error = worker.json()["error"].as_str().unwrap().to_string();
    assert!(error.contains(STATEMENT_REFUSAL), "{error}");
    assert!(actor_error(&actor).contains(STATEMENT_REFUSAL), "{actor:?}");
    // Not a byte in the temporary directory, and the server grew by about
    // one statement's bound (32 MiB), far from the heap's (256 MiB).
    assert_eq!(temp_peak, 0, "temporary files held {temp_peak} bytes");
    let grown = proc_kib(pid, "VmHWM:").saturating_sub(before);
    println!("two endless sorts: the server grew by {} MiB", grown / 1024);
    assert!(grown < (2 * 32 + 32) * 1024, "grew by {} MiB", grown / 1024);
    // Each was counted where operators look.
    let metrics = weir.admin_get("/metrics").await.text();
    assert!(
        metrics.contains("weir_sql_statements_over_memory_total 2\n"),
        "{metrics}"
    );
    // The heap was given back: SQL and actors answer, the sorter too.
    assert_eq!(sql(&weir, &["SELECT 1"]).await["rows"][0], json!([[1]]));
    assert_eq!(weir.get("/p/bystander/incr").await.text(), "2");
    assert_eq!(
        exec(&weir, "sorter", &["SELECT 2"]).await[0]["rows"],
        json!([[2]])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_sorts_leave_every_other_tenant_the_memory_its_statements_need() {
    // Three endless sorts at once, again and again (two actors and the
    // worker, on three of the four SQL threads), while another actor
    // sorts what it needs (6 MiB at a time) on the fourth. Under one
    // bound for the whole heap, the sorts took it all and the bystander's
    // allocations failed with theirs: `out of memory`, for a statement
    // that needed a fortieth of the heap.
    let dir = data_dir("sql-memory-share");
    // Deadlines far away: the sorts end at their memory bound.
    let weir = Arc::new(start_bounded(
        &dir,
        &["--limit", "event_limit_ms=60000"],
        &[],
    ));
    const ROUNDS: usize = 4;
    let hogging = Arc::new(AtomicBool::new(true));
    let hogs: Vec<_> = ["hog-1", "hog-2", "worker"]
        .into_iter()
        .map(|hog| {
            let weir = weir.clone();
            tokio::spawn(async move {
                let mut errors = Vec::new();
                for _ in 0..ROUNDS {
                    let error = if hog == "worker" {
                        let r = post_json(
                            &weir,
                            "/sql",
                            json!({ "db": "app", "statements": [ENDLESS_SORT] }),
                        )
                        .await;
                        r.json()["error"].as_str().unwrap_or_default().to_string()
                    } else {
                        actor_error(&exec(&weir, hog, &[ENDLESS_SORT]).await)
                    };
                    errors.push(error);
                }
                errors
            })
        })
        .collect();
    let bystander = {
        let (weir, hogging) = (weir.clone(), hogging.clone());
        tokio::spawn(async move {
            let mut sorted = 0;
            while hogging.load(Ordering::Relaxed) {
                let answer = exec(&weir, "bystander", &[MODEST_SORT]).await;
                assert_eq!(
                    answer[0]["rows"],
                    json!([[5000]]),
                    "the bystander's sort {sorted} failed while the hogs sorted: {answer:?}"
                );
                sorted += 1;
            }
            sorted
        })
    };
    for hog in hogs {
        let errors = hog.await.unwrap();
        for error in &errors {
            assert!(error.contains(STATEMENT_REFUSAL), "{errors:?}");
        }
    }
    hogging.store(false, Ordering::Relaxed);
    let sorted = bystander.await.unwrap();
    println!("the bystander sorted {sorted} times while the hogs sorted");
    assert!(sorted > 0);
}

#[test]
fn statements_that_could_take_the_whole_heap_are_refused_at_start() {
    // Sixteen SQL threads at the default statement bound (128 MiB) could
    // hold 2 GiB at once: more than half the default heap bound.
    let dir = data_dir("sql-memory-config");
    let out = common::output_within(
        weir_command()
            .args(["serve"])
            .arg(guest("hostile"))
            .args([
                "--data-dir",
                dir.to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
            ])
            .args(["--limit", "sql_threads=16"]),
        common::EXITS_WITHIN,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "sql_threads (16) statements of max_sql_statement_memory_bytes (134217728 bytes) \
             could hold 2147483648 bytes at once, more than 1/2 of max_sql_memory_bytes \
             (2147483648 bytes)"
        ),
        "{stderr}"
    );
}
