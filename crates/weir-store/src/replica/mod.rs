//! Replicas: local SQLite databases whose durable copy lives elsewhere (in
//! cluster mode, in PostgreSQL). A replica's history is a numbered log of
//! its commits — each one the pages it wrote, as an LTX file — plus, now
//! and then, a snapshot of every page; replaying a snapshot and the log
//! after it rebuilds the database page for page.
//!
//! - [`Capture`] turns what SQLite committed into log entries, reading the
//!   write-ahead log ([`wal`]) after each commit;
//! - [`restore`] builds a database file from a snapshot and a log, and
//!   checksums a file to tell whether a local copy is already current.
//!
//! Invariants owned here:
//! - every commit is captured exactly once, in order, with the checksum of
//!   the whole database before and after it (LTX's running CRC-64 of every
//!   page): a log that does not continue from the state it is applied to,
//!   or that does not produce the state it claims, is refused;
//! - the database file is a replica's starting point only while it holds
//!   the whole state (at the start, and after a checkpoint the owner of the
//!   connection reports with [`Capture::checkpointed`]); the WAL must be
//!   read ([`Capture::take`]) before every checkpoint.

pub mod restore;
pub mod wal;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use litetx::Checksum;

/// What an object's durable row mirrors of its state after a commit, for
/// the nodes that never opened it: its next alarm (ms since the Unix
/// epoch), and whether its launch journal has rows (an owner of resident
/// processes, which some node must hold while it has them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mirror {
    pub alarm: Option<i64>,
    pub journaled: bool,
}

impl Mirror {
    /// Only a next alarm (objects that keep no journal).
    pub fn alarm(alarm: Option<i64>) -> Mirror {
        Mirror {
            alarm,
            journaled: false,
        }
    }

    /// What is safe to mirror between two known states: the earlier alarm,
    /// and a journal if either had one (at worst a wake that finds nothing
    /// to do, never a missing one).
    pub fn either(self, other: Mirror) -> Mirror {
        Mirror {
            alarm: match (self.alarm, other.alarm) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            journaled: self.journaled || other.journaled,
        }
    }
}
use litetx::{Encoder, Header, HeaderFlags, PageNum, PageSize, TXID};

use self::wal::{WalCursor, WalError};

/// Frames past which a replica's WAL is checkpointed into its file, once
/// everything in it is shipped: 64 MiB of 2 KiB pages. Rarely, because the
/// checkpoint waits for the shipments in flight (snapshots never need
/// one: they read the database through SQLite).
pub const CHECKPOINT_WAL_FRAMES: u64 = 32_768;

/// The checksum of a database with no pages: where every history starts.
pub const EMPTY: Checksum = Checksum::new(0);

/// LTX's page checksum (CRC-64/GO-ISO over the page number and the page),
/// computed with a table sixteen bytes wide: every captured page is summed,
/// and litetx's byte-at-a-time table made that the largest share of
/// reading a commit back.
const PAGE_CRC: crc::Crc<u64, crc::Table<16>> =
    crc::Crc::<u64, crc::Table<16>>::new(&crc::CRC_64_GO_ISO);

/// The checksum of page `pgno` holding `data`, as LTX defines it (the same
/// value as `litetx::PageChecksum`).
pub fn page_sum(pgno: PageNum, data: &[u8]) -> Checksum {
    let mut digest = PAGE_CRC.digest();
    digest.update(&pgno.into_inner().to_be_bytes());
    digest.update(data);
    Checksum::new(digest.finalize())
}

/// Where a replica's history stands when its database is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaStart {
    /// The database is new everywhere: its history starts now. Its file
    /// must not exist.
    Fresh,
    /// The file (with its WAL) holds exactly the state after commit
    /// `head`, whose checksum is `checksum`.
    Resume { head: u64, checksum: Checksum },
}

/// One commit of a replica, as captured: the pages it wrote, not yet
/// encoded, so that the commits that ship together become one LTX file
/// ([`encode_run`]).
#[derive(Clone, Debug)]
pub struct LogEntry {
    /// The commit's number in the database's history (1 for its first).
    pub head: u64,
    /// The database's checksum before it.
    pub before: Checksum,
    /// The database's checksum after it.
    pub checksum: Checksum,
    /// The database's size after it, in pages.
    pub db_pages: u32,
    /// The database's page size, in bytes.
    pub page_size: u32,
    /// The pages it wrote, in ascending order, each once.
    pub pages: Vec<(u32, Vec<u8>)>,
}

