//! Shared images: in cluster mode, every node runs every pushed image. A
//! push to any node is kept in the cluster's database as well as in that
//! node's store, and a node that lacks an image a turn names fetches it
//! from the database into its own store first; each node also catches up
//! in the background: it fetches (and compiles, as a push would) what was
//! pushed elsewhere, shares the images its own store held before, and
//! drops the ones the cluster removed.
//!
//! Invariants owned here:
//! - a fetched image is the image: its bytes are hashed as they arrive
//!   and only bytes that hash to its digest are stored. A shared copy that
//!   was cut short, grew or was altered is `image_corrupt`, and nothing
//!   is kept;
//! - a fetch holds at most two pieces ([`IMAGE_PIECE_BYTES`]) of the image
//!   in the host (the one arriving, the one being written), and one fetch
//!   runs at a time on a node: a second caller for the same image waits
//!   and then finds it stored;
//! - what cannot be reached is named: `images_unavailable` (503), never
//!   a hang (the database's calls are bounded) and never `image_not_found`
//!   for an image the cluster may well have;
//! - nothing a node holds is lost by joining: an image in its store that
//!   the cluster never had is shared, not dropped; only an image the
//!   cluster removed (by an operator's `DELETE`, recorded) is dropped, and
//!   never while a run or process holds it. An operator's sweep spares
//!   every image the cluster shares (a sweep that cannot ask the cluster
//!   removes nothing).

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::image_store::{Digest, ImageError, ImageStore, Incoming, Root, SweepReport};

/// A future the shared images' calls return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The size of one piece of a shared image, as kept in the database and
/// fetched: one row, bounded in what it holds in the host and in how long
/// it takes to move (a 256 MiB image is 64 of them).
pub const IMAGE_PIECE_BYTES: usize = 4 * 1024 * 1024;

/// How often a node catches up with the cluster's images: an image pushed
/// to another node is here and compiled, and one removed from the cluster
/// is gone from here (once nothing runs it), within about this long. Two
/// small queries each time.
pub const CATCH_UP_INTERVAL: Duration = Duration::from_secs(2);

/// Compiles a stored image for the programs that may run it (blocking).
pub type PrepareImage = Arc<dyn Fn(&Digest) -> Result<(), String> + Send + Sync>;

/// Who shares an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharer {
    /// The operator's push: shares it even if the cluster removed it.
    Push,
    /// A node sharing a copy its own store kept (one from before it
    /// joined, or put there by `weir images push`): never an image the
    /// cluster removed.
    Kept,
}

/// What the cluster shares, and what it removed (so that a node holding a
/// removed image drops it rather than sharing it again).
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    pub shared: Vec<(Digest, u64)>,
    pub removed: HashSet<Digest>,
}

/// Where a cluster keeps the images its nodes share (its database).
/// Unreachable is `ImageError::Unavailable`.
pub trait SharedImages: Send + Sync {
    /// Keeps the image `digest` (`bytes`) for every node: true once it is
    /// shared, false when `by` is [`Sharer::Kept`] and the cluster removed
    /// it. Sharing an image already shared writes its bytes again
    /// (mending a damaged copy).
    fn publish<'a>(
        &'a self,
        digest: Digest,
        bytes: &'a [u8],
        by: Sharer,
    ) -> BoxFuture<'a, Result<bool, ImageError>>;

    /// The size of the shared image `digest`, if it is shared.
    fn size(&self, digest: Digest) -> BoxFuture<'_, Result<Option<u64>, ImageError>>;

    /// Piece `index` of the shared image `digest` (pieces of
    /// [`IMAGE_PIECE_BYTES`], the last one shorter); `None` when there is
    /// no such piece.
    fn piece(
        &self,
        digest: Digest,
        index: u32,
    ) -> BoxFuture<'_, Result<Option<Vec<u8>>, ImageError>>;

    /// Every shared image and its size, by digest, and the removed ones.
    fn catalog(&self) -> BoxFuture<'_, Result<Catalog, ImageError>>;

    /// Stops sharing `digest` and records its removal: true if it was
    /// shared.
    fn remove(&self, digest: Digest) -> BoxFuture<'_, Result<bool, ImageError>>;
}

/// One node's view of the shared images: its own store, kept as a cache
/// of the cluster's.
pub struct ImageMirror {
    shared: Arc<dyn SharedImages>,
    /// One fetch at a time on this node.
    fetching: tokio::sync::Mutex<()>,
    /// Images the catch-up could not fetch or share, already logged (it
    /// tries every [`CATCH_UP_INTERVAL`]; it says so once).
    told: std::sync::Mutex<HashSet<Digest>>,
    counts: Counts,
}

/// What a node's mirror did since it started, as `/status` shows it
/// (`images`).
#[derive(Default)]
struct Counts {
    fetched: AtomicU64,
    fetched_bytes: AtomicU64,
    fetches_refused: AtomicU64,
    shared_kept: AtomicU64,
    kept_unshareable: AtomicU64,
    dropped: AtomicU64,
}

