//! The data directory as a whole: who holds it, and the admin credential
//! kept in it.
//!
//! Invariants owned here:
//! - one server per data directory: [`DataDir::open`] takes an exclusive
//!   lock (`flock`) on `<dir>/weir.lock` and keeps it for the life of the
//!   value; a second server is refused with the holder's pid. The kernel
//!   drops the lock when the process ends, however it ends (`SIGKILL`
//!   included), so a crash never leaves the directory locked;
//! - the data directory is this user's alone: it is created 0700, one
//!   that exists is refused when another user owns it or others may write
//!   it (they could plant a token they know, or compiled code Weir would
//!   load), and one others may read is closed to them (0700) before
//!   anything is read from it;
//! - the admin token is created once, at the first start, from the
//!   operating system's random source, readable by its owner only (mode
//!   0600), and never logged; a token file that is not a plain file of
//!   this user's, or that others may read or write, is refused;
//! - the lock file holds the holder's pid on its first line, then
//!   **stamps**: lines this build carries over from one holder to the
//!   next. Every build that takes the lock rewrites the file, and builds
//!   from before stamps write only their pid: a stamp still there proves
//!   that no such build held the directory since it was written (see
//!   `weir_actors::directory`'s launch marks).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "weir.lock";

/// The admin token's file name inside the data directory.
pub const TOKEN_FILE: &str = "admin-token";

/// Where a server records its admin address (and its pid) inside its data
/// directory: the operators' commands send the token there, and nowhere
/// they merely guess.
pub const ADDRESS_FILE: &str = "admin-address";

/// Random bytes in an admin token (hex encoded: twice as many characters).
/// 32 bytes is 256 bits: not guessable by any number of requests.
pub const TOKEN_BYTES: usize = 32;

/// Why the data directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("data dir {path} is in use by another weir (pid {holder}); one server per data dir")]
    InUse { path: PathBuf, holder: String },
    #[error("cannot use data dir {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// Someone else could read or change what it holds.
    #[error("refusing {path}: {why}")]
    Unsafe { path: PathBuf, why: String },
}