impl LogEntry {
    /// Bytes of page data it holds.
    pub fn page_bytes(&self) -> usize {
        self.pages.len() * self.page_size as usize
    }

    /// The database's size after it, in bytes.
    pub fn db_bytes(&self) -> u64 {
        u64::from(self.db_pages) * u64::from(self.page_size)
    }

    /// This commit alone, as an LTX file.
    pub fn ltx(&self) -> Result<Vec<u8>, ReplicaError> {
        encode_run(std::slice::from_ref(self))
    }
}

/// A run of consecutive commits as one LTX file spanning their
/// transactions: each page as the last of them left it, the size after
/// the last, the checksum before the first and after the last. Applying
/// it to the state before the first gives the state after the last, page
/// for page, as applying each in turn would. A run that is not
/// consecutive (by number and by checksum) is refused.
pub fn encode_run(run: &[LogEntry]) -> Result<Vec<u8>, ReplicaError> {
    let (Some(first), Some(last)) = (run.first(), run.last()) else {
        return Err(ReplicaError::Discontinuous(
            "an empty run of commits".into(),
        ));
    };
    for pair in run.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.head != a.head + 1 || b.before != a.checksum || b.page_size != a.page_size {
            return Err(ReplicaError::Discontinuous(format!(
                "commit {} does not continue commit {}",
                b.head, a.head
            )));
        }
    }
    let header = (
        first.page_size,
        last.db_pages,
        (txid(first.head), txid(last.head)),
        Some(first.before),
    );
    if run.len() == 1 {
        let pages = first.pages.iter().map(|(p, d)| (*p, d.as_slice()));
        return encode(header.0, header.1, header.2, header.3, pages, last.checksum);
    }
    // The last copy of each page wins; a page past the last size was cut
    // off by a later commit of the run.
    let mut pages: BTreeMap<u32, &[u8]> = BTreeMap::new();
    for entry in run {
        for (pgno, data) in &entry.pages {
            pages.insert(*pgno, data);
        }
    }
    pages.retain(|pgno, _| *pgno <= last.db_pages);
    encode(
        header.0,
        header.1,
        header.2,
        header.3,
        pages.into_iter(),
        last.checksum,
    )
}

/// Why a replica's commits could not be captured or its history applied.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error(transparent)]
    Wal(#[from] WalError),
    /// Says its cause in its own words (so it hands on no source).
    #[error("replica i/o: {0}")]
    Io(std::io::Error),
    #[error("the log entry is not LTX: {0}")]
    Ltx(String),
    #[error("the log does not continue the database: {0}")]
    Discontinuous(String),
    #[error("the database's checksum is {found}, its history says {expected}")]
    Checksum { expected: Checksum, found: Checksum },
}

impl From<std::io::Error> for ReplicaError {
    fn from(e: std::io::Error) -> Self {
        ReplicaError::Io(e)
    }
}

/// The transaction id LTX gives the commit numbered `head`: id 1 is the
/// empty database, so that every commit (the first included) is a change
/// applied to a known state, and only snapshots start at 1.
pub fn txid(head: u64) -> TXID {
    TXID::new(head + 1).expect("head + 1 is never zero")
}

/// The page SQLite never writes (it holds the byte range file locks use,
/// at 1 GiB), for databases that large.
pub fn lock_page(page_size: u32) -> u32 {
    (1u32 << 30) / page_size + 1
}

fn page_size(bytes: u32) -> Result<PageSize, ReplicaError> {
    PageSize::new(bytes).map_err(|e| ReplicaError::Ltx(e.to_string()))
}

fn page_num(n: u32) -> Result<PageNum, ReplicaError> {
    PageNum::new(n).map_err(|e| ReplicaError::Ltx(e.to_string()))
}

/// Captures a database's commits as log entries, and keeps its running
/// checksum.
pub struct Capture {
    db_path: PathBuf,
    wal_path: PathBuf,
    page_size: u32,
    cursor: WalCursor,
    head: u64,
    checksum: Checksum,
    db_pages: u32,
    /// Checksums of the pages changed since the file last held the whole
    /// state; `None`: the page was cut off by a shrinking commit.
    changed: HashMap<u32, Option<Checksum>>,
    /// Pages the file holds of that state.
    file_pages: u32,
    /// The database is new: its file holds nothing of the history (SQLite
    /// may have written a header page when it switched to WAL mode).
    fresh: bool,
    /// The WAL, open once it exists.
    wal: Option<File>,
}

