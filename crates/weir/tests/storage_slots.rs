//! Storage slots from outside: a real server, the `runner` actor as
//! owner and the `resident` server with a slot at `/data`. A durable slot
//! keeps its files across kill and `SIGKILL` until its owner removes it;
//! an ephemeral one is its process's own and goes with it; no process can
//! leave its slot.

mod common;

use std::time::Duration;

use common::programs::Owners;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_slot_keeps_its_files_across_kill_and_sigkill_until_its_owner_removes_it() {
    let o = Owners::start("durable", &[]).await;
    let (pid, _) = o.spawn("owner", "slot=app&durable=1").await;
    let wrote = o
        .call(
            "PUT",
            &format!("/r/owner/proc/{pid}/files/notes.txt"),
            b"kept",
        )
        .await;
    assert_eq!(wrote.text(), "wrote 4");
    o.call("POST", &format!("/r/owner/kill/{pid}"), b"").await;
    let (pid, _) = o.spawn("owner", "slot=app&durable=1").await;
    let read = o
        .call("GET", &format!("/r/owner/proc/{pid}/files/notes.txt"), b"")
        .await;
    assert_eq!(
        (read.status.as_u16(), read.text()),
        (200, "kept".to_string()),
        "after a kill"
    );
    // One durable slot, one process at a time.
    let second = o
        .call(
            "POST",
            &format!("/r/owner/spawn/{}?slot=app&durable=1", o.resident),
            b"",
        )
        .await;
    assert_eq!(
        second.json()["message"],
        format!("storage slot `app` is in use by pid {pid}").as_str()
    );
    // Another owner's slot of the same name is its own.
    let (other, _) = o.spawn("other", "slot=app&durable=1").await;
    let theirs = o
        .call(
            "GET",
            &format!("/r/other/proc/{other}/files/notes.txt"),
            b"",
        )
        .await;
    assert_eq!(
        (theirs.status.as_u16(), theirs.text()),
        (404, "NotFound".to_string())
    );

    // SIGKILL the server; a new one on the same data dir finds the files.
    let mut o = o;
    o.weir.signal("KILL");
    o.weir.wait_exit(Duration::from_secs(10));
    o.remove_data = false;
    let data = o.data.clone();
    drop(o);
    let o = Owners::start_in(data, &[]).await;
    // The launch was journaled: the process is back by itself, over the
    // same slot (tests/fenced_work.rs covers the journal itself).
    let list = o.call("GET", "/r/owner/list", b"").await.json();
    let pid = list[0]["pid"].as_u64().unwrap();
    assert!(pid > 2_000_000, "{list}");
    let read = o
        .call("GET", &format!("/r/owner/proc/{pid}/files/notes.txt"), b"")
        .await;
    assert_eq!(
        (read.status.as_u16(), read.text()),
        (200, "kept".to_string()),
        "after SIGKILL"
    );

    let busy = o.call("POST", "/r/owner/remove-storage/app", b"").await;
    assert_eq!(
        busy.json()["message"],
        format!("storage slot `app` is in use by pid {pid}").as_str(),
        "not while a process uses it"
    );
    o.call("POST", &format!("/r/owner/kill/{pid}"), b"").await;
    let removed = o
        .call("POST", "/r/owner/remove-storage/app", b"")
        .await
        .json();
    assert_eq!(removed["removed"], true);
    let removed = o
        .call("POST", "/r/owner/remove-storage/app", b"")
        .await
        .json();
    assert_eq!(removed["removed"], false);
    let (pid, _) = o.spawn("owner", "slot=app&durable=1").await;
    let read = o
        .call("GET", &format!("/r/owner/proc/{pid}/files/notes.txt"), b"")
        .await;
    assert_eq!(read.status, 404, "gone with its slot");
    let bad = o
        .call(
            "POST",
            &format!("/r/owner/spawn/{}?slot=../x&durable=1", o.resident),
            b"",
        )
        .await;
    assert!(
        bad.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("storage slot name `../x` must be"),
        "{}",
        bad.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_slot_is_its_process_own_and_goes_with_it() {
    let o = Owners::start("ephemeral", &[]).await;
    let (pid, _) = o.spawn("owner", "slot=scratch").await;
    o.call(
        "PUT",
        &format!("/r/owner/proc/{pid}/files/tmp.bin"),
        b"scratch",
    )
    .await;
    let ephemeral = o.data.join("slots/ephemeral");
    let dirs = || std::fs::read_dir(&ephemeral).unwrap().count();
    assert_eq!(dirs(), 1, "its directory is on the host while it runs");
    let (other, _) = o.spawn("owner", "slot=scratch").await;
    let read = o
        .call("GET", &format!("/r/owner/proc/{other}/files/tmp.bin"), b"")
        .await;
    assert_eq!(
        read.status, 404,
        "a second ephemeral slot of the same name is its own"
    );
    o.call("POST", &format!("/r/owner/kill/{pid}"), b"").await;
    o.call("POST", &format!("/r/owner/kill/{other}"), b"").await;
    assert_eq!(dirs(), 0, "deleted with its process, before kill returned");
    // Without a slot, a process has no directory at all.
    let (bare, _) = o.spawn("owner", "").await;
    let wrote = o
        .call("PUT", &format!("/r/owner/proc/{bare}/files/x"), b"x")
        .await;
    assert_eq!(
        (wrote.status.as_u16(), wrote.text()),
        (500, "NotFound".to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_cannot_leave_its_slot() {
    let o = Owners::start("escape", &[]).await;
    let (pid, _) = o.spawn("owner", "slot=jail&durable=1").await;
    let tried = o
        .call("GET", &format!("/r/owner/proc/{pid}/escape"), b"")
        .await;
    assert_eq!(
        tried.text(),
        "parent: PermissionDenied\n\
         absolute: NotFound\n\
         relative: NotFound\n\
         symlink link-out: Some(false)\n\
         symlink link-up: Some(true)\n\
         through link-out: NotFound\n\
         through link-up: PermissionDenied\n\
         list parent: PermissionDenied\n\
         write parent: PermissionDenied\n",
        "an absolute symlink is refused; a relative one that climbs out is made but never followed out"
    );
    assert!(!o.data.join("slots/durable/runner/escaped.txt").exists());
    let slots = o.data.join("slots");
    let escaped = walk(&slots)
        .into_iter()
        .filter(|p| p.ends_with("escaped.txt"))
        .count();
    assert_eq!(escaped, 0);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

/// What the files under `dir` hold, and how many entries there are.
fn held(dir: &std::path::Path) -> (u64, usize) {
    walk(dir).iter().fold((0, 0), |(bytes, n), p| {
        let meta = std::fs::symlink_metadata(p).unwrap();
        (bytes + if meta.is_file() { meta.len() } else { 0 }, n + 1)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_cannot_fill_the_disk_through_its_slot() {
    const MAX: u64 = 4 << 20;
    let limit = format!("max_slot_bytes={MAX}");
    // Clearing a thousand directories can take a debug build past the
    // default second.
    let o = Owners::start("slot-quota", &[&limit, "event_limit_ms=20000"]).await;
    let (pid, _) = o.spawn("owner", "slot=app&durable=1").await;
    let fill = async |pid: u64, owner: &str, how: &str, n: u64| {
        let r = o
            .call(
                "POST",
                &format!("/r/{owner}/proc/{pid}/fill?how={how}&n={n}"),
                b"",
            )
            .await;
        assert_eq!(r.status, 200, "{how}: {:?}", r.body);
        let v = r.json();
        (
            v["done"].as_u64().unwrap(),
            v["error"].as_str().map(String::from),
        )
    };
    let full = Some("StorageFull".to_string());
    let slots = o.data.join("slots/durable");
    let within = |what: &str| {
        let (bytes, entries) = held(&slots);
        // The slot directories themselves (two levels above each slot,
        // and the slot) are Weir's and do not count.
        let counted = bytes + (entries as u64).saturating_sub(3) * 4096;
        assert!(counted <= MAX, "{what}: {bytes} bytes in {entries} entries");
    };

    // A sparse length is counted whole: a GiB does not fit in 4 MiB.
    assert_eq!(fill(pid, "owner", "sparse", 1024).await, (0, full.clone()));
    let sparse = walk(&slots)
        .into_iter()
        .find(|p| p.ends_with("sparse"))
        .unwrap();
    assert_eq!(std::fs::metadata(&sparse).unwrap().len(), 0);
    // Empty files and directories are not free: 4 KiB each. Beside
    // `sparse` and the start's line in `starts.log`, 1,021 fit.
    assert_eq!(
        fill(pid, "owner", "files", 2000).await,
        (1021, full.clone())
    );
    within("files");
    fill(pid, "owner", "clear", 0).await;
    assert_eq!(fill(pid, "owner", "dirs", 2000).await, (1024, full.clone()));
    within("dirs");
    fill(pid, "owner", "clear", 0).await;
    // No way of growing and shrinking files makes the count drift: beside
    // 2 MiB kept, after rounds of every such way, each leaving nothing,
    // exactly as many empty files fit as before them.
    assert_eq!(fill(pid, "owner", "write", 2).await, (2, None));
    assert_eq!(fill(pid, "owner", "churn", 20).await, (20, None));
    assert_eq!(fill(pid, "owner", "files", 2000).await, (511, full.clone()));
    fill(pid, "owner", "clear", 0).await;

    // Appending 1 MiB at a time: three fit beside the file's own entry,
    // the fourth does not, and nothing past the quota reaches the disk.
    // (The stream's error is ENOSPC; Rust's libc for wasip2 reports a
    // failed stream write as EIO, `Uncategorized`.)
    let stream_failed = Some("Uncategorized".to_string());
    assert_eq!(
        fill(pid, "owner", "write", 16).await,
        (3, stream_failed.clone())
    );
    within("write");
    // Writing over what is there grows nothing, and is not refused.
    assert_eq!(fill(pid, "owner", "rewrite", 3).await, (3, None));

    // Another owner's slots have a quota of their own.
    let (other, _) = o.spawn("other", "slot=app&durable=1").await;
    assert_eq!(fill(other, "other", "write", 2).await, (2, None));

    // Removing files gives their space back.
    assert_eq!(fill(pid, "owner", "clear", 0).await, (1, None));
    assert_eq!(fill(pid, "owner", "files", 100).await, (100, None));
    assert_eq!(fill(pid, "owner", "dirs", 10).await, (10, None));
    assert_eq!(fill(pid, "owner", "write", 2).await, (2, None));

    // A new process of the owner counts what the disk holds: 110 entries
    // and 2 MiB with the file's entry leave room for one more MiB.
    o.call("POST", &format!("/r/owner/kill/{pid}"), b"").await;
    let (pid, _) = o.spawn("owner", "slot=app&durable=1").await;
    assert_eq!(fill(pid, "owner", "write", 16).await, (1, stream_failed));
}
