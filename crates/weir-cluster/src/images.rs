//! The images a cluster's nodes share, kept in its database (see
//! `weir_programs::shared_images` for what a node does with them).
//!
//! Invariant owned here: an image is shared only whole. Its pieces are
//! written first, each in its own bounded statement, and the row that
//! names it last, in a transaction that checks every piece is there; a
//! node never fetches an image whose row is missing. A push of an image
//! already shared writes its pieces again, so pushing mends a shared copy
//! that was damaged. A removal is recorded: a node shares a copy of its
//! own only while the cluster has not removed that image, and only an
//! operator's push shares it again.

use std::sync::Arc;

use weir_programs::image_store::{Digest, ImageError};
use weir_programs::shared_images::{BoxFuture, Catalog, IMAGE_PIECE_BYTES, SharedImages, Sharer};

use crate::coordinator::CoordError;
use crate::postgres::Postgres;

/// The cluster database's shared images.
pub struct ClusterImages {
    pub(crate) postgres: Arc<Postgres>,
}

fn unavailable(e: CoordError) -> ImageError {
    ImageError::Unavailable(e.to_string())
}

impl SharedImages for ClusterImages {
    fn publish<'a>(
        &'a self,
        digest: Digest,
        bytes: &'a [u8],
        by: Sharer,
    ) -> BoxFuture<'a, Result<bool, ImageError>> {
        Box::pin(async move {
            let name = digest.to_string();
            let revive = by == Sharer::Push;
            if !revive
                && self
                    .postgres
                    .image_removed(&name)
                    .await
                    .map_err(unavailable)?
            {
                return Ok(false);
            }
            // Every piece is written again, even of an image already
            // shared: pushing again is how a damaged shared copy (one a
            // fetch refused as corrupt) is mended.
            let mut pieces = 0;
            for (index, piece) in bytes.chunks(IMAGE_PIECE_BYTES).enumerate() {
                let index = i32::try_from(index).unwrap_or(i32::MAX);
                self.postgres
                    .put_image_piece(&name, index, piece)
                    .await
                    .map_err(unavailable)?;
                pieces = index + 1;
            }
            let sealed = self
                .postgres
                .seal_image(&name, bytes.len() as u64, pieces, revive)
                .await
                .map_err(unavailable)?;
            if !sealed && revive {
                return Err(ImageError::Unavailable(format!(
                    "{digest} was removed from the cluster while it was pushed; push it again"
                )));
            }
            Ok(sealed)
        })
    }

    fn size(&self, digest: Digest) -> BoxFuture<'_, Result<Option<u64>, ImageError>> {
        Box::pin(async move {
            self.postgres
                .image_size(&digest.to_string())
                .await
                .map_err(unavailable)
        })
    }

    fn piece(
        &self,
        digest: Digest,
        index: u32,
    ) -> BoxFuture<'_, Result<Option<Vec<u8>>, ImageError>> {
        Box::pin(async move {
            let Ok(index) = i32::try_from(index) else {
                return Ok(None);
            };
            self.postgres
                .image_piece(&digest.to_string(), index)
                .await
                .map_err(unavailable)
        })
    }

    fn catalog(&self) -> BoxFuture<'_, Result<Catalog, ImageError>> {
        Box::pin(async move {
            let (shared, removed) = self.postgres.images().await.map_err(unavailable)?;
            // Only this build's spelling names an image.
            Ok(Catalog {
                shared: shared
                    .into_iter()
                    .filter_map(|(digest, bytes)| Some((digest.parse().ok()?, bytes)))
                    .collect(),
                removed: removed.iter().filter_map(|d| d.parse().ok()).collect(),
            })
        })
    }

    fn remove(&self, digest: Digest) -> BoxFuture<'_, Result<bool, ImageError>> {
        Box::pin(async move {
            self.postgres
                .remove_image(&digest.to_string())
                .await
                .map_err(unavailable)
        })
    }
}