impl Capture {
    /// A capture of the database at `db_path` whose file holds the whole
    /// state at `head`, with `checksum`, and whose WAL holds nothing yet.
    pub fn resume(db_path: &Path, page_size: u32, head: u64, checksum: Checksum) -> Capture {
        let file_pages = std::fs::metadata(db_path)
            .map(|m| (m.len() / u64::from(page_size)) as u32)
            .unwrap_or(0);
        Capture {
            db_path: db_path.to_path_buf(),
            wal_path: wal_path(db_path),
            page_size,
            cursor: WalCursor::default(),
            head,
            checksum,
            db_pages: file_pages,
            changed: HashMap::new(),
            file_pages,
            fresh: false,
            wal: None,
        }
    }

    /// A capture of a database whose history starts now (head 0, empty).
    pub fn fresh(db_path: &Path, page_size: u32) -> Capture {
        Capture {
            db_pages: 0,
            file_pages: 0,
            checksum: EMPTY,
            fresh: true,
            ..Capture::resume(db_path, page_size, 0, EMPTY)
        }
    }

    /// The number of the last captured commit.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// The database's checksum after the last captured commit.
    pub fn checksum(&self) -> Checksum {
        self.checksum
    }

    /// The database's size after the last captured commit, in pages.
    pub fn db_pages(&self) -> u32 {
        self.db_pages
    }

    /// The checksum a page had before the commit being captured.
    fn old(&self, pgno: u32, file: &mut Option<File>) -> Result<Option<Checksum>, ReplicaError> {
        if pgno > self.db_pages {
            return Ok(None);
        }
        if let Some(known) = self.changed.get(&pgno) {
            return Ok(*known);
        }
        if self.fresh || pgno > self.file_pages {
            return Ok(None);
        }
        let page = self.read_file_page(pgno, file)?;
        Ok(Some(page_sum(page_num(pgno)?, &page)))
    }

    fn read_file_page(&self, pgno: u32, file: &mut Option<File>) -> Result<Vec<u8>, ReplicaError> {
        if file.is_none() {
            *file = Some(File::open(&self.db_path)?);
        }
        let mut page = vec![0u8; self.page_size as usize];
        file.as_ref()
            .expect("opened above")
            .read_exact_at(&mut page, u64::from(pgno - 1) * u64::from(self.page_size))?;
        Ok(page)
    }

    /// The commits made since the last call, as log entries, in order.
    pub fn take(&mut self) -> Result<Vec<LogEntry>, ReplicaError> {
        if self.wal.is_none() {
            match File::open(&self.wal_path) {
                Ok(file) => self.wal = Some(file),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            }
        }
        let wal = self.wal.as_ref().expect("opened above");
        let commits = wal::read_commits_from(wal, self.page_size, &mut self.cursor)?;
        let mut entries = Vec::with_capacity(commits.len());
        let mut file = None;
        for commit in commits {
            // The last copy of each page wins; a page past the commit's
            // size was cut off within the transaction.
            let mut pages: BTreeMap<u32, Vec<u8>> = commit
                .pages
                .into_iter()
                .filter(|(pgno, _)| *pgno <= commit.db_pages)
                .collect();
            if self.fresh && self.head == 0 && !pages.contains_key(&1) {
                // The header page SQLite wrote straight to the file when
                // it switched to WAL mode, if no commit rewrote it.
                let first = self.read_file_page(1, &mut file)?;
                pages.insert(1, first);
            }
            let before = self.checksum;
            let mut sum = before;
            for pgno in commit.db_pages + 1..=self.db_pages {
                if let Some(old) = self.old(pgno, &mut file)? {
                    sum = sum ^ old;
                }
                self.changed.insert(pgno, None);
            }
            let mut checksums = Vec::with_capacity(pages.len());
            for (pgno, data) in &pages {
                if let Some(old) = self.old(*pgno, &mut file)? {
                    sum = sum ^ old;
                }
                let new = page_sum(page_num(*pgno)?, data);
                sum = sum ^ new;
                checksums.push((*pgno, new));
            }
            self.db_pages = commit.db_pages;
            for (pgno, new) in checksums {
                self.changed.insert(pgno, Some(new));
            }
            self.head += 1;
            self.checksum = sum;
            entries.push(LogEntry {
                head: self.head,
                before,
                checksum: sum,
                db_pages: self.db_pages,
                page_size: self.page_size,
                pages: pages.into_iter().collect(),
            });
        }
        Ok(entries)
    }

