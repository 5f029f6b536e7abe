//! Named key-value stores: one SQLite table of keys and values per
//! declared store, under `data_dir/kv`.
//!
//! Invariants owned here:
//! - `increment` is one statement inside one transaction, serialised per
//!   store, so concurrent increments never lose an update;
//! - only stores that were declared exist: opening any other name is an
//!   error, never an empty store;
//! - a key or value over its bound is refused before anything is written.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};

use crate::{
    Durability, StoreError, StoreInfo, bound_size, connect, open_named, replica, statement_bounds,
    synchronous_mode,
};

/// Keys returned by one `list_keys` page. Large enough that few round trips
/// are needed, small enough that one page is never a memory problem.
pub const LIST_PAGE_KEYS: usize = 1000;

/// Largest value accepted, in bytes: one value is read into guest memory
/// whole, so it is bounded well under the default guest memory limit.
pub const MAX_VALUE_BYTES: usize = 32 << 20;

/// Largest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 64 << 10;

/// One page of keys and the cursor of the next, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPage {
    pub keys: Vec<String>,
    pub cursor: Option<u64>,
}

/// A key and its value.
pub type Entry = (String, Vec<u8>);

/// One named key-value store.
pub struct KvStore {
    name: String,
    conn: Mutex<Connection>,
    /// Read from the connection when it opened; kept so that `/status`
    /// never waits for a running call.
    synchronous: &'static str,
    /// A replica's capture of its commits (cluster mode).
    capture: Option<replica::SharedCapture>,
}

fn check_key(key: &str) -> Result<(), StoreError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(StoreError::KeyTooLarge(key.len()));
    }
    Ok(())
}

impl KvStore {
    fn open(path: &Path, name: &str, durability: Durability) -> Result<KvStore, StoreError> {
        KvStore::open_with(path, name, durability, None)
    }

    /// Opens a store as a replica starting at `start`: every commit is
    /// captured for shipping ([`replica::SharedCapture::ship_with`], reached
    /// through [`KvStore::capture`]).
    pub fn open_replica(
        path: &Path,
        name: &str,
        durability: Durability,
        start: replica::ReplicaStart,
    ) -> Result<KvStore, StoreError> {
        KvStore::open_with(path, name, durability, Some(start))
    }

