//! Weir's embedded storage: named key-value stores and named SQL databases,
//! each one SQLite database under the data directory.
//!
//! Invariants owned here:
//! - a write that returned `Ok` is committed: it survives the process being
//!   killed (WAL mode; SQLite has handed the commit to the operating system
//!   before returning). With [`Durability::Fsync`] it also survives power
//!   loss (every commit is fsynced);
//! - a database never grows past the bound set on its connection
//!   (`bound_size`), and a write refused by it is named `database_full`;
//! - only declared names become files: a name is checked before it is
//!   joined to a path (`valid_name`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::Connection;

pub mod actor;
pub mod confinement;
pub mod data_dir;
pub mod disk_use;
pub mod entries;
mod guest_statement;
pub mod journal;
pub mod kv;
pub mod kv_op;
pub mod replica;
pub mod socket_ledger;
pub mod sql;
pub mod statement_bounds;
pub mod statement_memory;
pub mod timer_ledger;
pub mod timers;
pub mod turn_transaction;

pub use kv::{Entry, KeyPage, KvStore, KvStores, LIST_PAGE_KEYS, MAX_KEY_BYTES, MAX_VALUE_BYTES};

/// How long a connection waits on a lock held by another before failing.
/// Stores are single-writer per process, so this only matters when an
/// operator inspects a store while Weir runs.
pub const BUSY_TIMEOUT_MS: u64 = 5_000;

/// What a commit is made durable against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// Survives a process crash (WAL, `synchronous = NORMAL`).
    #[default]
    Process,
    /// Survives power loss too (WAL, `synchronous = FULL`: fsync per commit).
    Fsync,
}

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no store named `{0}` is declared")]
    NoSuchStore(String),
    #[error("store name `{0}` must be 1-64 characters of a-z, 0-9, `_` or `-`")]
    BadName(String),
    #[error("key is {0} bytes; the limit is {MAX_KEY_BYTES}")]
    KeyTooLarge(usize),
    #[error("value is {0} bytes; the limit is {MAX_VALUE_BYTES}")]
    ValueTooLarge(usize),
    #[error("the value of `{0}` is not an 8-byte counter")]
    NotACounter(String),
    #[error("counter `{0}` would overflow")]
    Overflow(String),
    #[error("cannot create {path}: {cause}")]
    Dir {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error(transparent)]
    ResultTooLarge(#[from] statement_bounds::ResultTooLarge),
    #[error(transparent)]
    Replica(#[from] replica::ReplicaError),
    /// Cluster mode: the call could not be run where the store is owned;
    /// the message names why (`storage_unavailable`, `ownership_lost`, …).
    #[error("{0}")]
    Unavailable(String),
    /// A write needed a page past the database's bound
    /// (`bound_size`), or the disk had no room.
    #[error("{DATABASE_FULL}")]
    Full,
    #[error("sqlite: {0}")]
    Sqlite(rusqlite::Error),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        if is_full(&e) {
            StoreError::Full
        } else {
            StoreError::Sqlite(e)
        }
    }
}

/// What a guest is told when a write would grow its database past
/// `max_database_bytes`, or an actor's past what the app's storage room
/// has free (`max_actor_storage_bytes`): SQLite's `SQLITE_FULL`, which a
/// disk with no room left also gives.
pub const DATABASE_FULL: &str = "database_full: the database has reached max_database_bytes, or the app's actors together \
     max_actor_storage_bytes, or the disk has no room";

/// True for SQLite's "database or disk is full".
pub(crate) fn is_full(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull)
}

/// SQLite's error as a guest reads it: a full database by the name of its
/// bound, anything else in SQLite's words.
pub(crate) fn sqlite_message(e: &rusqlite::Error) -> String {
    if is_full(e) {
        DATABASE_FULL.to_string()
    } else {
        e.to_string()
    }
}

