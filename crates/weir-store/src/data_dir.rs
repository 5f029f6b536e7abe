//! The data directory as a whole: who holds it, and the admin credential
//! kept in it.
//!
//! Invariants owned here:
//! - one server per data directory: [`DataDir::open`] takes an exclusive
//!   lock (`flock`) on `<dir>/weir.lock` and keeps it for the life of the
//!   value; a second server is refused with the holder's pid. The kernel
//!   drops the lock when the process ends, however it ends (`SIGKILL`
//!   included), so a crash never leaves the directory locked;
//! - the admin token is created once, at the first start, from the
//!   operating system's random source, readable by its owner only (mode
//!   0600), and never logged.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "weir.lock";

/// The admin token's file name inside the data directory.
pub const TOKEN_FILE: &str = "admin-token";

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
        std::fs::create_dir_all(path).map_err(io)?;
        let lock_path = path.join(LOCK_FILE);
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&lock_path)
            .map_err(io)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = lock.read_to_string(&mut holder);
                let holder = holder.trim();
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
        lock.set_len(0).map_err(io)?;
        lock.rewind().map_err(io)?;
        writeln!(lock, "{}", std::process::id()).map_err(io)?;
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
        match std::fs::read_to_string(&path) {
            Ok(token) if !token.trim().is_empty() => return Ok(token.trim().to_string()),
            Ok(_) => {}
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
}