    fn open_with(
        path: &Path,
        name: &str,
        durability: Durability,
        start: Option<replica::ReplicaStart>,
    ) -> Result<KvStore, StoreError> {
        let conn = connect(path, durability)?;
        let capture = match start {
            Some(start) => Some(replica::SharedCapture::new(replica::attach(
                &conn, path, start,
            )?)),
            None => None,
        };
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;",
        )?;
        Ok(KvStore {
            name: name.to_string(),
            synchronous: synchronous_mode(&conn)?,
            conn: Mutex::new(conn),
            capture,
        })
    }

    /// A replica's capture (cluster mode): what ships its commits and
    /// takes its snapshots.
    pub fn capture(&self) -> Option<&replica::SharedCapture> {
        self.capture.as_ref()
    }

    /// A replica's snapshot at its last taken commit (see
    /// [`replica::snapshot`]); `None` outside a replica or while commits
    /// are not yet taken.
    pub fn snapshot(&self) -> Result<Option<(u64, Vec<u8>)>, replica::ReplicaError> {
        match &self.capture {
            Some(capture) => capture.snapshot(&self.conn()),
            None => Ok(None),
        }
    }

    /// Checkpoints a replica's WAL into its file (its caller knows it is
    /// all shipped); false when commits were not yet taken.
    pub fn checkpoint(&self) -> Result<bool, replica::ReplicaError> {
        match &self.capture {
            Some(capture) => capture.checkpoint(&self.conn()),
            None => Ok(false),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bounds the store's file at `max_bytes` (`bound_size`).
    pub fn set_max_bytes(&self, max_bytes: u64) -> Result<(), StoreError> {
        bound_size(&self.conn(), max_bytes)
    }

    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(key)?;
        let conn = self.conn();
        let mut stmt = conn.prepare_cached("SELECT value FROM kv WHERE key = ?1")?;
        Ok(stmt.query_row(params![key], |r| r.get(0)).optional()?)
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        check_key(key)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(StoreError::ValueTooLarge(value.len()));
        }
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "INSERT INTO kv (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        )?;
        stmt.execute(params![key, value])?;
        Ok(())
    }

    pub fn delete(&self, key: &str) -> Result<(), StoreError> {
        check_key(key)?;
        let conn = self.conn();
        conn.prepare_cached("DELETE FROM kv WHERE key = ?1")?
            .execute(params![key])?;
        Ok(())
    }

    pub fn exists(&self, key: &str) -> Result<bool, StoreError> {
        check_key(key)?;
        let conn = self.conn();
        let mut stmt = conn.prepare_cached("SELECT 1 FROM kv WHERE key = ?1")?;
        Ok(stmt.exists(params![key])?)
    }

    /// Keys in order, a page at a time. The cursor is the number of keys
    /// already returned; a key set or deleted between pages may shift what a
    /// later page starts with, as the interface allows. A page deep into a
    /// large store scans the keys before it; `stop` ends that scan.
    pub fn list_keys(
        &self,
        cursor: Option<u64>,
        stop: Option<statement_bounds::StopCheck>,
    ) -> Result<KeyPage, StoreError> {
        let offset = cursor.unwrap_or(0);
        let conn = self.conn();
        let watched = stop.is_some();
        statement_bounds::watch(&conn, stop);
        let page = Self::page(&conn, offset);
        if watched {
            statement_bounds::watch(&conn, None);
        }
        page
    }

    fn page(conn: &Connection, offset: u64) -> Result<KeyPage, StoreError> {
        let mut stmt = conn.prepare_cached("SELECT key FROM kv ORDER BY key LIMIT ?1 OFFSET ?2")?;
        let keys = stmt
            .query_map(
                params![
                    LIST_PAGE_KEYS as i64 + 1,
                    offset.min(i64::MAX as u64) as i64
                ],
                |r| r.get(0),
            )?
            .collect::<Result<Vec<String>, _>>()?;
        let more = keys.len() > LIST_PAGE_KEYS;
        let mut keys = keys;
        keys.truncate(LIST_PAGE_KEYS);
        let cursor = more.then(|| offset.saturating_add(keys.len() as u64));
        Ok(KeyPage { keys, cursor })
    }

    /// Adds `delta` to the counter at `key` (absent counts as 0) and returns
    /// the new value. Counters are stored as 8 little-endian bytes.
    pub fn increment(&self, key: &str, delta: u64) -> Result<u64, StoreError> {
        check_key(key)?;
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let current: Option<Vec<u8>> = tx
            .prepare_cached("SELECT value FROM kv WHERE key = ?1")?
            .query_row(params![key], |r| r.get(0))
            .optional()?;
        let current = match current {
            None => 0,
            Some(bytes) => u64::from_le_bytes(
                bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| StoreError::NotACounter(key.to_string()))?,
            ),
        };
        let next = current
            .checked_add(delta)
            .ok_or_else(|| StoreError::Overflow(key.to_string()))?;
        tx.prepare_cached(
            "INSERT INTO kv (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        )?
        .execute(params![key, next.to_le_bytes().as_slice()])?;
        tx.commit()?;
        Ok(next)
    }

    /// Several entries, in order; all of them together at most
    /// `max_result_bytes` (keys and values), or the call fails naming the
    /// limit.
    pub fn get_many(
        &self,
        keys: &[String],
        max_result_bytes: usize,
    ) -> Result<Vec<Option<Entry>>, StoreError> {
        let mut budget = statement_bounds::ResultBudget::new(max_result_bytes);
        keys.iter()
            .map(|k| {
                let entry = self.get(k)?.map(|v| (k.clone(), v));
                budget.take(entry.as_ref().map_or(0, |(k, v)| k.len() + v.len()))?;
                Ok(entry)
            })
            .collect()
    }

    /// Sets every pair in one transaction: all or none.
    pub fn set_many(&self, pairs: &[Entry]) -> Result<(), StoreError> {
        for (k, v) in pairs {
            check_key(k)?;
            if v.len() > MAX_VALUE_BYTES {
                return Err(StoreError::ValueTooLarge(v.len()));
            }
        }
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO kv (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )?;
            for (k, v) in pairs {
                stmt.execute(params![k, v])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Deletes every key in one transaction.
    pub fn delete_many(&self, keys: &[String]) -> Result<(), StoreError> {
        for k in keys {
            check_key(k)?;
        }
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached("DELETE FROM kv WHERE key = ?1")?;
            for k in keys {
                stmt.execute(params![k])?;
            }
        }
        tx.commit()?;
        Ok(())
    }
}

/// The declared stores of one app.
#[derive(Default)]
pub struct KvStores {
    stores: HashMap<String, Arc<KvStore>>,
}

impl KvStores {
    /// Opens (creating if needed) each declared store under `data_dir/kv`.
    pub fn open(
        data_dir: &Path,
        names: &[String],
        durability: Durability,
    ) -> Result<KvStores, StoreError> {
        let stores = open_named(data_dir, "kv", names, |path, name| {
            KvStore::open(path, name, durability)
        })?;
        Ok(KvStores { stores })
    }

    /// Bounds every store's file at `max_bytes` (`bound_size`).
    pub fn set_max_bytes(&self, max_bytes: u64) -> Result<(), StoreError> {
        self.stores
            .values()
            .try_for_each(|s| s.set_max_bytes(max_bytes))
    }

