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

/// Has `owner`'s process `pid` try to fill its slot (the resident
/// server's `/fill`): how many steps worked, and the first error's kind.
async fn fill(o: &Owners, pid: u64, owner: &str, how: &str, n: u64) -> (u64, Option<String>) {
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_cannot_fill_the_disk_through_its_slot() {
    const MAX: u64 = 4 << 20;
    let limit = format!("max_slot_bytes={MAX}");
    // Clearing a thousand directories can take a debug build past the
    // default second.
    let o = Owners::start("slot-quota", &[&limit, "event_limit_ms=20000"]).await;
    let (pid, _) = o.spawn("owner", "slot=app&durable=1").await;
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
    assert_eq!(
        fill(&o, pid, "owner", "sparse", 1024).await,
        (0, full.clone())
    );
    let sparse = walk(&slots)
        .into_iter()
        .find(|p| p.ends_with("sparse"))
        .unwrap();
    assert_eq!(std::fs::metadata(&sparse).unwrap().len(), 0);
    // Empty files and directories are not free: 4 KiB each. Beside
    // `sparse` and the start's line in `starts.log`, 1,021 fit.
    assert_eq!(
        fill(&o, pid, "owner", "files", 2000).await,
        (1021, full.clone())
    );
    within("files");
    fill(&o, pid, "owner", "clear", 0).await;
    assert_eq!(
        fill(&o, pid, "owner", "dirs", 2000).await,
        (1024, full.clone())
    );
    within("dirs");
    fill(&o, pid, "owner", "clear", 0).await;
    // No way of growing and shrinking files makes the count drift: beside
    // 2 MiB kept, after rounds of every such way, each leaving nothing,
    // exactly as many empty files fit as before them.
    assert_eq!(fill(&o, pid, "owner", "write", 2).await, (2, None));
    assert_eq!(fill(&o, pid, "owner", "churn", 20).await, (20, None));
    assert_eq!(
        fill(&o, pid, "owner", "files", 2000).await,
        (511, full.clone())
    );
    fill(&o, pid, "owner", "clear", 0).await;

    // Appending 1 MiB at a time: three fit beside the file's own entry,
    // the fourth does not, and nothing past the quota reaches the disk.
    // (The stream's error is ENOSPC; Rust's libc for wasip2 reports a
    // failed stream write as EIO, `Uncategorized`.)
    let stream_failed = Some("Uncategorized".to_string());
    assert_eq!(
        fill(&o, pid, "owner", "write", 16).await,
        (3, stream_failed.clone())
    );
    within("write");
    // Writing over what is there grows nothing, and is not refused.
    assert_eq!(fill(&o, pid, "owner", "rewrite", 3).await, (3, None));

    // Another owner's slots have a quota of their own.
    let (other, _) = o.spawn("other", "slot=app&durable=1").await;
    assert_eq!(fill(&o, other, "other", "write", 2).await, (2, None));

    // Removing files gives their space back.
    assert_eq!(fill(&o, pid, "owner", "clear", 0).await, (1, None));
    assert_eq!(fill(&o, pid, "owner", "files", 100).await, (100, None));
    assert_eq!(fill(&o, pid, "owner", "dirs", 10).await, (10, None));
    assert_eq!(fill(&o, pid, "owner", "write", 2).await, (2, None));

    // A new process of the owner counts what the disk holds: 110 entries
    // and 2 MiB with the file's entry leave room for one more MiB.
    o.call("POST", &format!("/r/owner/kill/{pid}"), b"").await;
    let (pid, _) = o.spawn("owner", "slot=app&durable=1").await;
    assert_eq!(
        fill(&o, pid, "owner", "write", 16).await,
        (1, stream_failed)
    );
}

/// What the app's actor databases take on disk: every database and WAL
/// in a class's directory (not the timer ledger beside them, which is
/// Weir's, one row per actor with a timer).
fn actor_disk_bytes(data: &std::path::Path) -> u64 {
    let root = data.join("actors");
    walk(&root)
        .iter()
        .filter(|p| {
            let name = p.to_string_lossy();
            p.parent() != Some(root.as_path())
                && (name.ends_with(".sqlite3") || name.ends_with(".sqlite3-wal"))
        })
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

/// What the durable slots hold as `max_slot_bytes` counts it: each
/// slot's contents, bytes and 4 KiB per entry (the class, owner and slot
/// directories are Weir's).
fn slot_disk_bytes(data: &std::path::Path) -> u64 {
    let durable = data.join("slots/durable");
    let mut total = 0;
    for class in std::fs::read_dir(&durable).unwrap().flatten() {
        for owner in std::fs::read_dir(class.path()).unwrap().flatten() {
            for slot in std::fs::read_dir(owner.path()).unwrap().flatten() {
                let (bytes, entries) = held(&slot.path());
                total += bytes + entries as u64 * 4096;
            }
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_and_databases_share_max_actor_storage_bytes_and_a_removed_slot_gives_room_back() {
    const MIB: u64 = 1 << 20;
    const ROOM: u64 = 5 * MIB;
    let room = format!("max_actor_storage_bytes={ROOM}");
    // Each owner's own quota has room for 3 MiB of chunks; the app's room
    // not for two such owners beside their databases.
    let limits = [
        &room,
        "max_slot_bytes=4194304",
        "actor_idle_ms=600000",
        "event_limit_ms=20000",
    ];
    let mut o = Owners::start("slot-room", &limits).await;
    let status = async |o: &Owners| o.weir.admin_get("/actors").await.json()["status"].clone();
    let stream_failed = Some("Uncategorized".to_string());
    let full = Some("StorageFull".to_string());
    let (a, _) = o.spawn("a", "slot=app&durable=1").await;
    let (b, _) = o.spawn("b", "slot=app&durable=1").await;

    // One owner fills its own quota: three chunks beside its start line.
    assert_eq!(
        fill(&o, a, "a", "write", 16).await,
        (3, stream_failed.clone())
    );
    // The next finds the app's room shorter than its own quota: as many
    // chunks fit as the room has free after the file's entry.
    let s = status(&o).await;
    let free = ROOM - s["storage_bytes"].as_u64().unwrap();
    let fit = (free - 4096) / MIB;
    assert!(fit < 3, "the room, not b's quota, must stop b: {s}");
    assert_eq!(
        fill(&o, b, "b", "write", 16).await,
        (fit, stream_failed.clone())
    );
    // Then empty files, 4 KiB each, until not one more fits.
    let s = status(&o).await;
    let free = ROOM - s["storage_bytes"].as_u64().unwrap();
    assert_eq!(
        fill(&o, b, "b", "files", 2000).await,
        (free / 4096, full.clone())
    );
    let s = status(&o).await;
    let (used, slots) = (
        s["storage_bytes"].as_u64().unwrap(),
        s["slot_storage_bytes"].as_u64().unwrap(),
    );
    assert!(ROOM - used < 4096, "{s}");
    // The count is the disk's: the databases' files and the slots as
    // their quotas count them.
    assert_eq!(slots, slot_disk_bytes(&o.data), "{s}");
    assert_eq!(used, slots + actor_disk_bytes(&o.data), "{s}");

    // A full room makes no new actor; the owners that exist answer.
    let newcomer = o.call("GET", "/r/c/count", b"").await;
    assert_eq!(newcomer.status, 507, "{:?}", newcomer.body);
    assert_eq!(newcomer.json()["error"], "actor_storage_full");
    assert!(!o.data.join("actors/runner/c.sqlite3").exists());
    let alive = o.call("GET", &format!("/r/a/status/{a}"), b"").await;
    assert_eq!(alive.status, 200, "{:?}", alive.body);

    // Removing a's slot gives its bytes back to the whole app: a new actor
    // is made and b grows into what a held.
    o.call("POST", &format!("/r/a/kill/{a}"), b"").await;
    let removed = o.call("POST", "/r/a/remove-storage/app", b"").await;
    assert_eq!(removed.json()["removed"], true, "{:?}", removed.body);
    let s = status(&o).await;
    assert_eq!(s["slot_storage_bytes"], slot_disk_bytes(&o.data), "{s}");
    assert!(
        slots - s["slot_storage_bytes"].as_u64().unwrap() > 3 * MIB,
        "{s}"
    );
    assert_eq!(o.call("GET", "/r/c/count", b"").await.json()["n"], 1);
    assert_eq!(fill(&o, b, "b", "write", 2).await, (2, None));

    // After a restart the room counts the slots from the disk again, and
    // holds a new owner, whose own quota is empty, to what is left.
    o.remove_data = false;
    let data = o.data.clone();
    drop(o);
    let o = Owners::start_in(data, &limits).await;
    // b's process is started again by its launch journal: its first turn
    // after the restart waits for that.
    let listed = o.call("GET", "/r/b/list", b"").await.json();
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    let s = status(&o).await;
    assert_eq!(s["slot_storage_bytes"], slot_disk_bytes(&o.data), "{s}");
    assert_eq!(
        s["storage_bytes"].as_u64().unwrap(),
        slot_disk_bytes(&o.data) + actor_disk_bytes(&o.data),
        "{s}"
    );
    let (d, _) = o.spawn("d", "slot=app&durable=1").await;
    let s = status(&o).await;
    let free = ROOM - s["storage_bytes"].as_u64().unwrap();
    assert!(free / 4096 < 1000, "{s}");
    assert_eq!(fill(&o, d, "d", "files", 2000).await, (free / 4096, full));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_actor_ends_its_processes_and_removes_its_slots_and_a_namesake_finds_nothing() {
    let o = Owners::start("deleted-owner", &["actor_idle_ms=600000"]).await;
    let status = async || o.weir.admin_get("/actors").await.json()["status"].clone();
    let put = async |owner: &str, pid: u64, file: &str| {
        let r = o
            .call(
                "PUT",
                &format!("/r/{owner}/proc/{pid}/files/{file}"),
                &[7u8; 100_000],
            )
            .await;
        assert_eq!(r.text(), "wrote 100000");
    };
    let (durable, _) = o.spawn("gone", "slot=app&durable=1").await;
    let (scratch, _) = o.spawn("gone", "slot=tmp").await;
    put("gone", durable, "notes.txt").await;
    put("gone", scratch, "tmp.bin").await;
    let (kept, _) = o.spawn("kept", "slot=app&durable=1").await;
    put("kept", kept, "notes.txt").await;
    let before = status().await["slot_storage_bytes"].as_u64().unwrap();
    assert!(before > 300_000, "{before}");

    let deleted = o.weir.admin_send("DELETE", "/actors/runner/gone").await;
    assert_eq!(deleted.json()["deleted"], true, "{:?}", deleted.body);

    // Its processes are gone, before the deletion answered; the other
    // owner's runs on.
    let listed = o.weir.admin_get("/processes").await.json();
    let owners: Vec<&str> = listed["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["owner"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(owners, ["kept"], "{listed}");
    // Its slots are off the disk, the durable one and the ephemeral one,
    // and their bytes are back in the room; the other owner's are not.
    let durable_dirs = std::fs::read_dir(o.data.join("slots/durable/runner"))
        .unwrap()
        .count();
    assert_eq!(durable_dirs, 1, "only kept's owner directory is left");
    let ephemeral = std::fs::read_dir(o.data.join("slots/ephemeral"))
        .unwrap()
        .count();
    assert_eq!(ephemeral, 0);
    let s = status().await;
    assert_eq!(s["slot_storage_bytes"], slot_disk_bytes(&o.data), "{s}");
    assert!(
        before - s["slot_storage_bytes"].as_u64().unwrap() >= 200_000,
        "{s}"
    );
    assert_eq!(s["actors"], 1, "{s}");
    let read = o
        .call("GET", &format!("/r/kept/proc/{kept}/files/notes.txt"), b"")
        .await;
    assert_eq!(read.body.as_ref().unwrap().len(), 100_000);
    // Nothing of the deleted owner came back meanwhile (a process's end
    // does not reopen its owner to clean its journal).
    assert!(!o.data.join("actors/runner/gone.sqlite3").exists());

    // A new actor of the same name starts with nothing of the old one.
    let listed = o.call("GET", "/r/gone/list", b"").await.json();
    assert_eq!(listed, serde_json::json!([]));
    let (again, _) = o.spawn("gone", "slot=app&durable=1").await;
    let read = o
        .call("GET", &format!("/r/gone/proc/{again}/files/notes.txt"), b"")
        .await;
    assert_eq!(
        (read.status.as_u16(), read.text()),
        (404, "NotFound".to_string())
    );
    let s = status().await;
    assert_eq!(
        s["storage_bytes"].as_u64().unwrap(),
        slot_disk_bytes(&o.data) + actor_disk_bytes(&o.data),
        "{s}"
    );
}

#[test]
fn a_slots_directory_that_cannot_be_opened_stops_the_start_naming_it() {
    // The room must count the durable slots before any actor runs: a
    // server that cannot read them does not serve with a count too low.
    let data = weir_scratch::dir("slots-unopenable");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("slots"), b"not a directory").unwrap();
    let runner = common::guest("runner");
    let actor = format!("runner={}", runner.display());
    let out = common::run_weir(&[
        "serve",
        runner.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
        "--actor",
        &actor,
    ]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("storage slots: cannot open")
            && out
                .stderr
                .contains(&data.join("slots").display().to_string()),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_unlinked_while_held_open_stays_counted_until_it_is_closed() {
    const MAX: u64 = 4 << 20;
    let limit = format!("max_slot_bytes={MAX}");
    // A thousand files take a debug build past the default second.
    let o = Owners::start("slot-orphans", &[&limit, "event_limit_ms=20000"]).await;
    let (pid, _) = o.spawn("owner", "slot=app&durable=1").await;
    // Fill, unlink, keep open: each file's MiB is still on the disk while
    // the process holds it, so beside `starts.log` three fit, not more.
    let (done, error) = fill(&o, pid, "owner", "orphans", 20).await;
    assert_eq!(done, 3, "{error:?}");
    assert!(error.is_some());
    // Closed, they give their bytes back: as many empty files fit as in
    // a slot holding only `starts.log`.
    assert_eq!(fill(&o, pid, "owner", "let-go", 0).await, (3, None));
    assert_eq!(
        fill(&o, pid, "owner", "files", 2000).await,
        (1022, Some("StorageFull".to_string()))
    );
}
