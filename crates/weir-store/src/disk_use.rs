//! What an actor's database takes on disk: its pages (what its own bound,
//! `max_database_bytes`, counts) and its files (what a layer above counts
//! against the disk: the database file and its WAL).
//!
//! Invariant owned here: the files are measured from the files SQLite
//! holds open, so a measure after every turn that wrote costs no path
//! lookup, and it equals what the file system reports for the paths.

use rusqlite::Connection;

use crate::actor::{ActorDb, ActorStoreError};

impl ActorDb {
    /// The bytes of the database's pages, free ones included: what its
    /// file holds once the WAL is checkpointed (uncommitted pages of an
    /// open turn count too).
    pub fn footprint_bytes(&self) -> Result<u64, ActorStoreError> {
        let pages: i64 = self
            .conn
            .prepare_cached("PRAGMA page_count")?
            .query_row([], |r| r.get(0))?;
        Ok(pages.max(0) as u64 * self.page_bytes)
    }

    /// The bytes of the database's files on disk, its main file and its
    /// WAL, read from the files SQLite holds open (an `fstat` each, no
    /// path lookup: this runs after every turn that wrote).
    pub fn files_bytes(&self) -> Result<u64, ActorStoreError> {
        Ok(
            open_file_bytes(&self.conn, rusqlite::ffi::SQLITE_FCNTL_FILE_POINTER)?
                + open_file_bytes(&self.conn, rusqlite::ffi::SQLITE_FCNTL_JOURNAL_POINTER)?,
        )
    }
}

/// The length of one of the files SQLite holds open for `conn`'s main
/// database (`op`: SQLite's file-control for the database file or for its
/// journal, here the WAL); 0 when that file is not open.
fn open_file_bytes(conn: &Connection, op: std::ffi::c_int) -> Result<u64, rusqlite::Error> {
    use rusqlite::ffi;
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: `conn.handle()` is the open connection `conn` owns, used on
    // this thread only while `conn` is borrowed. The file-control ops asked
    // for write one `sqlite3_file` pointer into `file` (SQLite's own file
    // object, alive while the connection is open), and its methods table
    // is SQLite's VFS interface: `xFileSize` writes the file's length into
    // `bytes`. A file that is not open has no methods and counts 0.
    let (rc, bytes) = unsafe {
        let rc =
            ffi::sqlite3_file_control(conn.handle(), c"main".as_ptr(), op, (&raw mut file).cast());
        if rc != ffi::SQLITE_OK || file.is_null() || (*file).pMethods.is_null() {
            return Ok(0);
        }
        let Some(size) = (*(*file).pMethods).xFileSize else {
            return Ok(0);
        };
        let mut bytes: ffi::sqlite3_int64 = 0;
        (size(file, &raw mut bytes), bytes)
    };
    if rc != ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None));
    }
    Ok(bytes.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use crate::actor::tests::open;

    #[test]
    fn files_bytes_are_the_database_and_its_wal_as_on_disk() {
        let (mut db, path) = open("files-bytes");
        let on_disk = |path: &std::path::Path| {
            ["", "-wal"]
                .iter()
                .map(|s| std::fs::metadata(format!("{}{s}", path.display())).map_or(0, |m| m.len()))
                .sum::<u64>()
        };
        assert_eq!(db.files_bytes().unwrap(), on_disk(&path));
        db.begin_turn().unwrap();
        db.put("k", &vec![1u8; 100_000]).unwrap();
        db.commit_turn().unwrap();
        let bytes = db.files_bytes().unwrap();
        assert!(bytes > 100_000, "{bytes}");
        assert_eq!(bytes, on_disk(&path));
        db.checkpoint().unwrap();
        assert_eq!(db.files_bytes().unwrap(), on_disk(&path));
    }
}