/// [`ImageMirror::status`].
#[derive(Clone, Debug, Serialize)]
pub struct MirrorStatus {
    /// Images fetched from the cluster, and their bytes.
    pub fetched: u64,
    pub fetched_bytes: u64,
    /// Fetches refused: a shared copy that was corrupt, cut short or over
    /// this node's `max_image_bytes`.
    pub fetches_refused: u64,
    /// Images of this node's own store it shared.
    pub shared_kept: u64,
    /// Images of this node's own store it cannot share (they do not read
    /// back whole: corrupt or cut); they stay where they are for the
    /// operator, and are never shared.
    pub kept_unshareable: u64,
    /// Copies of images the cluster removed that it dropped.
    pub dropped: u64,
}

impl ImageMirror {
    pub fn new(shared: Arc<dyn SharedImages>) -> Arc<ImageMirror> {
        Arc::new(ImageMirror {
            shared,
            fetching: tokio::sync::Mutex::new(()),
            told: std::sync::Mutex::new(HashSet::new()),
            counts: Counts::default(),
        })
    }

    pub fn shared(&self) -> &Arc<dyn SharedImages> {
        &self.shared
    }

    /// What this node's mirror did since it started.
    pub fn status(&self) -> MirrorStatus {
        let c = &self.counts;
        MirrorStatus {
            fetched: c.fetched.load(Ordering::Relaxed),
            fetched_bytes: c.fetched_bytes.load(Ordering::Relaxed),
            fetches_refused: c.fetches_refused.load(Ordering::Relaxed),
            shared_kept: c.shared_kept.load(Ordering::Relaxed),
            kept_unshareable: c.kept_unshareable.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
        }
    }

