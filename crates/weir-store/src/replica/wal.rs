//! Reading committed transactions out of a SQLite write-ahead log, the
//! way SQLite's own recovery does: frames are taken in order while their
//! salts match the header and their running checksum holds, and a
//! transaction is complete at its commit frame.
//!
//! Invariant owned here: only frames of committed transactions are
//! returned, each exactly once, in commit order. Frames after the last
//! commit frame (a transaction still being written, or one that was rolled
//! back after spilling pages) are never returned: a rolled-back
//! transaction's frames are overwritten by the next one, and the checksum
//! chain breaks where the new frames end.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes of the WAL header.
pub const HEADER_BYTES: u64 = 32;

/// Bytes of each frame's header, before its page.
pub const FRAME_HEADER_BYTES: u64 = 24;

/// The WAL magic numbers: little-endian checksums, and big-endian ones.
const MAGIC_LE: u32 = 0x377f_0682;
const MAGIC_BE: u32 = 0x377f_0683;

/// Frames read per `pread` at most when scanning: a large commit is read
/// in slices this size.
const READ_FRAMES: u64 = 64;

/// Frames read by the first `pread` of a scan; each further read of the
/// same scan reads twice as many, up to [`READ_FRAMES`]. A typical commit
/// is a few frames, and the file's length does not say where the new ones
/// end: a WAL restarted after a checkpoint keeps its length (its stale
/// frames stay past the new ones until overwritten), so a first read as
/// long as the file allows would read, zero and copy up to `READ_FRAMES`
/// frames for every commit of a long-lived replica.
const FIRST_READ_FRAMES: u64 = 4;

/// Where a reader has got to in one generation of a WAL file (between two
/// restarts of the log).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalCursor {
    /// The salts of the generation read so far, once a header was seen.
    salts: Option<(u32, u32)>,
    /// Frames already returned (or skipped) in that generation.
    pub frames: u64,
    /// The running checksum after the last returned frame.
    running: (u32, u32),
}

/// One committed transaction: its pages in the order written (a page may
/// repeat; the last copy wins) and the database's size after it.
#[derive(Debug, PartialEq, Eq)]
pub struct WalCommit {
    pub pages: Vec<(u32, Vec<u8>)>,
    pub db_pages: u32,
}

/// Why a WAL could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// Says its cause in its own words (so it hands on no source).
    #[error("cannot read the write-ahead log: {0}")]
    Io(io::Error),
    #[error("the write-ahead log has page size {found}, the database {expected}")]
    PageSize { found: u32, expected: u32 },
    #[error("the write-ahead log's header is not SQLite's")]
    Header,
}

impl From<io::Error> for WalError {
    fn from(e: io::Error) -> Self {
        WalError::Io(e)
    }
}

