//! Where actors' databases live: `<data-dir>/actors/<class>/<name>.sqlite3`.
//!
//! Invariants owned here: one actor, one file, found again after a restart
//! from its address alone; an actor exists from its first use until it is
//! deleted, and deleting it removes its database with its WAL files. A
//! database that could not be created leaves no file behind, and a file
//! that is not an actor's database is reported by [`ActorDirectory::scan`],
//! never fatal.
//!
//! The directory also keeps the census: how many actors have a database
//! here. A new one is made only while the census is under its bound
//! (`max_actors`) and the app's storage room has free bytes
//! ([`StorageRoom`]), so no caller, however many names it makes up, grows
//! the number of files past it; an actor that already exists is never
//! refused. The room's count moves with every file the directory makes or
//! removes.
//!
//! Launch marks are trusted only as far as this build kept them: the
//! file that says they are whole (`actors/.launch-marks`) names a nonce,
//! and the data dir's lock file carries the same nonce as a stamp
//! (`weir_store::data_dir`) for as long as only builds that keep marks
//! hold the directory. A build from before marks, started on it even
//! once, drops the stamp; the next start then searches every database
//! again, so the journal rows that build wrote without a mark are found.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use weir_store::actor::{ActorDb, ActorStoreError};
use weir_store::journal::{LAUNCH_MARK_SUFFIX, launch_mark};
use weir_store::{Durability, StoreError};

use crate::address::ActorAddress;
use crate::storage_room::{StorageRoom, files_bytes};

/// Why an actor's database was not opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The actor does not exist, and the app already has `max` actors.
    #[error("the app has {max} actors (max_actors); a new one is made only after one is deleted")]
    TooMany { max: usize },
    /// The actor does not exist, and the app's actors already take
    /// `max_actor_storage_bytes`.
    #[error(
        "the app's actors take {used} bytes of the {max} they may (max_actor_storage_bytes); \
         a new one is made only after room is made"
    )]
    NoRoom { used: u64, max: u64 },
    #[error(transparent)]
    Store(#[from] ActorStoreError),
}

impl From<StoreError> for OpenError {
    fn from(e: StoreError) -> Self {
        OpenError::Store(e.into())
    }
}

/// How many actors have a database in the directory, and how many may.
/// Counted from the files at start ([`ActorDirectory::recount`]), then
/// kept by every creation and deletion made through the directory.
#[derive(Debug)]
struct Census {
    actors: AtomicUsize,
    max: AtomicUsize,
}

/// A file in the actor directory that Weir could not use: skipped, and
/// listed for operators.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Unreadable {
    pub path: PathBuf,
    pub error: String,
}

/// What a launch mark's file name ends with (after the actor's name).
const MARKED_DATABASE: &str = ".sqlite3-launches";

/// The file that says the directory's launch marks are whole.
const MARKS_KEPT: &str = ".launch-marks";

/// One listing of a class's directory ([`ActorDirectory::scan`]).
#[derive(Debug, Default)]
pub struct Scan {
    /// Actors with a database, in name order.
    pub actors: Vec<ActorAddress>,
    /// Those of them with a launch mark: their launch journal may have
    /// rows.
    pub marked: Vec<ActorAddress>,
    /// Database files whose names are not actor names.
    pub strangers: Vec<Unreadable>,
}

/// The on-disk directory of every actor of one Weir data dir.
#[derive(Clone)]
pub struct ActorDirectory {
    root: PathBuf,
    durability: Durability,
    census: Arc<Census>,
    room: Arc<StorageRoom>,
    /// The data dir whose lock file stamps the launch marks as whole
    /// (held by this process); `None`: the marks file alone says so.
    stamps: Option<PathBuf>,
}

/// What the marks file's nonce line starts with.
const NONCE_LINE: &str = "nonce ";

impl ActorDirectory {
    /// The directory under `data_dir`, with no bound on new actors until
    /// [`ActorDirectory::set_max_actors`] (an operator's tool opening a
    /// stopped server's data dir makes none).
    pub fn new(data_dir: &Path, durability: Durability) -> ActorDirectory {
        ActorDirectory {
            root: data_dir.join("actors"),
            durability,
            census: Arc::new(Census {
                actors: AtomicUsize::new(0),
                max: AtomicUsize::new(usize::MAX),
            }),
            room: Arc::default(),
            stamps: None,
        }
    }