    /// True when the WAL holds commits not yet taken (read without taking
    /// them).
    pub fn untaken(&self) -> Result<bool, ReplicaError> {
        let mut cursor = self.cursor;
        Ok(!wal::read_commits(&self.wal_path, self.page_size, &mut cursor)?.is_empty())
    }

    /// The file holds the whole state again: its owner checkpointed the
    /// WAL into it (after [`Capture::take`]), and the WAL starts over.
    pub fn checkpointed(&mut self) {
        self.changed.clear();
        self.file_pages = self.db_pages;
        self.fresh = false;
        self.cursor = WalCursor::default();
    }

    /// A snapshot of every page at the last captured commit, from
    /// `image`, the database as SQLite reads it now (its file and WAL
    /// together, see [`snapshot`]). Its checksum is checked against the
    /// running one: an image that is not what the history says is refused.
    pub fn snapshot_of(&self, image: &[u8]) -> Result<Vec<u8>, ReplicaError> {
        let size = self.page_size as usize;
        if image.len() != self.db_pages as usize * size {
            return Err(ReplicaError::Discontinuous(format!(
                "the database holds {} bytes; its history says {} pages",
                image.len(),
                self.db_pages
            )));
        }
        let lock = lock_page(self.page_size);
        let mut sum = EMPTY;
        let pages: Vec<(u32, &[u8])> = (1..=self.db_pages)
            .filter(|p| *p != lock)
            .map(|pgno| {
                (
                    pgno,
                    &image[(pgno as usize - 1) * size..pgno as usize * size],
                )
            })
            .collect();
        for (pgno, page) in &pages {
            sum = sum ^ page_sum(page_num(*pgno)?, page);
        }
        if sum != self.checksum {
            return Err(ReplicaError::Checksum {
                expected: self.checksum,
                found: sum,
            });
        }
        encode(
            self.page_size,
            self.db_pages.max(1),
            (txid(0), txid(self.head)),
            None,
            pages.into_iter(),
            sum,
        )
    }

    /// Frames of the WAL read so far: how long the WAL has grown since
    /// its last checkpoint.
    pub fn wal_frames(&self) -> u64 {
        self.cursor.frames
    }
}

/// Makes `conn`, just opened on the database at `path` (in WAL mode), a
/// replica's connection starting at `start`: SQLite never checkpoints it
/// on its own or at close, and what its WAL holds at a resume is folded
/// into the file first, so the capture starts from a file that holds the
/// whole state. Its page size is the database's.
///
/// A replica's file is a cache of its durable copy, never trusted after a
/// restart until its checksum says it is current (see
/// [`restore::settle`]): it is written without fsyncs (`synchronous =
/// OFF`), so neither commits nor checkpoints wait for the disk.
pub fn attach(
    conn: &rusqlite::Connection,
    path: &Path,
    start: ReplicaStart,
) -> Result<Capture, rusqlite::Error> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "synchronous", "OFF")?;
    // A WAL starting over after a live checkpoint keeps its file whole:
    // truncating it then would make a commit wait for the file system.
    conn.pragma_update(None, "journal_size_limit", -1)?;
    let page_size: u32 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    Ok(match start {
        ReplicaStart::Fresh => Capture::fresh(path, page_size),
        ReplicaStart::Resume { head, checksum } => {
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
            Capture::resume(path, page_size, head, checksum)
        }
    })
}

/// How a replica's WAL is checkpointed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fold {
    /// While it is in use: the WAL's pages go into the file and its next
    /// commit starts the WAL over, in the same file (nothing is freed on
    /// the way, so nothing waits for the file system).
    Live,
    /// When it closes: the WAL file is also truncated, its space returned.
    Closing,
}

/// Checkpoints a replica's WAL into its file — refused (`Ok(false)`)
/// while it holds commits not yet taken.
pub fn checkpoint(
    conn: &rusqlite::Connection,
    capture: &mut Capture,
    fold: Fold,
) -> Result<bool, ReplicaError> {
    if capture.untaken()? {
        return Ok(false);
    }
    let pragma = match fold {
        Fold::Live => "PRAGMA wal_checkpoint(PASSIVE)",
        Fold::Closing => "PRAGMA wal_checkpoint(TRUNCATE)",
    };
    conn.query_row(pragma, [], |_| Ok(()))
        .map_err(|e| ReplicaError::Io(std::io::Error::other(e)))?;
    capture.checkpointed();
    Ok(true)
}