/// SQLite's WAL checksum over `data` (a multiple of 8 bytes), continuing
/// from `(s1, s2)`.
fn checksum(data: &[u8], big_endian: bool, (mut s1, mut s2): (u32, u32)) -> (u32, u32) {
    for pair in data.chunks_exact(8) {
        let word = |b: &[u8]| {
            let b: [u8; 4] = b.try_into().expect("4 bytes");
            if big_endian {
                u32::from_be_bytes(b)
            } else {
                u32::from_le_bytes(b)
            }
        };
        s1 = s1.wrapping_add(word(&pair[..4]).wrapping_add(s2));
        s2 = s2.wrapping_add(word(&pair[4..]).wrapping_add(s1));
    }
    (s1, s2)
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Reads the transactions committed to the WAL at `path` after `cursor`,
/// and moves the cursor past them. A WAL that does not exist, or holds no
/// header yet, holds nothing. A WAL whose salts changed since the cursor
/// was made was restarted (after a checkpoint): it is read from its first
/// frame.
pub fn read_commits(
    path: &Path,
    page_size: u32,
    cursor: &mut WalCursor,
) -> Result<Vec<WalCommit>, WalError> {
    match File::open(path) {
        Ok(file) => read_commits_from(&file, page_size, cursor),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// [`read_commits`] from a WAL file already open (a checkpoint that
/// truncates the WAL keeps the file, so one handle serves a replica's
/// life).
pub fn read_commits_from(
    file: &File,
    page_size: u32,
    cursor: &mut WalCursor,
) -> Result<Vec<WalCommit>, WalError> {
    let len = file.metadata()?.len();
    if len < HEADER_BYTES {
        return Ok(Vec::new());
    }
    let mut header = [0u8; HEADER_BYTES as usize];
    file.read_exact_at(&mut header, 0)?;
    let big_endian = match be32(&header, 0) {
        MAGIC_LE => false,
        MAGIC_BE => true,
        _ => return Err(WalError::Header),
    };
    let found = be32(&header, 8);
    if found != page_size {
        return Err(WalError::PageSize {
            found,
            expected: page_size,
        });
    }
    let salts = (be32(&header, 16), be32(&header, 20));
    let stored = (be32(&header, 24), be32(&header, 28));
    if checksum(&header[..24], big_endian, (0, 0)) != stored {
        // A header being rewritten, or not yet written: nothing committed.
        return Ok(Vec::new());
    }
    if cursor.salts != Some(salts) {
        *cursor = WalCursor {
            salts: Some(salts),
            frames: 0,
            running: stored,
        };
    }
    let frame_bytes = FRAME_HEADER_BYTES + u64::from(page_size);
    let available = (len - HEADER_BYTES) / frame_bytes;
    let mut commits = Vec::new();
    let mut pending: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut running = cursor.running;
    let mut next = cursor.frames;
    let mut buf = Vec::new();
    let mut slice = FIRST_READ_FRAMES;
    'scan: while next < available {
        let count = (available - next).min(slice);
        slice = (slice * 2).min(READ_FRAMES);
        buf.resize((count * frame_bytes) as usize, 0);
        file.read_exact_at(&mut buf, HEADER_BYTES + next * frame_bytes)?;
        for frame in buf.chunks_exact(frame_bytes as usize) {
            let (head, page) = frame.split_at(FRAME_HEADER_BYTES as usize);
            let pgno = be32(head, 0);
            if pgno == 0 || (be32(head, 8), be32(head, 12)) != salts {
                break 'scan;
            }
            let sum = checksum(page, big_endian, checksum(&head[..8], big_endian, running));
            if sum != (be32(head, 16), be32(head, 20)) {
                break 'scan;
            }
            running = sum;
            next += 1;
            pending.push((pgno, page.to_vec()));
            let db_pages = be32(head, 4);
            if db_pages != 0 {
                commits.push(WalCommit {
                    pages: std::mem::take(&mut pending),
                    db_pages,
                });
                cursor.frames = next;
                cursor.running = running;
            }
        }
    }
    Ok(commits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    fn open(dir: &Path) -> Connection {
        let conn = Connection::open(dir.join("db.sqlite3")).unwrap();
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
            .unwrap();
        conn.pragma_update(None, "page_size", 2048).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        conn
    }

    fn dir(name: &str) -> std::path::PathBuf {
        let dir = weir_scratch::dir(&format!("wal-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn each_commit_is_read_once_and_a_rollback_is_never_read() {
        let dir = dir("commits");
        let conn = open(&dir);
        let wal = dir.join("db.sqlite3-wal");
        let mut cursor = WalCursor::default();
        assert!(read_commits(&wal, 2048, &mut cursor).unwrap().is_empty());
        conn.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
        let first = read_commits(&wal, 2048, &mut cursor).unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].db_pages, 2);
        assert!(read_commits(&wal, 2048, &mut cursor).unwrap().is_empty());
        // A transaction big enough to spill pages into the WAL, rolled
        // back: its frames are there, and never read as committed.
        conn.pragma_update(None, "cache_size", 10).unwrap();
        conn.execute_batch(
            "BEGIN; WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 200) INSERT INTO t SELECT zeroblob(1500) FROM c; ROLLBACK;",
        )
        .unwrap();
        assert!(read_commits(&wal, 2048, &mut cursor).unwrap().is_empty());
        conn.execute_batch("INSERT INTO t VALUES (x'01'); INSERT INTO t VALUES (x'02');")
            .unwrap();
        let two = read_commits(&wal, 2048, &mut cursor).unwrap();
        assert_eq!(two.len(), 2, "two autocommit statements, two commits");
        // After a checkpoint that truncates the log, reading starts over.
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        conn.execute_batch("INSERT INTO t VALUES (x'03')").unwrap();
        let after = read_commits(&wal, 2048, &mut cursor).unwrap();
        assert_eq!(after.len(), 1);
        assert_eq!(cursor.frames as usize, after[0].pages.len());
    }

    /// A live checkpoint restarts the WAL in place: the file keeps its
    /// length and its stale frames. Commits written over them — small
    /// ones, and one larger than any single read — are each read once and
    /// whole, and nothing of the stale tail is read as committed.
    #[test]
    fn a_wal_restarted_in_place_is_read_past_its_stale_tail() {
        let dir = dir("restarted");
        let conn = open(&dir);
        let wal = dir.join("db.sqlite3-wal");
        let mut cursor = WalCursor::default();
        conn.execute_batch("CREATE TABLE t (x BLOB)").unwrap();
        conn.execute_batch(
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 300) INSERT INTO t SELECT zeroblob(1500) FROM c",
        )
        .unwrap();
        let before = read_commits(&wal, 2048, &mut cursor).unwrap();
        assert_eq!(before.len(), 2);
        let long = std::fs::metadata(&wal).unwrap().len();
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .unwrap();

        // The next commit restarts the WAL at its first frame.
        conn.execute_batch("UPDATE t SET x = x'01' WHERE rowid = 1")
            .unwrap();
        assert_eq!(
            std::fs::metadata(&wal).unwrap().len(),
            long,
            "restarted in place"
        );
        let small = read_commits(&wal, 2048, &mut cursor).unwrap();
        assert_eq!(small.len(), 1);
        assert_eq!(cursor.frames as usize, small[0].pages.len());
        assert!(small[0].pages.len() < READ_FRAMES as usize);

        // A commit of more frames than one read takes, then two small ones.
        conn.execute_batch("UPDATE t SET x = zeroblob(1400) WHERE rowid <= 150")
            .unwrap();
        let large = read_commits(&wal, 2048, &mut cursor).unwrap();
        assert_eq!(large.len(), 1);
        assert!(
            large[0].pages.len() > READ_FRAMES as usize,
            "{} frames",
            large[0].pages.len()
        );
        conn.execute_batch(
            "UPDATE t SET x = x'02' WHERE rowid = 2; UPDATE t SET x = x'03' WHERE rowid = 3;",
        )
        .unwrap();
        let two = read_commits(&wal, 2048, &mut cursor).unwrap();
        assert_eq!(two.len(), 2);
        let frames =
            small[0].pages.len() + large[0].pages.len() + two[0].pages.len() + two[1].pages.len();
        assert_eq!(cursor.frames as usize, frames);
        assert!(read_commits(&wal, 2048, &mut cursor).unwrap().is_empty());
        assert_eq!(
            std::fs::metadata(&wal).unwrap().len(),
            long,
            "the stale tail is still there"
        );
    }
}
