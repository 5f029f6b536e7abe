//! Where actors' databases live: `<data-dir>/actors/<class>/<name>.sqlite3`.
//!
//! Invariants owned here: one actor, one file, found again after a restart
//! from its address alone; an actor exists from its first use until it is
//! deleted, and deleting it removes its database with its WAL files. A
//! database that could not be created leaves no file behind, and a file
//! that is not an actor's database is reported by [`ActorDirectory::scan`],
//! never fatal.

use std::path::{Path, PathBuf};

use weir_store::actor::ActorDb;
use weir_store::{Durability, StoreError};

use crate::address::ActorAddress;

/// A file in the actor directory that Weir could not use: skipped, and
/// listed for operators.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Unreadable {
    pub path: PathBuf,
    pub error: String,
}

/// The on-disk directory of every actor of one Weir data dir.
#[derive(Clone)]
pub struct ActorDirectory {
    root: PathBuf,
    durability: Durability,
}

impl ActorDirectory {
    pub fn new(data_dir: &Path, durability: Durability) -> ActorDirectory {
        ActorDirectory {
            root: data_dir.join("actors"),
            durability,
        }
    }

    /// The database file of an actor.
    pub fn path(&self, actor: &ActorAddress) -> PathBuf {
        self.root
            .join(&actor.class)
            .join(format!("{}.sqlite3", actor.name))
    }

    /// The actor's database path, its class's directory made: where a
    /// placement keeps the local copy it opens.
    pub fn prepare(&self, actor: &ActorAddress) -> Result<PathBuf, StoreError> {
        let path = self.path(actor);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        Ok(path)
    }

    /// The durability the actors' databases are opened with.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Opens an actor's database, creating the actor on first use. If the
    /// actor is new and its database cannot be made, nothing is left
    /// behind.
    pub fn open(
        &self,
        actor: &ActorAddress,
    ) -> Result<ActorDb, weir_store::actor::ActorStoreError> {
        let path = self.path(actor);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let existed = path.exists();
        let opened = ActorDb::open(&path, self.durability);
        if opened.is_err() && !existed {
            let _ = self.delete(actor);
        }
        opened
    }

    /// True when the actor has a database.
    pub fn exists(&self, actor: &ActorAddress) -> bool {
        self.path(actor).is_file()
    }

    /// The classes that have a directory of databases, in name order.
    pub fn classes(&self) -> std::io::Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut classes: Vec<String> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        classes.sort();
        Ok(classes)
    }

    /// The actors of a class that have a database, in name order.
    pub fn list(&self, class: &str) -> std::io::Result<Vec<ActorAddress>> {
        Ok(self.scan(class)?.0)
    }

    /// [`ActorDirectory::list`], and the database files of the class
    /// whose names are not actor names (left by something else), each
    /// with why.
    pub fn scan(&self, class: &str) -> std::io::Result<(Vec<ActorAddress>, Vec<Unreadable>)> {
        let dir = self.root.join(class);
        let mut actors = Vec::new();
        let mut strangers = Vec::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((actors, strangers)),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let file = entry.file_name();
            let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".sqlite3")) else {
                continue;
            };
            match ActorAddress::new(class, name) {
                Ok(actor) => actors.push(actor),
                Err(e) => strangers.push(Unreadable {
                    path: entry.path(),
                    error: e.to_string(),
                }),
            }
        }
        actors.sort();
        Ok((actors, strangers))
    }

    /// Deletes an actor: its database and WAL files. The caller makes sure
    /// the actor is not running.
    pub fn delete(&self, actor: &ActorAddress) -> std::io::Result<bool> {
        let path = self.path(actor);
        let existed = path.is_file();
        for suffix in ["", "-wal", "-shm"] {
            let file = PathBuf::from(format!("{}{suffix}", path.display()));
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(existed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_are_created_found_listed_and_deleted() {
        let data = weir_scratch::dir("actors-dir");
        let directory = ActorDirectory::new(&data, Durability::Process);
        let a = ActorAddress::new("counter", "a").unwrap();
        let b = ActorAddress::new("counter", "b.eu").unwrap();
        assert!(!directory.exists(&a));
        {
            let mut db = directory.open(&a).unwrap();
            db.begin_turn().unwrap();
            db.put("n", b"1").unwrap();
            db.commit_turn().unwrap();
            directory.open(&b).unwrap();
        }
        assert_eq!(
            directory.list("counter").unwrap(),
            vec![a.clone(), b.clone()]
        );
        assert!(directory.list("nothing").unwrap().is_empty());
        // Found again by address alone, with its data.
        assert_eq!(
            directory.open(&a).unwrap().get("n").unwrap(),
            Some(b"1".to_vec())
        );
        assert!(directory.delete(&a).unwrap());
        assert!(!directory.exists(&a));
        assert!(!directory.delete(&a).unwrap());
        assert_eq!(directory.list("counter").unwrap(), vec![b]);
    }
}