/// Bounds the database behind `conn` at `max_bytes` (rounded down to whole
/// pages, at least one): a statement that would need a page past it fails
/// with [`StoreError::Full`], and nothing of that statement is kept. A
/// database already past the bound stays readable, and writes that reuse
/// its free pages still succeed. The bound lives on the connection (SQLite
/// does not store it), so each open sets it again, and guests cannot lift
/// it (no guest statement may write a pragma).
pub(crate) fn bound_size(conn: &Connection, max_bytes: u64) -> Result<(), StoreError> {
    let page: u64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let pages = (max_bytes / page.max(1)).max(1);
    let _: i64 = conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |r| {
        r.get(0)
    })?;
    Ok(())
}

/// SQLite's `synchronous` setting of a live connection, by name: what a
/// commit on it waits for (`normal`: the WAL write; `full`: its fsync).
pub fn synchronous_mode(conn: &Connection) -> Result<&'static str, StoreError> {
    let mode: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
    Ok(match mode {
        0 => "off",
        1 => "normal",
        2 => "full",
        _ => "extra",
    })
}

/// A declared store or database as operators see it: its name and the
/// `synchronous` mode read from its open connection (not from the
/// configuration), so `/status` says what commits really wait for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreInfo {
    pub name: String,
    pub synchronous: String,
}

/// Size the WAL file is cut to when it starts over after a checkpoint:
/// SQLite's automatic checkpoint every 1,000 pages keeps a WAL about this
/// size, and without a limit a WAL that one large transaction grew stays
/// that large on disk for good, beside a database bounded by
/// `max_database_bytes`.
pub(crate) const WAL_KEEP_BYTES: i64 = 4 << 20;

/// Opens one database file in WAL mode with the durability asked for.
pub(crate) fn connect(path: &Path, durability: Durability) -> Result<Connection, StoreError> {
    connect_with(path, durability, Tuning::default())
}

/// How a connection departs from the shared defaults.
#[derive(Clone, Copy, Default)]
pub(crate) struct Tuning {
    /// Hold the database's lock for the life of the connection: no other
    /// connection may use it, and no transaction pays for file locks.
    pub exclusive: bool,
    /// Page size of a database created by this connection.
    pub page_size: Option<u32>,
}

/// [`connect`], tuned.
pub(crate) fn connect_with(
    path: &Path,
    durability: Durability,
    tuning: Tuning,
) -> Result<Connection, StoreError> {
    statement_memory::install();
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_millis(BUSY_TIMEOUT_MS))?;
    // Both must come before the first WAL access: the WAL index then lives
    // in the connection's memory, not in a shared -shm file, and the page
    // size is fixed when the database is first written.
    if tuning.exclusive {
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
    }
    if let Some(bytes) = tuning.page_size {
        conn.pragma_update(None, "page_size", bytes)?;
    }
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // A replica's capture sets its own (it must read every frame first).
    conn.pragma_update(None, "journal_size_limit", WAL_KEEP_BYTES)?;
    conn.pragma_update(
        None,
        "synchronous",
        match durability {
            Durability::Process => "NORMAL",
            Durability::Fsync => "FULL",
        },
    )?;
    Ok(conn)
}

/// Opens every declared name as `data_dir/<kind>/<name>.sqlite3`, creating
/// files as needed; names are checked first.
pub(crate) fn open_named<T>(
    data_dir: &Path,
    kind: &str,
    names: &[String],
    mut open: impl FnMut(&Path, &str) -> Result<T, StoreError>,
) -> Result<HashMap<String, Arc<T>>, StoreError> {
    let mut opened = HashMap::new();
    if names.is_empty() {
        return Ok(opened);
    }
    let dir = data_dir.join(kind);
    std::fs::create_dir_all(&dir).map_err(|source| StoreError::Dir {
        path: dir.clone(),
        cause: source,
    })?;
    for name in names {
        if !valid_name(name) {
            return Err(StoreError::BadName(name.clone()));
        }
        let item = open(&dir.join(format!("{name}.sqlite3")), name)?;
        opened.insert(name.clone(), Arc::new(item));
    }
    Ok(opened)
}

/// True for names that are safe as file names and readable in config.
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}