    /// The directory trusting its launch marks only while the lock file of
    /// `data_dir` (which this process holds) carries their stamp.
    pub fn with_stamps(mut self, data_dir: &Path) -> ActorDirectory {
        self.stamps = Some(data_dir.to_path_buf());
        self
    }

    /// This directory's stamp line in the lock file, and the prefix that
    /// finds an older one of it.
    fn stamp_line(&self, data_dir: &Path, nonce: &str) -> (String, String) {
        let place = self.root.strip_prefix(data_dir).unwrap_or(&self.root);
        let prefix = format!("launch-marks {} ", place.display());
        (format!("{prefix}{nonce}"), prefix)
    }

    /// The directory counting its actors' files in `room`, which the
    /// layers above share for what they keep for the same actors (their
    /// storage slots).
    pub fn with_room(mut self, room: Arc<StorageRoom>) -> ActorDirectory {
        self.room = room;
        self
    }

    /// The room the app's actors share on disk.
    pub fn room(&self) -> &Arc<StorageRoom> {
        &self.room
    }

    /// The bytes of an actor's files on disk (0 when it has none).
    pub fn files_bytes(&self, actor: &ActorAddress) -> u64 {
        files_bytes(&self.path(actor))
    }

    /// Bounds the actors that may have a database here: a new one past it
    /// is refused ([`OpenError::TooMany`]).
    pub fn set_max_actors(&self, max: usize) {
        self.census.max.store(max, Ordering::Relaxed);
    }

    /// Sets the census to the actors found on disk (at start, before any
    /// is made).
    pub fn recount(&self, actors: usize) {
        self.census.actors.store(actors, Ordering::Relaxed);
    }

    /// Actors with a database here, and how many may have one.
    pub fn census(&self) -> (usize, usize) {
        (
            self.census.actors.load(Ordering::Relaxed),
            self.census.max.load(Ordering::Relaxed),
        )
    }

    /// Takes a place in the census for a new actor, or says why not.
    fn admit(&self) -> Result<(), OpenError> {
        if !self.room.has_room() {
            let (used, max) = self.room.usage();
            return Err(OpenError::NoRoom { used, max });
        }
        let max = self.census.max.load(Ordering::Relaxed);
        self.census
            .actors
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(drop)
            .map_err(|_| OpenError::TooMany { max })
    }

