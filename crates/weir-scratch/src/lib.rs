//! Scratch directories for Weir's tests.
//!
//! Invariant owned here: a test run leaves at most its own scratch tree
//! behind. Every scratch directory lives under
//! `<temp>/weir-tests/<run>/<pid>/`, where the run is the process that
//! started the test binary (the `cargo test` that runs every binary of
//! the suite, one after another); the first scratch directory a process
//! asks for sweeps away the trees of runs whose process has exited. So
//! the data of the last run's tests stays for a person to inspect (a
//! failing test's server, its SQLite files, its logs), and repeated runs
//! do not fill the disk: the suite writes hundreds of megabytes of data
//! directories per run.

use std::path::{Path, PathBuf};
use std::sync::Once;

/// The tree every test process's scratch directories live under.
pub fn root() -> PathBuf {
    std::env::temp_dir().join("weir-tests")
}

/// A scratch path for `name`, unique to this process: it does not exist
/// when returned (a directory or file left there is removed) and is not
/// created, so a caller that wants a directory creates it and one that wants a
/// missing path (a server creating its own data directory) has one.
/// `name` is one path segment, unique among this process's tests.
pub fn dir(name: &str) -> PathBuf {
    let dir = path(name);
    let cleared = match std::fs::symlink_metadata(&dir) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&dir),
        Ok(_) => std::fs::remove_file(&dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    if let Err(e) = cleared {
        panic!("cannot clear {}: {e}", dir.display());
    }
    dir
}

/// Where [`dir`] puts `name`, as it is now: for a test that finds again
/// what it wrote there.
pub fn path(name: &str) -> PathBuf {
    assert!(
        !name.is_empty() && !name.contains(['/', '\\']) && name != "." && name != "..",
        "a scratch name is one path segment: {name:?}"
    );
    static SWEEP: Once = Once::new();
    SWEEP.call_once(|| sweep(&root(), run()));
    let own = own();
    std::fs::create_dir_all(&own)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", own.display()));
    own.join(name)
}

/// This process's tree: under its run's.
fn own() -> PathBuf {
    root()
        .join(run().to_string())
        .join(std::process::id().to_string())
}

/// The run this process belongs to: the process that started it.
fn run() -> u32 {
    #[cfg(unix)]
    let run = std::os::unix::process::parent_id();
    #[cfg(not(unix))]
    let run = std::process::id();
    run
}

/// Removes the trees under `root` of runs whose process has exited,
/// except `keep`'s. A tree whose run still goes on (a second `cargo test`
/// beside this one) is left alone, as is anything that is not a run's
/// tree.
fn sweep(root: &Path, keep: u32) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != keep && !running(pid) {
            // Best effort: a tree that cannot be removed (another user's
            // files) is no reason to fail a test.
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Whether process `pid` runs. Where that cannot be known (no `/proc`),
/// every process counts as running and nothing is swept.
fn running(pid: u32) -> bool {
    let proc_root = Path::new("/proc");
    !proc_root.join("self").exists() || proc_root.join(pid.to_string()).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_run_is_swept_and_this_run_and_live_ones_kept() {
        let root = dir("sweep-root");
        // Pids above the kernel's maximum (4,194,304) never run.
        let dead = root.join("4294967295");
        let kept = root.join("4294967294");
        let live = root.join(std::process::id().to_string());
        let other = root.join("notes");
        for d in [&dead, &kept, &live, &other] {
            std::fs::create_dir_all(d.join("data")).unwrap();
        }
        sweep(&root, 4294967294);
        assert_eq!(dead.exists(), !Path::new("/proc/self").exists());
        assert!(kept.join("data").exists(), "this run's tree stays");
        assert!(live.join("data").exists(), "a live run's tree stays");
        assert!(other.exists(), "what is not a run's tree stays");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    #[cfg(unix)]
    fn a_scratch_path_is_fresh_and_under_this_run_and_process() {
        let a = dir("fresh");
        let run_tree = root().join(std::os::unix::process::parent_id().to_string());
        assert_eq!(
            a.parent().unwrap(),
            run_tree.join(std::process::id().to_string())
        );
        std::fs::create_dir_all(a.join("left")).unwrap();
        assert!(path("fresh").join("left").exists(), "found as it is");
        let again = dir("fresh");
        assert_eq!(a, again);
        assert!(!again.exists(), "what an earlier use left is removed");
        std::fs::write(&again, b"a file this time").unwrap();
        assert!(!dir("fresh").exists(), "a file left there is removed too");
    }

    #[test]
    #[should_panic(expected = "one path segment")]
    fn a_name_cannot_leave_the_tree() {
        dir("../elsewhere");
    }
}