/// A snapshot of a replica at its last taken commit: `(head, LTX)`, or
/// `None` while commits are not yet taken.
pub fn snapshot(
    conn: &rusqlite::Connection,
    capture: &mut Capture,
) -> Result<Option<(u64, Vec<u8>)>, ReplicaError> {
    if capture.untaken()? {
        return Ok(None);
    }
    // The database as SQLite reads it, WAL and all: no checkpoint, so
    // nothing waits and nothing is written.
    let image = conn
        .serialize(rusqlite::MAIN_DB)
        .map_err(|e| ReplicaError::Io(std::io::Error::other(e)))?;
    Ok(Some((capture.head(), capture.snapshot_of(&image)?)))
}

/// The capture of a database shared between threads (a store or a SQL
/// database, whose calls run on the SQL pool).
pub struct SharedCapture(std::sync::Mutex<Capture>);

impl SharedCapture {
    pub fn new(capture: Capture) -> SharedCapture {
        SharedCapture(std::sync::Mutex::new(capture))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Capture> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands what the database committed since the last call to `ship`,
    /// in commit order: calls are serialized, so whichever call takes a
    /// commit ships it before any later one.
    pub fn ship_with(&self, ship: impl FnOnce(Vec<LogEntry>)) -> Result<(), ReplicaError> {
        let mut capture = self.lock();
        let log = capture.take()?;
        if !log.is_empty() {
            ship(log);
        }
        Ok(())
    }

    /// True when the WAL has grown past [`CHECKPOINT_WAL_FRAMES`].
    pub fn checkpoint_due(&self) -> bool {
        self.lock().wal_frames() > CHECKPOINT_WAL_FRAMES
    }

    /// A live [`checkpoint`] of the database `conn` is open on; false
    /// when commits were not yet taken.
    pub fn checkpoint(&self, conn: &rusqlite::Connection) -> Result<bool, ReplicaError> {
        checkpoint(conn, &mut self.lock(), Fold::Live)
    }

    /// [`snapshot`] of the database `conn` is open on (its caller holds
    /// the connection, so no call commits meanwhile).
    pub fn snapshot(
        &self,
        conn: &rusqlite::Connection,
    ) -> Result<Option<(u64, Vec<u8>)>, ReplicaError> {
        snapshot(conn, &mut self.lock())
    }
}

/// The WAL file of the database at `db_path`.
pub fn wal_path(db_path: &Path) -> PathBuf {
    PathBuf::from(format!("{}-wal", db_path.display()))
}

/// One LTX file: pages in ascending order, LZ4-compressed (a page of a
/// small table is mostly zeros).
fn encode<'a>(
    page_size_bytes: u32,
    db_pages: u32,
    (min, max): (TXID, TXID),
    before: Option<Checksum>,
    pages: impl Iterator<Item = (u32, &'a [u8])>,
    after: Checksum,
) -> Result<Vec<u8>, ReplicaError> {
    let ltx = |e: litetx::EncodeError| ReplicaError::Ltx(e.to_string());
    let mut out = Vec::new();
    let mut encoder = Encoder::new(
        &mut out,
        &Header {
            flags: HeaderFlags::COMPRESS_LZ4,
            page_size: page_size(page_size_bytes)?,
            commit: page_num(db_pages.max(1))?,
            min_txid: min,
            max_txid: max,
            timestamp: SystemTime::now(),
            pre_apply_checksum: before,
        },
    )
    .map_err(ltx)?;
    for (pgno, data) in pages {
        encoder.encode_page(page_num(pgno)?, data).map_err(ltx)?;
    }
    encoder.finish(after).map_err(ltx)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use litetx::{PageChecksum, PageNum};
    use proptest::prelude::*;

    proptest! {
        /// The sliced table gives LTX's own page checksum, for any page
        /// number and contents (sizes around the table's 16-byte steps
        /// included).
        #[test]
        fn page_sum_is_ltx_page_checksum(
            pgno in 1u32..=u32::MAX,
            data in proptest::collection::vec(any::<u8>(), 0..4200),
        ) {
            let pgno = PageNum::new(pgno).unwrap();
            prop_assert_eq!(super::page_sum(pgno, &data), data.page_checksum(pgno));
        }
    }
}
