//! The image store: components kept by the SHA-256 of their bytes, under
//! the data dir, shared safely by every Weir process that opens it (a
//! server, `weir run`, `weir images`).
//!
//! Invariants owned here:
//! - a file at a digest's name is a whole image or absent, and once there
//!   it is never replaced. A push writes a temporary file, fsyncs it,
//!   links it into place unless a file is there already, and fsyncs the
//!   directory, so an interrupted push (a crash, a full disk, `SIGKILL`)
//!   never leaves a file at its digest, and two pushes of one image at
//!   once leave the file the first placed, with every root on it;
//! - bytes are verified before anyone uses them: [`ImageStore::read`]
//!   hashes what it read and refuses a corrupt or truncated image as
//!   `image_corrupt`, naming the digest;
//! - an image is rooted before its first byte is read ([`ImageStore::root`]),
//!   and a rooted image is never removed. A root is a shared `flock` on the
//!   image file itself, so it holds across processes and ends when its
//!   holder does, however it ends. Removal takes the exclusive lock without
//!   waiting, so a root is never waited out: the image is simply spared;
//! - the sweep removes exactly the images that nothing roots and that the
//!   caller does not declare: no TTL, no guess. Half-written pushes whose
//!   writer is gone (their lock is free) go too, and so does the compiled
//!   code of every image removed.

use std::collections::HashSet;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use sha2::{Digest as _, Sha256};

pub use crate::digest::Digest;

use crate::error_code::ProgramErrorCode;

/// The file name ending of a stored image.
const IMAGE_EXTENSION: &str = "wasm";

/// The prefix of a push in progress (a dot file: never listed as an image).
const PARTIAL_PREFIX: &str = ".partial-";

/// The data dir's subdirectory that holds the image store.
pub const IMAGES_DIR: &str = "images";

/// The subdirectory of the image store where compiled code is cached.
pub const COMPILED_DIR: &str = "compiled";

/// Why the store refused.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("`{0}` is not an image digest (sha256:<64 lower-case hex digits>)")]
    InvalidDigest(String),
    #[error("no image {0} in the store")]
    NotFound(Digest),
    #[error("image {digest} is corrupt: {why}; push it again")]
    Corrupt { digest: Digest, why: String },
    #[error("the image is {bytes} bytes; max_image_bytes is {limit}")]
    TooLarge { bytes: u64, limit: u64 },
    #[error("image {0} is in use (a run or process holds it)")]
    InUse(Digest),
    #[error("the cluster's images cannot be reached: {0}")]
    Unavailable(String),
    #[error("the image store {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
}

impl ImageError {
    /// The error code callers and operators see.
    pub fn code(&self) -> ProgramErrorCode {
        match self {
            ImageError::InvalidDigest(_) => ProgramErrorCode::ImageDigestInvalid,
            ImageError::NotFound(_) => ProgramErrorCode::ImageNotFound,
            ImageError::Corrupt { .. } => ProgramErrorCode::ImageCorrupt,
            ImageError::TooLarge { .. } => ProgramErrorCode::ImageTooLarge,
            ImageError::InUse(_) => ProgramErrorCode::ImageInUse,
            ImageError::Io { .. } => ProgramErrorCode::ImageStoreFailed,
            ImageError::Unavailable(_) => ProgramErrorCode::ImagesUnavailable,
        }
    }
}

/// One stored image, as `list` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ImageInfo {
    pub digest: Digest,
    pub bytes: u64,
    /// Held by a run or a process right now.
    pub rooted: bool,
}

/// What a sweep did (or, dry, would do).
#[derive(Clone, Debug, Default, Serialize)]
pub struct SweepReport {
    /// Nothing was removed: `removed`, `partials_removed` and
    /// `bytes_freed` say what a sweep now would remove and free.
    pub dry_run: bool,
    /// Images removed.
    pub removed: Vec<Digest>,
    /// Images kept because something roots them.
    pub rooted: Vec<Digest>,
    /// Images kept because the caller declares them.
    pub declared: Vec<Digest>,
    /// Abandoned half-written pushes removed.
    pub partials_removed: usize,
    /// Bytes given back.
    pub bytes_freed: u64,
}

/// An image held against removal: while it lives, no sweep or `rm` of any
/// process removes the image. Its bytes are read through it.
pub struct Root {
    digest: Digest,
    file: File,
}

impl Root {
    pub fn digest(&self) -> Digest {
        self.digest
    }
}

/// The image store of one data dir.
#[derive(Clone)]
pub struct ImageStore {
    dir: PathBuf,
    max_image_bytes: u64,
}

/// Numbers this process's pushes, so two at once never share a file.
static PUSHES: AtomicU64 = AtomicU64::new(0);