/// Makes sure `path` is a data directory only this user can reach:
/// created 0700 if missing; refused if another user owns it or others may
/// write it; closed to others (0700) if they may read it.
pub fn prepare(path: &Path) -> Result<(), DataDirError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let io = |source| DataDirError::Io {
        path: path.to_path_buf(),
        cause: source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(io)?;
    let meta = std::fs::metadata(path).map_err(io)?;
    let unsafe_because = |why: String| DataDirError::Unsafe {
        path: path.to_path_buf(),
        why,
    };
    if !meta.is_dir() {
        return Err(unsafe_because("it is not a directory".into()));
    }
    let me = current_user();
    if meta.uid() != me {
        return Err(unsafe_because(format!(
            "the data dir is owned by uid {}, not by this user (uid {me}): whoever owns it could plant an admin token or code that Weir would trust",
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(unsafe_because(format!(
            "the data dir's mode is {mode:04o}: others may write it, and could plant an admin token or code that Weir would trust; make it 0700"
        )));
    }
    if mode & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
        tracing::info!(path = %path.display(), was = format!("{mode:04o}"), "closed the data dir to other users (0700): it holds every actor's storage and the admin token");
    }
    Ok(())
}

/// The effective user this process acts as.
fn current_user() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// A data directory held by this process.
pub struct DataDir {
    path: PathBuf,
    /// Holds the lock until dropped.
    _lock: File,
}

impl DataDir {
    /// Creates the directory if needed and takes its lock.
    pub fn open(path: &Path) -> Result<DataDir, DataDirError> {
        let io = |source| DataDirError::Io {
            path: path.to_path_buf(),
            cause: source,
        };
        prepare(path)?;
        let lock_path = path.join(LOCK_FILE);
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io)?;
        let locked = lock.try_lock();
        let mut before = String::new();
        let _ = lock.read_to_string(&mut before);
        match locked {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = before.lines().next().unwrap_or("").trim();
                return Err(DataDirError::InUse {
                    path: path.to_path_buf(),
                    holder: if holder.is_empty() {
                        "unknown".into()
                    } else {
                        holder.into()
                    },
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        let mut content = format!("{}\n", std::process::id());
        for stamp in before.lines().skip(1).filter(|l| !l.trim().is_empty()) {
            content.push_str(stamp);
            content.push('\n');
        }
        lock.set_len(0).map_err(io)?;
        lock.rewind().map_err(io)?;
        // Not synced: a rewrite a crash loses leaves stamps missing, which
        // costs what a stamp saves, never more.
        lock.write_all(content.as_bytes()).map_err(io)?;
        Ok(DataDir {
            path: path.to_path_buf(),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the admin token is kept.
    pub fn token_path(&self) -> PathBuf {
        self.path.join(TOKEN_FILE)
    }

    /// The admin token: read from the data directory, or made and written
    /// there (mode 0600) at the first start.
    pub fn admin_token(&self) -> Result<String, DataDirError> {
        let path = self.token_path();
        let io = |source| DataDirError::Io {
            path: path.clone(),
            cause: source,
        };
        match std::fs::symlink_metadata(&path) {
            Ok(meta) => {
                use std::os::unix::fs::MetadataExt;
                let refused = |why: String| DataDirError::Unsafe {
                    path: path.clone(),
                    why,
                };
                if !meta.file_type().is_file() {
                    return Err(refused(
                        "the admin token is not a plain file (a link, or a directory)".into(),
                    ));
                }
                if meta.uid() != current_user() {
                    return Err(refused(format!(
                        "the admin token is owned by uid {}, not by this user: whoever made it knows it",
                        meta.uid()
                    )));
                }
                let mode = meta.mode() & 0o777;
                if mode & 0o077 != 0 {
                    return Err(refused(format!(
                        "the admin token's mode is {mode:04o}: others may read or write it; make it 0600, or remove it for a new one"
                    )));
                }
                let token = std::fs::read_to_string(&path).map_err(io)?;
                if !token.trim().is_empty() {
                    return Ok(token.trim().to_string());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let mut random = [0u8; TOKEN_BYTES];
        File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut random))
            .map_err(io)?;
        let token: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        file.write_all(token.as_bytes()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(token)
    }
}

impl DataDir {
    /// Records where this server's admin endpoints are (or that it serves
    /// none), for the operators' commands.
    pub fn record_admin_address(
        &self,
        addr: Option<std::net::SocketAddr>,
    ) -> Result<(), DataDirError> {
        let path = self.path.join(ADDRESS_FILE);
        let io = |source| DataDirError::Io {
            path: path.clone(),
            cause: source,
        };
        let Some(addr) = addr else {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
                _ => Ok(()),
            };
        };
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        file.write_all(format!("{addr} {}\n", std::process::id()).as_bytes())
            .map_err(io)
    }
}

/// The admin address the server holding `data_dir` recorded, if that
/// server still runs (a server that died leaves a file naming an address
/// someone else may listen on by now).
pub fn admin_address(data_dir: &Path) -> Option<std::net::SocketAddr> {
    let text = std::fs::read_to_string(data_dir.join(ADDRESS_FILE)).ok()?;
    let (addr, pid) = text.trim().split_once(' ')?;
    let pid: i32 = pid.parse().ok()?;
    // SAFETY: signal 0 only asks whether the process exists.
    let alive = pid > 0 && unsafe { libc::kill(pid, 0) } == 0;
    let held = std::fs::read_to_string(data_dir.join(LOCK_FILE))
        .is_ok_and(|lock| lock.lines().next().map(str::trim) == Some(&pid.to_string()));
    (alive && held).then(|| addr.parse().ok()).flatten()
}

/// Serializes this process's changes to lock files' stamps (apps start
/// side by side).
static STAMPS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// True when the lock file of `data_dir` holds `stamp`.
pub fn stamped(data_dir: &Path, stamp: &str) -> bool {
    std::fs::read_to_string(data_dir.join(LOCK_FILE))
        .is_ok_and(|content| content.lines().skip(1).any(|line| line == stamp))
}

/// Adds `stamp` to the lock file of `data_dir` (held by this process),
/// durably, after removing the stamps that start with `replaces`.
pub fn stamp(data_dir: &Path, stamp: &str, replaces: &str) -> std::io::Result<()> {
    let _one = STAMPS.lock().unwrap_or_else(|p| p.into_inner());
    let path = data_dir.join(LOCK_FILE);
    let before = std::fs::read_to_string(&path)?;
    let mut lines = before.lines();
    let mut content = format!("{}\n", lines.next().unwrap_or(""));
    for line in lines.filter(|l| !l.trim().is_empty() && !l.starts_with(replaces)) {
        content.push_str(line);
        content.push('\n');
    }
    content.push_str(stamp);
    content.push('\n');
    // Written in place: the file is the lock, held through this open
    // file description's sibling.
    let mut file = OpenOptions::new().write(true).open(&path)?;
    file.set_len(0)?;
    file.write_all(content.as_bytes())?;
    file.sync_all()
}

/// Reads the admin token of a data directory another process serves (for
/// `weir actors`).
pub fn read_admin_token(data_dir: &Path) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(data_dir.join(TOKEN_FILE))?
        .trim()
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn one_holder_at_a_time_and_the_token_is_private_and_stable() {
        let dir = weir_scratch::dir("datadir");
        let held = DataDir::open(&dir).unwrap();
        match DataDir::open(&dir) {
            Err(DataDirError::InUse { holder, .. }) => {
                assert_eq!(holder, std::process::id().to_string())
            }
            other => panic!("a second open: {:?}", other.err()),
        }
        let token = held.admin_token().unwrap();
        assert_eq!(token.len(), TOKEN_BYTES * 2);
        assert_eq!(held.admin_token().unwrap(), token, "made once");
        let mode = std::fs::metadata(held.token_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(read_admin_token(&dir).unwrap(), token);
        drop(held);
        DataDir::open(&dir).expect("free again once dropped");
    }

    #[test]
    fn stamps_are_carried_from_holder_to_holder_and_an_older_build_drops_them() {
        let dir = weir_scratch::dir("datadir-stamps");
        let held = DataDir::open(&dir).unwrap();
        stamp(&dir, "marks a1", "marks ").unwrap();
        stamp(&dir, "other x", "other ").unwrap();
        stamp(&dir, "marks b2", "marks ").unwrap();
        assert!(stamped(&dir, "marks b2") && stamped(&dir, "other x"));
        assert!(!stamped(&dir, "marks a1"), "replaced");
        match DataDir::open(&dir) {
            Err(DataDirError::InUse { holder, .. }) => {
                assert_eq!(holder, std::process::id().to_string(), "the pid alone")
            }
            other => panic!("a second open: {:?}", other.err()),
        }
        drop(held);
        let held = DataDir::open(&dir).unwrap();
        assert!(stamped(&dir, "marks b2"), "carried to the next holder");
        drop(held);
        // A build from before stamps writes its pid alone.
        std::fs::write(dir.join(LOCK_FILE), "4242\n").unwrap();
        let _held = DataDir::open(&dir).unwrap();
        assert!(!stamped(&dir, "marks b2"));
    }
}
