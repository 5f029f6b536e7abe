//! Rebuilding a replica from its history, and telling whether a local copy
//! needs it.
//!
//! Invariant owned here: a database file is replaced only by one built
//! whole from a snapshot and the log entries after it, each entry checked
//! to continue from the state before it (its pre-apply checksum and
//! number) and to produce the state it claims (its post-apply checksum);
//! the new file is written beside the old, made durable, and renamed over
//! it, so a crash leaves one or the other, never a mix.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use litetx::{Decoder, PageNum};

use super::{Checksum, EMPTY, ReplicaError, lock_page, txid, wal_path};

/// What a restore produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restored {
    pub head: u64,
    pub checksum: Checksum,
    pub db_pages: u32,
}

/// A database being rebuilt: its page checksums as the history goes.
struct Building {
    file: File,
    page_size: u32,
    head: u64,
    db_pages: u32,
    sums: BTreeMap<u32, Checksum>,
    checksum: Checksum,
}

fn ltx_error(e: impl std::fmt::Display) -> ReplicaError {
    ReplicaError::Ltx(e.to_string())
}

impl Building {
    /// Applies one LTX file: a snapshot (only first) or a log entry.
    fn apply(&mut self, ltx: &[u8]) -> Result<(), ReplicaError> {
        let (mut decoder, header) = Decoder::new(ltx).map_err(ltx_error)?;
        if header.page_size.into_inner() != self.page_size {
            return Err(ReplicaError::Discontinuous(format!(
                "page size {} in a database of {}",
                header.page_size.into_inner(),
                self.page_size
            )));
        }
        let snapshot = header.pre_apply_checksum.is_none();
        let expected_min = if snapshot {
            txid(0)
        } else {
            txid(self.head + 1)
        };
        if header.min_txid != expected_min {
            return Err(ReplicaError::Discontinuous(format!(
                "entry {} after head {}",
                header.min_txid.into_inner() - 1,
                self.head
            )));
        }
        if let Some(before) = header.pre_apply_checksum
            && before != self.checksum
        {
            return Err(ReplicaError::Checksum {
                expected: before,
                found: self.checksum,
            });
        }
        if snapshot && self.head != 0 {
            return Err(ReplicaError::Discontinuous(
                "a snapshot after the log began".into(),
            ));
        }
        let new_pages = header.commit.into_inner();
        // Pages cut off by a shrinking commit leave the checksum.
        let cut: Vec<u32> = self.sums.range(new_pages + 1..).map(|(p, _)| *p).collect();
        for pgno in cut {
            if let Some(old) = self.sums.remove(&pgno) {
                self.checksum = self.checksum ^ old;
            }
        }
        let mut page = vec![0u8; self.page_size as usize];
        while let Some(pgno) = decoder.decode_page(&mut page).map_err(ltx_error)? {
            let n = pgno.into_inner();
            if let Some(old) = self.sums.remove(&n) {
                self.checksum = self.checksum ^ old;
            }
            let new = super::page_sum(pgno, &page);
            self.checksum = self.checksum ^ new;
            self.sums.insert(n, new);
            self.file
                .write_all_at(&page, u64::from(n - 1) * u64::from(self.page_size))?;
        }
        let trailer = decoder.finish().map_err(ltx_error)?;
        if trailer.post_apply_checksum != self.checksum {
            return Err(ReplicaError::Checksum {
                expected: trailer.post_apply_checksum,
                found: self.checksum,
            });
        }
        self.file
            .set_len(u64::from(new_pages) * u64::from(self.page_size))?;
        self.db_pages = new_pages;
        self.head = header.max_txid.into_inner() - 1;
        Ok(())
    }
}