impl ImageStore {
    /// Opens (creating if needed) the store in `dir`.
    pub fn open(dir: &Path, max_image_bytes: u64) -> Result<ImageStore, ImageError> {
        std::fs::create_dir_all(dir.join(COMPILED_DIR)).map_err(|source| ImageError::Io {
            path: dir.to_path_buf(),
            cause: source,
        })?;
        Ok(ImageStore {
            dir: dir.to_path_buf(),
            max_image_bytes,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn max_image_bytes(&self) -> u64 {
        self.max_image_bytes
    }

    /// Where compiled code of these images is cached.
    pub fn compiled_dir(&self) -> PathBuf {
        self.dir.join(COMPILED_DIR)
    }

    fn io(&self, source: std::io::Error) -> ImageError {
        ImageError::Io {
            path: self.dir.clone(),
            cause: source,
        }
    }

    fn path_of(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}.{IMAGE_EXTENSION}", digest.hex()))
    }

    /// Stores `bytes` (already stored: nothing is written) and roots the
    /// image for the caller. The root is taken on the file that was
    /// renamed into place, before the rename, so not even a sweep between
    /// the rename and the return can remove it.
    pub fn push(&self, bytes: &[u8]) -> Result<(Root, bool), ImageError> {
        if bytes.len() as u64 > self.max_image_bytes {
            return Err(ImageError::TooLarge {
                bytes: bytes.len() as u64,
                limit: self.max_image_bytes,
            });
        }
        let digest = Digest::of(bytes);
        match self.root(&digest) {
            Ok(root) => return Ok((root, false)),
            Err(ImageError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let mut incoming = self.incoming(digest)?;
        incoming.write(bytes)?;
        Ok((incoming.finish()?, true))
    }

    /// Begins writing the image `digest` piece by piece (what is fetched
    /// from elsewhere): nothing is at the digest's name until
    /// [`Incoming::finish`] has checked that the bytes hash to it.
    pub fn incoming(&self, digest: Digest) -> Result<Incoming, ImageError> {
        let partial = self.dir.join(format!(
            "{PARTIAL_PREFIX}{}-{}-{}",
            digest.hex(),
            std::process::id(),
            PUSHES.fetch_add(1, Ordering::Relaxed)
        ));
        let open = || -> std::io::Result<File> {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&partial)?;
            // Locked while written: a sweep spares a push in progress.
            file.lock_shared()?;
            Ok(file)
        };
        let file = open().map_err(|e| self.io(e))?;
        Ok(Incoming {
            store: self.clone(),
            digest,
            partial,
            file: Some(file),
            hasher: Sha256::new(),
            written: 0,
        })
    }

    /// Roots a stored image: from now until the root is dropped, nothing
    /// removes it.
    pub fn root(&self, digest: &Digest) -> Result<Root, ImageError> {
        let path = self.path_of(digest);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ImageError::NotFound(*digest));
            }
            Err(e) => return Err(self.io(e)),
        };
        file.lock_shared().map_err(|e| self.io(e))?;
        // A remover may have unlinked the file between the open and the
        // lock: a root on an unlinked file roots nothing.
        let linked = file.metadata().map_err(|e| self.io(e))?.nlink() > 0;
        if !linked {
            return Err(ImageError::NotFound(*digest));
        }
        Ok(Root {
            digest: *digest,
            file,
        })
    }

    /// The image's bytes, verified against its digest.
    pub fn read(&self, root: &mut Root) -> Result<Vec<u8>, ImageError> {
        let mut bytes = Vec::new();
        (&root.file)
            .seek(SeekFrom::Start(0))
            .map_err(|e| self.io(e))?;
        (&root.file)
            .take(self.max_image_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| self.io(e))?;
        let digest = root.digest;
        if bytes.len() as u64 > self.max_image_bytes {
            return Err(ImageError::Corrupt {
                digest,
                why: format!(
                    "it is longer than max_image_bytes ({})",
                    self.max_image_bytes
                ),
            });
        }
        let found = Digest::of(&bytes);
        if found != digest {
            return Err(ImageError::Corrupt {
                digest,
                why: format!("its {} bytes hash to {found}", bytes.len()),
            });
        }
        Ok(bytes)
    }

    /// Every stored image, by digest.
    pub fn list(&self) -> Result<Vec<ImageInfo>, ImageError> {
        let mut images = Vec::new();
        for (digest, path) in self.images()? {
            let Ok(file) = File::open(&path) else {
                continue;
            };
            let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
            images.push(ImageInfo {
                digest,
                bytes,
                rooted: held(&file),
            });
        }
        images.sort_by_key(|i| i.digest);
        Ok(images)
    }