    /// Every declared store, by name.
    pub fn describe(&self) -> Vec<StoreInfo> {
        let mut out: Vec<StoreInfo> = self
            .stores
            .values()
            .map(|s| StoreInfo {
                name: s.name.clone(),
                synchronous: s.synchronous.to_string(),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The declared store of that name.
    pub fn get(&self, name: &str) -> Result<Arc<KvStore>, StoreError> {
        self.stores
            .get(name)
            .cloned()
            .ok_or_else(|| StoreError::NoSuchStore(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::{DATABASE_FULL, WAL_KEEP_BYTES};

    fn temp(name: &str) -> PathBuf {
        weir_scratch::dir(&format!("store-{name}"))
    }

    #[test]
    fn a_large_transaction_leaves_no_large_wal_behind() {
        let dir = temp("wal-kept");
        let stores = KvStores::open(&dir, &["a".into()], Durability::Process).unwrap();
        let store = stores.get("a").unwrap();
        let wal = dir.join("kv/a.sqlite3-wal");
        let pairs: Vec<Entry> = (0..12)
            .map(|i| (format!("k{i}"), vec![7u8; 1 << 20]))
            .collect();
        store.set_many(&pairs).unwrap();
        let grown = std::fs::metadata(&wal).unwrap().len();
        assert!(grown > 2 * WAL_KEEP_BYTES as u64, "{grown}");
        // The next writes start the checkpointed WAL over, and cut it.
        for i in 0..3 {
            store.set(&format!("small{i}"), b"1").unwrap();
        }
        let kept = std::fs::metadata(&wal).unwrap().len();
        assert!(kept <= WAL_KEEP_BYTES as u64, "{kept} after {grown}");
    }

    #[test]
    fn a_store_at_its_bound_refuses_by_name_keeps_what_it_had_and_reuses_freed_room() {
        const BOUND: u64 = 256 << 10;
        let dir = temp("bound");
        let stores = KvStores::open(&dir, &["a".into()], Durability::Process).unwrap();
        stores.set_max_bytes(BOUND).unwrap();
        let store = stores.get("a").unwrap();
        let mut kept = 0;
        let refused = loop {
            match store.set(&format!("k{kept}"), &[7u8; 20_000]) {
                Ok(()) => kept += 1,
                Err(e) => break e,
            }
            assert!(kept < 100, "the bound refused no write");
        };
        assert!(matches!(refused, StoreError::Full), "{refused:?}");
        assert_eq!(refused.to_string(), DATABASE_FULL);
        assert!(kept > 5);
        for k in 0..kept {
            assert_eq!(
                store.get(&format!("k{k}")).unwrap().map(|v| v.len()),
                Some(20_000)
            );
        }
        assert!(std::fs::metadata(dir.join("kv/a.sqlite3")).unwrap().len() <= BOUND);
        // Room freed by a delete is written again.
        store.delete("k0").unwrap();
        store.set("again", &[7u8; 5_000]).unwrap();
    }

    #[test]
    fn set_get_delete_and_pages() {
        let dir = temp("basic");
        let stores = KvStores::open(&dir, &["a".into()], Durability::Process).unwrap();
        let s = stores.get("a").unwrap();
        assert!(matches!(stores.get("b"), Err(StoreError::NoSuchStore(_))));
        s.set("k", b"v").unwrap();
        assert_eq!(s.get("k").unwrap(), Some(b"v".to_vec()));
        assert!(s.exists("k").unwrap());
        s.delete("k").unwrap();
        assert_eq!(s.get("k").unwrap(), None);
        let pairs: Vec<_> = (0..2500).map(|i| (format!("key{i:05}"), vec![1])).collect();
        s.set_many(&pairs).unwrap();
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = s.list_keys(cursor, None).unwrap();
            seen.extend(page.keys);
            match page.cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(seen.len(), 2500);
        assert_eq!(seen[0], "key00000");
        assert_eq!(seen[2499], "key02499");
    }

    #[test]
    fn increments_and_bad_counters() {
        let dir = temp("incr");
        let stores = KvStores::open(&dir, &["c".into()], Durability::Fsync).unwrap();
        let s = stores.get("c").unwrap();
        assert_eq!(s.increment("n", 2).unwrap(), 2);
        assert_eq!(s.increment("n", 3).unwrap(), 5);
        s.set("text", b"abc").unwrap();
        assert!(matches!(
            s.increment("text", 1),
            Err(StoreError::NotACounter(_))
        ));
        s.set("max", &u64::MAX.to_le_bytes()).unwrap();
        assert!(matches!(
            s.increment("max", 1),
            Err(StoreError::Overflow(_))
        ));
    }

    #[test]
    fn bad_names_are_refused() {
        let dir = temp("names");
        assert!(matches!(
            KvStores::open(&dir, &["../x".into()], Durability::Process),
            Err(StoreError::BadName(_))
        ));
    }
}