    fn release(&self) {
        let _ = self
            .census
            .actors
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// The database file of an actor.
    pub fn path(&self, actor: &ActorAddress) -> PathBuf {
        self.root
            .join(&actor.class)
            .join(format!("{}.sqlite3", actor.name))
    }

    /// The actor's database path, its class's directory made: where a
    /// placement keeps the local copy it opens. An actor with no local
    /// copy yet takes its place in the census here (the `bool`), and gives
    /// it back with [`ActorDirectory::not_made`] if the copy is not made.
    pub fn prepare(&self, actor: &ActorAddress) -> Result<(PathBuf, bool), OpenError> {
        let path = self.class_dir_made(actor)?;
        let new = !path.exists();
        if new {
            self.admit()?;
        }
        Ok((path, new))
    }

    /// Gives back the place [`ActorDirectory::prepare`] took for a new
    /// actor, unless its local copy was made after all.
    pub fn not_made(&self, path: &Path) {
        if !path.exists() {
            self.release();
        }
    }

    fn class_dir_made(&self, actor: &ActorAddress) -> Result<PathBuf, StoreError> {
        let path = self.path(actor);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir {
                path: dir.to_path_buf(),
                cause: source,
            })?;
        }
        Ok(path)
    }

    /// Where the actors' databases are: `<data-dir>/actors`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The durability the actors' databases are opened with.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Opens an actor's database, creating the actor on first use if the
    /// census has room. If the actor is new and its database cannot be
    /// made, nothing is left behind.
    pub fn open(&self, actor: &ActorAddress) -> Result<ActorDb, OpenError> {
        let path = self.class_dir_made(actor)?;
        let existed = path.exists();
        if !existed {
            self.admit()?;
        }
        let opened = ActorDb::open(&path, self.durability);
        if opened.is_err() && !existed {
            // Its place goes back with its files; if none was made, by
            // itself. A file that could not be removed keeps it.
            match self.remove(actor, false) {
                Ok(true) | Err(_) => {}
                Ok(false) => self.release(),
            }
        }
        Ok(opened?)
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
        Ok(self.scan(class)?.actors)
    }

    /// What one listing of a class's directory finds (no database is
    /// opened): its actors, those with a launch mark, and the files whose
    /// names are not actor names (left by something else), each with why.
    /// A mark whose database is gone is removed.
    pub fn scan(&self, class: &str) -> std::io::Result<Scan> {
        let dir = self.root.join(class);
        let mut found = Scan::default();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
            Err(e) => return Err(e),
        };
        let mut marks = Vec::new();
        for entry in entries {
            let entry = entry?;
            let file = entry.file_name();
            let Some(file) = file.to_str() else { continue };
            if let Some(name) = file.strip_suffix(MARKED_DATABASE) {
                marks.push(name.to_string());
                continue;
            }
            let Some(name) = file.strip_suffix(".sqlite3") else {
                continue;
            };
            match ActorAddress::new(class, name) {
                Ok(actor) => found.actors.push(actor),
                Err(e) => found.strangers.push(Unreadable {
                    path: entry.path(),
                    error: e.to_string(),
                }),
            }
        }
        found.actors.sort();
        for name in marks {
            let Ok(actor) = ActorAddress::new(class, &name) else {
                continue;
            };
            if found.actors.binary_search(&actor).is_ok() {
                found.marked.push(actor);
            } else {
                self.unmark(&actor);
            }
        }
        found.marked.sort();
        Ok(found)
    }

    /// Removes an actor's launch mark (its journal was found empty under
    /// its owner's hold, or its database is gone).
    pub fn unmark(&self, actor: &ActorAddress) {
        let mark = launch_mark(&self.path(actor));
        if let Err(e) = std::fs::remove_file(&mark)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %mark.display(), error = %e, "cannot remove a launch mark");
        }
    }

    /// True once every actor here with launch journal rows has its launch
    /// mark: the directory was made, or first listed, by a build that
    /// keeps them ([`ActorDirectory::keep_marks`]), and (with
    /// [`ActorDirectory::with_stamps`]) no older build held the data dir
    /// since. Otherwise it is searched by opening each database once.
    pub fn marks_kept(&self) -> bool {
        let Ok(text) = std::fs::read_to_string(self.root.join(MARKS_KEPT)) else {
            return false;
        };
        let Some(data_dir) = &self.stamps else {
            return true;
        };
        text.lines()
            .find_map(|line| line.strip_prefix(NONCE_LINE))
            .is_some_and(|nonce| {
                weir_store::data_dir::stamped(data_dir, &self.stamp_line(data_dir, nonce).0)
            })
    }

    /// Records that every actor here with journal rows has its mark: the
    /// marks file with a new nonce, then (with stamps) the lock file's
    /// stamp of it. A crash between the two leaves them unmatched, and
    /// the next start searches again.
    pub fn keep_marks(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.root)?;
        let mut random = [0u8; 8];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut random)?;
        let nonce: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let file = self.root.join(MARKS_KEPT);
        std::fs::write(
            &file,
            format!(
                "Every actor database here with launch journal rows has its NAME.sqlite3-launches mark.\n{NONCE_LINE}{nonce}\n"
            ),
        )?;
        std::fs::File::open(&file)?.sync_all()?;
        std::fs::File::open(&self.root)?.sync_all()?;
        if let Some(data_dir) = &self.stamps {
            let (line, prefix) = self.stamp_line(data_dir, &nonce);
            weir_store::data_dir::stamp(data_dir, &line, &prefix)?;
        }
        Ok(())
    }

    /// Deletes a hibernated actor: its database and WAL files, its place
    /// in the census and what its files took in the storage room. The
    /// caller makes sure the actor is not running.
    pub fn delete(&self, actor: &ActorAddress) -> std::io::Result<bool> {
        self.remove(actor, true)
    }

    /// Deletes an actor whose database is still open somewhere: what it
    /// takes in the room is given back when that closes (see
    /// `crate::gate`), not here.
    pub fn delete_open(&self, actor: &ActorAddress) -> std::io::Result<bool> {
        self.remove(actor, false)
    }

    /// Removes an actor's files and its place in the census; `counted`:
    /// its files are what the room counts for it.
    fn remove(&self, actor: &ActorAddress, counted: bool) -> std::io::Result<bool> {
        let path = self.path(actor);
        let existed = path.is_file();
        let took = if counted { files_bytes(&path) } else { 0 };
        for suffix in ["", "-wal", "-shm", LAUNCH_MARK_SUFFIX] {
            let file = PathBuf::from(format!("{}{suffix}", path.display()));
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        // Under `--durability fsync` a deletion is answered only once it
        // would survive a power loss: the unlinks are in the directory's
        // own blocks, which only its fsync makes durable.
        if existed && self.durability == Durability::Fsync {
            std::fs::File::open(path.parent().unwrap_or(&self.root))?.sync_all()?;
        }
        if existed {
            self.release();
        }
        self.room.moved(took, 0);
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

    #[test]
    fn a_listing_finds_the_marked_actors_and_drops_a_mark_without_a_database() {
        assert_eq!(MARKED_DATABASE, format!(".sqlite3{LAUNCH_MARK_SUFFIX}"));
        let data = weir_scratch::dir("actors-marks");
        let directory = ActorDirectory::new(&data, Durability::Process);
        let [a, b, gone] = ["a", "b", "gone"].map(|n| ActorAddress::new("c", n).unwrap());
        directory.open(&a).unwrap();
        directory.open(&b).unwrap();
        weir_store::journal::make_launch_mark(&directory.path(&a)).unwrap();
        directory.open(&gone).unwrap();
        weir_store::journal::make_launch_mark(&directory.path(&gone)).unwrap();
        std::fs::remove_file(directory.path(&gone)).unwrap();
        let found = directory.scan("c").unwrap();
        assert_eq!(found.actors, [a.clone(), b]);
        assert_eq!(found.marked, std::slice::from_ref(&a));
        assert!(!launch_mark(&directory.path(&gone)).exists());
        // A deletion takes the mark with the database.
        assert!(directory.delete(&a).unwrap());
        assert!(!launch_mark(&directory.path(&a)).exists());
    }

    #[test]
    fn the_census_bounds_new_actors_and_never_existing_ones() {
        let data = weir_scratch::dir("actors-census");
        let directory = ActorDirectory::new(&data, Durability::Process);
        directory.set_max_actors(2);
        let [a, b, c] = ["a", "b", "c"].map(|n| ActorAddress::new("counter", n).unwrap());
        directory.open(&a).unwrap();
        directory.open(&b).unwrap();
        assert!(matches!(
            directory.open(&c),
            Err(OpenError::TooMany { max: 2 })
        ));
        assert!(!directory.exists(&c));
        // An actor that exists opens again, however full the census.
        directory.open(&a).unwrap();
        assert_eq!(directory.census(), (2, 2));
        // A database that cannot be made gives its place back: where its
        // file would be, a link into a directory that does not exist.
        assert!(directory.delete(&b).unwrap());
        assert_eq!(directory.census(), (1, 2));
        std::os::unix::fs::symlink(data.join("none/b.sqlite3"), directory.path(&b)).unwrap();
        assert!(directory.open(&b).is_err());
        assert_eq!(directory.census(), (1, 2));
        assert!(!directory.path(&b).is_symlink(), "left behind");
        // A placement's new local copy takes a place, and gives it back
        // when it is not made.
        let (path, new) = directory.prepare(&c).unwrap();
        assert!(new);
        assert_eq!(directory.census(), (2, 2));
        directory.not_made(&path);
        assert_eq!(directory.census(), (1, 2));
        directory.open(&c).unwrap();
        assert!(matches!(
            directory.prepare(&b),
            Err(OpenError::TooMany { max: 2 })
        ));
        let (_, new) = directory.prepare(&c).unwrap();
        assert!(!new);
    }

    #[test]
    fn a_full_storage_room_refuses_new_actors_and_a_deletion_gives_room_back() {
        let data = weir_scratch::dir("actors-room");
        let directory = ActorDirectory::new(&data, Durability::Process);
        let [a, b] = ["a", "b"].map(|n| ActorAddress::new("counter", n).unwrap());
        drop(directory.open(&a).unwrap());
        let files = directory.files_bytes(&a);
        assert!(files > 0);
        // The room counts `a` (as a start would), and has no room for one
        // more actor's first pages.
        directory.room().moved(0, files);
        directory
            .room()
            .set_max(files + crate::storage_room::NEW_ACTOR_BYTES - 1);
        assert!(matches!(
            directory.open(&b),
            Err(OpenError::NoRoom { used, .. }) if used == files
        ));
        assert!(!directory.exists(&b));
        assert_eq!(directory.census(), (1, usize::MAX));
        // An actor that exists opens however full the room.
        drop(directory.open(&a).unwrap());
        // Deleting it gives back what its files took.
        assert!(directory.delete(&a).unwrap());
        assert_eq!(directory.room().usage().0, 0);
        drop(directory.open(&b).unwrap());
    }
}