    /// Removes one image unless something roots it. False when it was not
    /// there.
    pub fn remove(&self, digest: &Digest) -> Result<bool, ImageError> {
        match self.remove_unrooted(digest, &self.path_of(digest), false)? {
            Removal::Removed(_) => Ok(true),
            Removal::Absent => Ok(false),
            Removal::Rooted => Err(ImageError::InUse(*digest)),
        }
    }

    /// Removes every image that nothing roots and `declared` does not name,
    /// and every abandoned push; `dry_run`: removes nothing, and reports
    /// what it would remove.
    pub fn sweep(
        &self,
        declared: &HashSet<Digest>,
        dry_run: bool,
    ) -> Result<SweepReport, ImageError> {
        let mut report = SweepReport {
            dry_run,
            ..SweepReport::default()
        };
        for (digest, path) in self.images()? {
            if declared.contains(&digest) {
                report.declared.push(digest);
                continue;
            }
            match self.remove_unrooted(&digest, &path, dry_run)? {
                Removal::Removed(bytes) => {
                    report.removed.push(digest);
                    report.bytes_freed += bytes;
                }
                Removal::Rooted => report.rooted.push(digest),
                Removal::Absent => {}
            }
        }
        let entries = std::fs::read_dir(&self.dir).map_err(|e| self.io(e))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !name.to_string_lossy().starts_with(PARTIAL_PREFIX) {
                continue;
            }
            let Ok(file) = File::open(entry.path()) else {
                continue;
            };
            if file.try_lock().is_ok() {
                let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
                if dry_run || std::fs::remove_file(entry.path()).is_ok() {
                    report.partials_removed += 1;
                    report.bytes_freed += bytes;
                }
            }
        }
        report.removed.sort();
        report.rooted.sort();
        report.declared.sort();
        Ok(report)
    }

    /// Removes the image unless something roots it; `dry`: only says
    /// whether it would.
    fn remove_unrooted(
        &self,
        digest: &Digest,
        path: &Path,
        dry: bool,
    ) -> Result<Removal, ImageError> {
        let file = match File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Removal::Absent),
            Err(e) => return Err(self.io(e)),
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(Removal::Rooted),
            Err(TryLockError::Error(e)) => return Err(self.io(e)),
        }
        let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
        if dry {
            return Ok(Removal::Removed(bytes));
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Removal::Absent),
            Err(e) => return Err(self.io(e)),
        }
        self.remove_compiled(digest);
        Ok(Removal::Removed(bytes))
    }

    /// Removes the compiled code of an image (its artifacts are named by
    /// the image's hex digest first: see `weir_runtime::compiled_code`).
    fn remove_compiled(&self, digest: &Digest) {
        let prefix = format!("{}-", digest.hex());
        let Ok(entries) = std::fs::read_dir(self.compiled_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// The stored images' digests and paths.
    fn images(&self) -> Result<Vec<(Digest, PathBuf)>, ImageError> {
        let entries = std::fs::read_dir(&self.dir).map_err(|e| self.io(e))?;
        Ok(entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name();
                let stem = name
                    .to_str()?
                    .strip_suffix(&format!(".{IMAGE_EXTENSION}"))?;
                Some((stem.parse().ok()?, entry.path()))
            })
            .collect())
    }
}

/// An image being written ([`ImageStore::incoming`]): its bytes go to a
/// locked partial file and are hashed as they come. Dropped unfinished, it
/// leaves nothing behind.
pub struct Incoming {
    store: ImageStore,
    digest: Digest,
    partial: PathBuf,
    file: Option<File>,
    hasher: Sha256,
    written: u64,
}

impl Incoming {
    /// Appends `bytes`; refused past `max_image_bytes`.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), ImageError> {
        let written = self.written + bytes.len() as u64;
        if written > self.store.max_image_bytes {
            return Err(ImageError::TooLarge {
                bytes: written,
                limit: self.store.max_image_bytes,
            });
        }
        let file = self.file.as_mut().expect("written before finished");
        file.write_all(bytes).map_err(|e| self.store.io(e))?;
        self.hasher.update(bytes);
        self.written = written;
        Ok(())
    }

    /// How many bytes were written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Checks the bytes against the digest, makes them durable and puts
    /// them at the digest's name, rooted for the caller (the root is taken
    /// before the rename, so not even a sweep in between can remove it).
    /// Bytes that do not hash to the digest are `Corrupt`, and nothing is
    /// stored.
    pub fn finish(mut self) -> Result<Root, ImageError> {
        let found = Digest::finished(std::mem::take(&mut self.hasher));
        if found != self.digest {
            return Err(ImageError::Corrupt {
                digest: self.digest,
                why: format!("its {} bytes hash to {found}", self.written),
            });
        }
        let file = self.file.take().expect("finished once");
        let store = &self.store;
        let place = || -> std::io::Result<bool> {
            file.sync_all()?;
            // Linked, never renamed, into place: a rename would replace a
            // file another push put there meanwhile, which its users hold
            // rooted (a root is a lock on that file), and leave at the
            // digest's name a file nothing roots.
            let placed = match std::fs::hard_link(&self.partial, store.path_of(&self.digest)) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
                Err(e) => return Err(e),
            };
            // A partial name left behind is swept as a push whose writer
            // is gone.
            let _ = std::fs::remove_file(&self.partial);
            File::open(&store.dir)?.sync_all()?;
            Ok(placed)
        };
        match place() {
            Ok(true) => Ok(Root {
                digest: self.digest,
                file,
            }),
            // The same bytes are stored already: that file is the image,
            // rooted for the caller (removed meanwhile, nothing was
            // stored, and the caller may push again).
            Ok(false) => store.root(&self.digest),
            Err(source) => {
                let _ = std::fs::remove_file(&self.partial);
                Err(store.io(source))
            }
        }
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