    /// Makes the image `digest` present in `store`, rooted for the caller
    /// (so nothing removes it before the caller loads it): at once when it
    /// is there, fetched from the cluster when it is not. True when it was
    /// fetched.
    pub async fn here(
        &self,
        store: &ImageStore,
        digest: Digest,
    ) -> Result<(Root, bool), ImageError> {
        if let Some(root) = stored(store, &digest)? {
            return Ok((root, false));
        }
        let _one = self.fetching.lock().await;
        if let Some(root) = stored(store, &digest)? {
            return Ok((root, false));
        }
        let fetched = self.fetch(store, digest).await;
        let c = &self.counts;
        match &fetched {
            Ok((_, size)) => {
                c.fetched.fetch_add(1, Ordering::Relaxed);
                c.fetched_bytes.fetch_add(*size, Ordering::Relaxed);
            }
            Err(ImageError::Corrupt { .. } | ImageError::TooLarge { .. }) => {
                c.fetches_refused.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {}
        }
        fetched.map(|(root, _)| (root, true))
    }

    /// Fetches the shared image `digest` into `store`: it, rooted, and its
    /// size.
    async fn fetch(&self, store: &ImageStore, digest: Digest) -> Result<(Root, u64), ImageError> {
        let size = self
            .shared
            .size(digest)
            .await?
            .ok_or(ImageError::NotFound(digest))?;
        if size > store.max_image_bytes() {
            return Err(ImageError::TooLarge {
                bytes: size,
                limit: store.max_image_bytes(),
            });
        }
        let started = std::time::Instant::now();
        let short = |written: u64| ImageError::Corrupt {
            digest,
            why: format!("the cluster's copy ends at byte {written} of its {size}"),
        };
        // The next piece comes while the last one is hashed and written
        // (on a blocking thread): at most two pieces in the host.
        let mut idle = Some(store.incoming(digest)?);
        let mut writing: Option<tokio::task::JoinHandle<Result<Incoming, ImageError>>> = None;
        let (mut fetched, mut index) = (0u64, 0u32);
        while fetched < size {
            let piece = match self.shared.piece(digest, index).await? {
                Some(piece) if !piece.is_empty() => piece,
                _ => return Err(short(fetched)),
            };
            fetched += piece.len() as u64;
            if fetched > size {
                return Err(ImageError::Corrupt {
                    digest,
                    why: format!("the cluster's copy is longer than its {size} bytes"),
                });
            }
            let mut incoming = match writing.take() {
                Some(written) => joined(store, written.await)?,
                None => idle.take().expect("one writer at a time"),
            };
            writing = Some(tokio::task::spawn_blocking(move || {
                incoming.write(&piece)?;
                Ok(incoming)
            }));
            index += 1;
        }
        let incoming = match writing.take() {
            Some(written) => joined(store, written.await)?,
            None => idle.take().expect("one writer at a time"),
        };
        let root = off_the_workers(store, move || Incoming::finish(incoming)).await?;
        tracing::info!(
            image = %digest,
            bytes = size,
            ms = started.elapsed().as_millis() as u64,
            "fetched an image the cluster shares"
        );
        Ok((root, size))
    }

    /// Catches up with the cluster every [`CATCH_UP_INTERVAL`] until the
    /// task is dropped ([`ImageMirror::catch_up`]), compiling what it
    /// fetched with `prepare`.
    pub async fn keep_up(self: Arc<Self>, store: ImageStore, prepare: Option<PrepareImage>) {
        loop {
            tokio::time::sleep(CATCH_UP_INTERVAL).await;
            let fetched = match self.catch_up(&store).await {
                Ok(fetched) => fetched,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot catch up with the cluster's images");
                    continue;
                }
            };
            for digest in fetched {
                let Some(prepare) = prepare.clone() else {
                    continue;
                };
                let compiled = tokio::task::spawn_blocking(move || prepare(&digest))
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()));
                if let Err(why) = compiled {
                    tracing::warn!(image = %digest, error = %why, "a fetched image does not compile");
                }
            }
        }
    }

    /// Brings `store` in step with the cluster: this node's copies of
    /// images the cluster removed go (once nothing runs them), its copies
    /// of images the cluster never had are shared, and what the cluster
    /// shares and `store` lacks is fetched: the ones it fetched. An image
    /// that cannot be fetched or shared is left for the next time (a turn
    /// that needs it names why).
    pub async fn catch_up(&self, store: &ImageStore) -> Result<Vec<Digest>, ImageError> {
        let catalog = self.shared.catalog().await?;
        let shared: HashSet<Digest> = catalog.shared.iter().map(|(d, _)| *d).collect();
        let listed = store.clone();
        let here = off_the_workers(store, move || listed.list()).await?;
        for image in here.iter().filter(|i| !shared.contains(&i.digest)) {
            let digest = image.digest;
            if !catalog.removed.contains(&digest) {
                let read = store.clone();
                let bytes = off_the_workers(store, move || {
                    let mut root = read.root(&digest)?;
                    read.read(&mut root)
                })
                .await;
                match bytes {
                    Ok(bytes) => {
                        if self.shared.publish(digest, &bytes, Sharer::Kept).await? {
                            self.counts.shared_kept.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(image = %digest, "shared an image this node kept");
                            continue;
                        }
                    }
                    Err(e) => {
                        if self.first_time(digest) {
                            self.counts.kept_unshareable.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(image = %digest, error = %e, "cannot share an image this node kept");
                        }
                        continue;
                    }
                }
            }
            match store.remove(&digest) {
                Ok(true) => {
                    self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(image = %digest, "dropped an image the cluster removed");
                }
                Ok(false) => {}
                // Dropped when nothing runs it any more.
                Err(ImageError::InUse(_)) => {}
                Err(e) => {
                    tracing::warn!(image = %digest, error = %e, "cannot drop an image the cluster removed")
                }
            }
        }
        let mut fetched = Vec::new();
        for digest in shared {
            match self.here(store, digest).await {
                Ok((_, true)) => fetched.push(digest),
                Ok((_, false)) => {}
                Err(e @ ImageError::Unavailable(_)) => return Err(e),
                Err(e) => {
                    if self.first_time(digest) {
                        tracing::warn!(image = %digest, error = %e, "cannot fetch a shared image");
                    }
                }
            }
        }
        Ok(fetched)
    }

    /// Whether the catch-up's trouble with `digest` is news (to be logged).
    fn first_time(&self, digest: Digest) -> bool {
        self.told
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest)
    }

    /// Sweeps `store`, sparing every image the cluster shares (removing
    /// nothing when the cluster cannot say which); `dry_run` as
    /// [`ImageStore::sweep`].
    pub async fn sweep(
        &self,
        store: &ImageStore,
        dry_run: bool,
    ) -> Result<SweepReport, ImageError> {
        let declared: HashSet<Digest> = self
            .shared
            .catalog()
            .await?
            .shared
            .into_iter()
            .map(|(digest, _)| digest)
            .collect();
        let swept = store.clone();
        off_the_workers(store, move || swept.sweep(&declared, dry_run)).await
    }
}

/// `digest`, rooted, if `store` holds it now.
fn stored(store: &ImageStore, digest: &Digest) -> Result<Option<Root>, ImageError> {
    match store.root(digest) {
        Ok(root) => Ok(Some(root)),
        Err(ImageError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What a blocking task on `store`'s files returned.
fn joined<T>(
    store: &ImageStore,
    done: Result<Result<T, ImageError>, tokio::task::JoinError>,
) -> Result<T, ImageError> {
    done.unwrap_or_else(|e| {
        Err(ImageError::Io {
            path: store.dir().to_path_buf(),
            cause: std::io::Error::other(e.to_string()),
        })
    })
}

/// Runs `f`, work on `store`'s files, on a blocking thread.
async fn off_the_workers<T: Send + 'static>(
    store: &ImageStore,
    f: impl FnOnce() -> Result<T, ImageError> + Send + 'static,
) -> Result<T, ImageError> {
    joined(store, tokio::task::spawn_blocking(f).await)
}
