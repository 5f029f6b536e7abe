//! What an actor's disk writes promise, from outside: a disk that fills
//! up under a real `weir serve` (a tmpfs of a few MiB) never gives two
//! instances of an actor one incarnation, and under `--durability fsync`
//! a deletion is answered only once its directory is synced (the server's
//! system calls, traced with `strace`).

mod common;

use std::time::Duration;

use common::actors::*;
use common::small_disk::SmallDisk;
use common::strace::Strace;

#[tokio::test]
async fn an_incarnation_bump_the_full_disk_refused_fails_the_wake_and_no_number_is_given_twice() {
    let disk = SmallDisk::mount("bump", 96 << 20);
    let dir = disk.join("data");
    let weir = start(&dir, &[]);
    assert_eq!(post(&weir, "/probe/b/incr", Vec::new()).await.text(), "1");
    let mut given = vec![incarnation(&weir, "b").await];
    disk.fill();
    // Each round drops the actor's instance (its handler returns without a
    // response), so the next call wakes a fresh one, whose bump must be
    // durable before it runs.
    let mut refused = 0;
    for _ in 0..12 {
        let _ = weir.get("/probe/b/no-response").await;
        let r = weir.get("/probe/b/whoami").await;
        match r.status.as_u16() {
            200 => {
                let n = r.json()["incarnation"].as_u64().unwrap();
                assert!(
                    !given.contains(&n),
                    "incarnation {n} was given to two instances: {given:?}"
                );
                given.push(n);
            }
            _ => {
                r.assert_weir_error(503, "storage_commit_failed");
                refused += 1;
            }
        }
    }
    assert!(
        refused > 0,
        "the full disk never refused a bump, so this proves nothing: {given:?}"
    );
    let r = weir
        .actor_receipt_where(|r| r["name"] == "b" && r["error"] == "storage_commit_failed")
        .await;
    assert!(
        r["detail"]
            .as_str()
            .is_some_and(|d| d.contains("incarnation")),
        "{r}"
    );
    // With room again, the actor goes on, on a number never given.
    disk.free();
    let n = incarnation(&weir, "b").await;
    assert!(!given.contains(&n), "{n} in {given:?}");
    assert_eq!(post(&weir, "/probe/b/incr", Vec::new()).await.text(), "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_fsync_durability_a_deletion_is_answered_after_its_directory_is_synced() {
    let dir = data_dir("fsync-delete");
    let weir = start(&dir, &["--durability", "fsync"]);
    assert_eq!(
        post(&weir, "/probe/gone/incr", Vec::new()).await.text(),
        "1"
    );
    let r = post(
        &weir,
        "/probe/gone/schedule?reason=tick&in_ms=600000",
        Vec::new(),
    )
    .await;
    assert_eq!(r.status, 200);
    let strace = Strace::attach(
        &weir,
        "unlink,unlinkat,fsync,fdatasync,write,writev,sendto,sendmsg",
        || async {
            let _ = weir.get("/probe/other/whoami").await;
        },
    )
    .await;
    let r = weir.admin_send("DELETE", "/actors/probe/gone").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["deleted"], true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lines = strace.finish();
    let log = lines.join("\n");
    let unlinked = lines
        .iter()
        .position(|l| l.contains("unlink") && l.contains("gone.sqlite3\""))
        .unwrap_or_else(|| panic!("no unlink of the actor's database:\n{log}"));
    let answered = lines[unlinked..]
        .iter()
        .position(|l| l.contains("HTTP/1.1 200"))
        .map(|i| unlinked + i)
        .unwrap_or_else(|| panic!("no answer after the unlink:\n{log}"));
    let class_dir = format!("{}>", dir.join("actors/probe").display());
    assert!(
        lines[unlinked..answered]
            .iter()
            .any(|l| l.contains("fsync(") && l.contains(&class_dir)),
        "the deletion was answered before its directory was synced:\n{}",
        lines[unlinked..=answered].join("\n")
    );
}