enum Removal {
    Removed(u64),
    Rooted,
    Absent,
}

/// True when some root holds `file`'s image (its exclusive lock is taken).
fn held(file: &File) -> bool {
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            false
        }
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is in the store's directory besides `compiled`.
    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != COMPILED_DIR)
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_second_push_of_an_image_at_once_keeps_the_file_the_first_placed_and_its_roots() {
        let dir = weir_scratch::dir("image-twice");
        let store = ImageStore::open(&dir, 1000).unwrap();
        let bytes: Vec<u8> = (0..700u32).map(|i| (i * 7 % 253) as u8).collect();
        let digest = Digest::of(&bytes);
        let inode = |root: &Root| root.file.metadata().unwrap().ino();
        // Two pushes that both found the image missing: the first places
        // its file, and a process runs from it (rooted).
        let mut first = store.incoming(digest).unwrap();
        let mut second = store.incoming(digest).unwrap();
        first.write(&bytes).unwrap();
        second.write(&bytes).unwrap();
        let running = first.finish().unwrap();
        // The second finds it placed: its root is on that same file.
        let pushed = second.finish().unwrap();
        let at_name = std::fs::metadata(dir.join(format!("{}.wasm", digest.hex())))
            .unwrap()
            .ino();
        assert_eq!(inode(&running), at_name, "the file in use was replaced");
        assert_eq!(inode(&pushed), at_name);
        assert_eq!(files(&dir), [format!("{}.wasm", digest.hex())]);
        // Once the second push lets go, the running process still roots
        // the image: a sweep spares it.
        drop(pushed);
        let swept = store.sweep(&HashSet::new(), false).unwrap();
        assert!(swept.removed.is_empty(), "{:?}", swept.removed);
        assert_eq!(files(&dir), [format!("{}.wasm", digest.hex())]);
        drop(running);
    }

    #[test]
    fn an_incoming_image_is_stored_only_whole_and_only_as_its_digest() {
        let dir = weir_scratch::dir("image-incoming");
        let store = ImageStore::open(&dir, 1000).unwrap();
        let bytes: Vec<u8> = (0..900u32).map(|i| (i * 31 % 251) as u8).collect();
        let digest = Digest::of(&bytes);

        // In pieces, as a fetch writes it.
        let mut incoming = store.incoming(digest).unwrap();
        for piece in bytes.chunks(256) {
            incoming.write(piece).unwrap();
        }
        assert_eq!(incoming.written(), 900);
        let mut root = incoming.finish().unwrap();
        assert_eq!(store.read(&mut root).unwrap(), bytes);
        assert_eq!(files(&dir), [format!("{}.wasm", digest.hex())]);
        drop(root);
        assert!(store.remove(&digest).unwrap());

        // A flipped byte: refused, nothing left.
        let mut flipped = bytes.clone();
        flipped[100] ^= 1;
        let mut incoming = store.incoming(digest).unwrap();
        incoming.write(&flipped).unwrap();
        match incoming.finish() {
            Err(ImageError::Corrupt { why, .. }) => {
                assert_eq!(
                    why,
                    format!("its 900 bytes hash to {}", Digest::of(&flipped))
                )
            }
            other => panic!("{:?}", other.map(|r| r.digest())),
        }
        assert!(files(&dir).is_empty(), "{:?}", files(&dir));

        // Past max_image_bytes: refused at the write that crosses it.
        let mut incoming = store.incoming(digest).unwrap();
        incoming.write(&bytes).unwrap();
        assert!(matches!(
            incoming.write(&bytes[..101]),
            Err(ImageError::TooLarge {
                bytes: 1001,
                limit: 1000
            })
        ));
        // Dropped unfinished (a fetch cut short): nothing left.
        drop(incoming);
        assert!(files(&dir).is_empty(), "{:?}", files(&dir));
        assert!(matches!(store.root(&digest), Err(ImageError::NotFound(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
