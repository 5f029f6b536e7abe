//! An actor's key-value entries (`_weir_kv`), in its one database: single
//! and multi-key reads and writes, and ordered ranges. Every entry is
//! bounded ([`crate::actor::MAX_ENTRY_BYTES`]) and every read that returns
//! many is bounded by the database's result budget.

use rusqlite::{OptionalExtension, params, params_from_iter};

use crate::actor::{ActorDb, ActorStoreError, MAX_ENTRY_BYTES};
use crate::statement_bounds::ResultBudget;

/// Options of [`ActorDb::list`]: a key range (`start` inclusive, `end`
/// exclusive), a prefix, an order and a count.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    pub start: Option<String>,
    pub end: Option<String>,
    pub prefix: Option<String>,
    pub reverse: bool,
    pub limit: Option<u32>,
}

impl ActorDb {
    /// Several values, in order, within the result bound.
    pub fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, ActorStoreError> {
        let mut budget = ResultBudget::new(self.max_result_bytes);
        keys.iter()
            .map(|k| {
                let value = self.get(k)?;
                budget.take(value.as_ref().map_or(0, Vec::len))?;
                Ok(value)
            })
            .collect()
    }

    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, ActorStoreError> {
        Ok(self
            .conn
            .prepare_cached("SELECT value FROM _weir_kv WHERE key = ?1")?
            .query_row(params![key], |r| r.get(0))
            .optional()?)
    }

    fn check_entry(key: &str, value: &[u8]) -> Result<(), ActorStoreError> {
        let size = key.len() + value.len();
        if size > MAX_ENTRY_BYTES {
            return Err(ActorStoreError::EntryTooLarge {
                key: key.chars().take(64).collect(),
                size,
            });
        }
        Ok(())
    }

    pub fn put(&mut self, key: &str, value: &[u8]) -> Result<(), ActorStoreError> {
        Self::check_entry(key, value)?;
        self.conn
            .prepare_cached(
                "INSERT INTO _weir_kv (key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )?
            .execute(params![key, value])?;
        Ok(())
    }

    /// Puts every entry, or — if any is too large — none.
    pub fn put_many(&mut self, entries: &[(String, Vec<u8>)]) -> Result<(), ActorStoreError> {
        for (k, v) in entries {
            Self::check_entry(k, v)?;
        }
        for (k, v) in entries {
            self.put(k, v)?;
        }
        Ok(())
    }

    /// Deletes a key; true if it existed.
    pub fn delete(&mut self, key: &str) -> Result<bool, ActorStoreError> {
        Ok(self
            .conn
            .prepare_cached("DELETE FROM _weir_kv WHERE key = ?1")?
            .execute(params![key])?
            > 0)
    }

    /// Deletes every key and every user table's rows are left alone.
    pub fn delete_all(&mut self) -> Result<(), ActorStoreError> {
        self.conn.execute("DELETE FROM _weir_kv", [])?;
        Ok(())
    }

    /// Entries in key order (or reverse), within the options' range.
    pub fn list(&self, options: &ListOptions) -> Result<Vec<(String, Vec<u8>)>, ActorStoreError> {
        let mut sql = String::from("SELECT key, value FROM _weir_kv WHERE 1");
        let mut params: Vec<String> = Vec::new();
        if let Some(start) = &options.start {
            params.push(start.clone());
            sql.push_str(&format!(" AND key >= ?{}", params.len()));
        }
        if let Some(end) = &options.end {
            params.push(end.clone());
            sql.push_str(&format!(" AND key < ?{}", params.len()));
        }
        if let Some(prefix) = &options.prefix {
            params.push(prefix.clone());
            sql.push_str(&format!(
                " AND substr(key, 1, length(?{n})) = ?{n}",
                n = params.len()
            ));
        }
        sql.push_str(if options.reverse {
            " ORDER BY key DESC"
        } else {
            " ORDER BY key"
        });
        if let Some(limit) = options.limit {
            sql.push_str(&format!(" LIMIT {limit}"));
        }
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let mut budget = ResultBudget::new(self.max_result_bytes);
        let mut rows = stmt.query(params_from_iter(params.iter()))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let (key, value): (String, Vec<u8>) = (row.get(0)?, row.get(1)?);
            budget.take(key.len() + value.len())?;
            out.push((key, value));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Durability;

    fn open(name: &str) -> (ActorDb, std::path::PathBuf) {
        let dir = weir_scratch::dir(&format!("entries-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("actor.sqlite3");
        (ActorDb::open(&path, Durability::Process).unwrap(), path)
    }

    #[test]
    fn oversized_entries_fail_and_write_nothing() {
        let (mut db, _) = open("size");
        let big = vec![0u8; MAX_ENTRY_BYTES];
        let err = db.put("k", &big).unwrap_err();
        assert!(err.to_string().contains("2097152"), "{err}");
        let entries = vec![("ok".to_string(), b"v".to_vec()), ("big".to_string(), big)];
        assert!(db.put_many(&entries).is_err());
        assert_eq!(db.get("ok").unwrap(), None, "put_many wrote nothing");
        let fits = vec![0u8; MAX_ENTRY_BYTES - 1];
        db.put("k", &fits).unwrap();
    }

    #[test]
    fn list_ranges_prefixes_order_and_limits() {
        let (mut db, _) = open("list");
        for k in ["a1", "a2", "a3", "b1", "c1"] {
            db.put(k, k.as_bytes()).unwrap();
        }
        fn keys(db: &ActorDb, o: &ListOptions) -> Vec<String> {
            db.list(o).unwrap().into_iter().map(|(k, _)| k).collect()
        }
        assert_eq!(
            keys(
                &db,
                &ListOptions {
                    prefix: Some("a".into()),
                    ..Default::default()
                }
            ),
            ["a1", "a2", "a3"]
        );
        assert_eq!(
            keys(
                &db,
                &ListOptions {
                    start: Some("a2".into()),
                    end: Some("c1".into()),
                    ..Default::default()
                }
            ),
            ["a2", "a3", "b1"]
        );
        assert_eq!(
            keys(
                &db,
                &ListOptions {
                    reverse: true,
                    limit: Some(2),
                    ..Default::default()
                }
            ),
            ["c1", "b1"]
        );
        assert!(db.delete("b1").unwrap());
        db.delete_all().unwrap();
        assert!(keys(&db, &ListOptions::default()).is_empty());
    }
}