/// Replaces the database at `path` with the one `snapshot` and `log`
/// (in order) make, and removes its WAL. Nothing is replaced if any entry
/// fails its checks; the result's head and checksum are the last entry's.
pub fn restore<'a>(
    path: &Path,
    page_size: u32,
    snapshot: Option<&[u8]>,
    log: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Restored, ReplicaError> {
    let building_path = PathBuf::from(format!("{}-restoring", path.display()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&building_path)?;
    let mut building = Building {
        file,
        page_size,
        head: 0,
        db_pages: 0,
        sums: BTreeMap::new(),
        checksum: EMPTY,
    };
    let built = (|| -> Result<(), ReplicaError> {
        if let Some(snapshot) = snapshot {
            building.apply(snapshot)?;
        }
        for entry in log {
            building.apply(entry)?;
        }
        Ok(building.file.sync_all()?)
    })();
    if let Err(e) = built {
        let _ = std::fs::remove_file(&building_path);
        return Err(e);
    }
    // The old copy's WAL must not be replayed over the new file.
    for stale in [
        wal_path(path),
        PathBuf::from(format!("{}-shm", path.display())),
    ] {
        match std::fs::remove_file(&stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    std::fs::rename(&building_path, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(Restored {
        head: building.head,
        checksum: building.checksum,
        db_pages: building.db_pages,
    })
}

/// Folds the WAL of the database at `path` (if it has one) into its file,
/// leaving the WAL empty, and returns the file's checksum and size: what
/// the local copy holds, to compare with what its history says. `None`
/// when there is no copy SQLite can open (it is then simply rebuilt).
pub fn settle(path: &Path, page_size: u32) -> Result<Option<(Checksum, u32)>, ReplicaError> {
    if !path.exists() {
        return Ok(None);
    }
    crate::statement_memory::install();
    let checkpointed = (|| -> rusqlite::Result<()> {
        let conn = rusqlite::Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        conn.close().map_err(|(_, e)| e)
    })();
    if checkpointed.is_err() {
        return Ok(None);
    }
    file_checksum(path, page_size).map(Some)
}

/// The checksum of the database file at `path` (whose WAL must be empty)
/// and its size in pages; a missing file is the empty database.
pub fn file_checksum(path: &Path, page_size: u32) -> Result<(Checksum, u32), ReplicaError> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((EMPTY, 0)),
        Err(e) => return Err(e.into()),
    };
    let pages = (file.metadata()?.len() / u64::from(page_size)) as u32;
    let lock = lock_page(page_size);
    let mut sum = EMPTY;
    let mut page = vec![0u8; page_size as usize];
    for pgno in (1..=pages).filter(|p| *p != lock) {
        file.read_exact_at(&mut page, u64::from(pgno - 1) * u64::from(page_size))?;
        let n = PageNum::new(pgno).map_err(ltx_error)?;
        sum = sum ^ super::page_sum(n, &page);
    }
    Ok((sum, pages))
}

#[cfg(test)]
mod tests {
    use super::super::{Capture, LogEntry, encode_run};
    use super::*;

    /// Each commit as an LTX file of its own.
    fn each(log: &[LogEntry]) -> Vec<Vec<u8>> {
        log.iter().map(|e| e.ltx().unwrap()).collect()
    }
    use rusqlite::Connection;

    fn dir(name: &str) -> PathBuf {
        let dir = weir_scratch::dir(&format!("restore-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn open(path: &Path) -> Connection {
        let conn = Connection::open(path).unwrap();
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
            .unwrap();
        conn.pragma_update(None, "page_size", 2048).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        conn
    }

    /// A fresh replica with one table, in a directory of its own: the
    /// directory, the database's path, its connection and its capture.
    fn source(name: &str) -> (PathBuf, PathBuf, Connection, Capture) {
        let dir = dir(name);
        let source = dir.join("source.sqlite3");
        let conn = open(&source);
        let capture = Capture::fresh(&source, 2048);
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
            .unwrap();
        (dir, source, conn, capture)
    }

    fn rows(path: &Path) -> Vec<(i64, Vec<u8>)> {
        let conn = Connection::open(path).unwrap();
        let mut stmt = conn.prepare("SELECT id, v FROM t ORDER BY id").unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn a_log_rebuilds_the_database_page_for_page_and_a_snapshot_compacts_it() {
        let (dir, source, conn, mut capture) = source("rebuild");
        let mut log = capture.take().unwrap();
        for i in 0..50 {
            conn.execute(
                "INSERT INTO t (v) VALUES (?1)",
                [vec![i as u8; 300 + i * 40]],
            )
            .unwrap();
        }
        conn.execute_batch("DELETE FROM t WHERE id % 3 = 0; VACUUM;")
            .unwrap();
        log.extend(capture.take().unwrap());
        assert_eq!(log.len(), 53);
        assert_eq!(capture.head(), 53);
        let replica = dir.join("replica.sqlite3");
        let restored = restore(&replica, 2048, None, each(&log).iter().map(Vec::as_slice)).unwrap();
        assert_eq!(restored.head, 53);
        assert_eq!(restored.checksum, capture.checksum());
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        capture.checkpointed();
        assert_eq!(
            file_checksum(&source, 2048).unwrap(),
            (capture.checksum(), capture.db_pages())
        );
        assert_eq!(
            std::fs::read(&source).unwrap(),
            std::fs::read(&replica).unwrap(),
            "page for page"
        );
        assert_eq!(rows(&replica).len(), 34);

        // A snapshot at head 54 (read through SQLite, WAL and all: this
        // commit is not checkpointed), then more commits: the snapshot and
        // the entries after it rebuild the same database.
        conn.execute("INSERT INTO t (v) VALUES (x'bb')", [])
            .unwrap();
        assert_eq!(capture.take().unwrap().len(), 1);
        let (at, snapshot) = super::super::snapshot(&conn, &mut capture)
            .unwrap()
            .unwrap();
        assert_eq!(at, 54);
        conn.execute("UPDATE t SET v = x'ff' WHERE id = 1", [])
            .unwrap();
        conn.execute("INSERT INTO t (v) VALUES (x'aa')", [])
            .unwrap();
        let tail = capture.take().unwrap();
        assert_eq!(tail.iter().map(|e| e.head).collect::<Vec<_>>(), [55, 56]);
        let again = dir.join("again.sqlite3");
        let restored = restore(
            &again,
            2048,
            Some(&snapshot),
            each(&tail).iter().map(Vec::as_slice),
        )
        .unwrap();
        assert_eq!(restored.head, 56);
        assert_eq!(restored.checksum, capture.checksum());
        drop(conn);
        assert_eq!(rows(&again), rows(&source));
    }

    #[test]
    fn a_log_that_skips_or_forges_an_entry_replaces_nothing() {
        let (dir, _, conn, mut capture) = source("refused");
        for i in 0..3 {
            conn.execute("INSERT INTO t (v) VALUES (?1)", [vec![i as u8; 10]])
                .unwrap();
        }
        let log = capture.take().unwrap();
        let target = dir.join("target.sqlite3");
        std::fs::write(&target, b"the old copy").unwrap();
        // Entry 2 missing.
        let skipped = [&log[0], &log[2]];
        assert!(matches!(
            restore(
                &target,
                2048,
                None,
                skipped
                    .iter()
                    .map(|e| e.ltx().unwrap())
                    .collect::<Vec<_>>()
                    .iter()
                    .map(Vec::as_slice)
            ),
            Err(ReplicaError::Discontinuous(_))
        ));
        // A flipped byte: the LTX file's own checksum fails.
        let mut forged = log[1].ltx().unwrap();
        let at = forged.len() / 2;
        forged[at] ^= 1;
        assert!(
            restore(
                &target,
                2048,
                None,
                [log[0].ltx().unwrap().as_slice(), forged.as_slice()]
            )
            .is_err()
        );
        assert_eq!(std::fs::read(&target).unwrap(), b"the old copy");
        assert!(!dir.join("target.sqlite3-restoring").exists());
    }

    #[test]
    fn a_live_checkpoint_starts_the_wal_over_and_the_log_still_rebuilds_it() {
        let (dir, source, conn, mut capture) = source("live");
        let mut log = Vec::new();
        for round in 0..4 {
            for i in 0..20 {
                conn.execute(
                    "INSERT INTO t (v) VALUES (?1)",
                    [vec![round as u8; 100 + i * 30]],
                )
                .unwrap();
            }
            log.extend(capture.take().unwrap());
            // The WAL's pages go into the file; the next commit writes
            // the WAL from its start again, under new salts.
            assert!(
                super::super::checkpoint(&conn, &mut capture, super::super::Fold::Live).unwrap()
            );
        }
        let wal = std::fs::metadata(super::super::wal_path(&source))
            .unwrap()
            .len();
        assert!(wal > 0, "a live checkpoint keeps the WAL's file");
        let replica = dir.join("replica.sqlite3");
        let restored = restore(&replica, 2048, None, each(&log).iter().map(Vec::as_slice)).unwrap();
        assert_eq!(restored.head, 81);
        assert_eq!(restored.checksum, capture.checksum());
        drop(conn);
        assert_eq!(rows(&replica), rows(&source));
    }

    #[test]
    fn runs_of_commits_as_one_entry_each_rebuild_the_same_database() {
        let (dir, source, conn, mut capture) = source("runs");
        let mut log = capture.take().unwrap();
        // Growth, rewrites of the same pages, a shrink (VACUUM) and growth
        // again after it: a run may span any of them.
        for i in 0..30 {
            conn.execute(
                "INSERT INTO t (v) VALUES (?1)",
                [vec![i as u8; 200 + i * 60]],
            )
            .unwrap();
            conn.execute("UPDATE t SET v = ?1 WHERE id = 1", [vec![i as u8; 90]])
                .unwrap();
        }
        conn.execute_batch("DELETE FROM t WHERE id > 4; VACUUM;")
            .unwrap();
        for i in 0..6 {
            conn.execute("INSERT INTO t (v) VALUES (?1)", [vec![i as u8; 700]])
                .unwrap();
        }
        log.extend(capture.take().unwrap());
        let heads = log.len();
        let shrink = log
            .windows(2)
            .position(|w| w[1].db_pages < w[0].db_pages)
            .expect("the VACUUM shrank the database");
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        let expected = std::fs::read(&source).unwrap();
        // Runs of every length from 1 to the whole log, and one that
        // starts right before the shrink and ends after the growth.
        let mut splits: Vec<Vec<usize>> = (1..=heads).map(|n| vec![n]).collect();
        splits.push(vec![shrink, heads - shrink]);
        for lengths in splits {
            let mut entries = Vec::new();
            let mut at = 0;
            for n in lengths.iter().cycle() {
                if at == heads {
                    break;
                }
                let end = (at + n).min(heads);
                entries.push(encode_run(&log[at..end]).unwrap());
                at = end;
            }
            let replica = dir.join("replica.sqlite3");
            let restored =
                restore(&replica, 2048, None, entries.iter().map(Vec::as_slice)).unwrap();
            assert_eq!(restored.head, heads as u64, "runs of {lengths:?}");
            assert_eq!(restored.checksum, capture.checksum(), "runs of {lengths:?}");
            assert_eq!(
                std::fs::read(&replica).unwrap(),
                expected,
                "runs of {lengths:?}: page for page"
            );
        }
        // A run with a gap, or out of order, is refused when encoded.
        assert!(matches!(
            encode_run(&[log[0].clone(), log[2].clone()]),
            Err(ReplicaError::Discontinuous(_))
        ));
        assert!(matches!(
            encode_run(&[log[1].clone(), log[0].clone()]),
            Err(ReplicaError::Discontinuous(_))
        ));
        assert!(matches!(
            encode_run(&[]),
            Err(ReplicaError::Discontinuous(_))
        ));
    }
}
