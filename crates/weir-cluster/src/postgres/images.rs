//! The shared images on PostgreSQL: each image in pieces, one row each,
//! and a row naming the image that is written only once all its pieces
//! are there (a push cut short leaves pieces no fetch reads; the next push
//! of the same image completes them).

use super::{Postgres, classify, timed};
use crate::coordinator::CoordError;

impl Postgres {
    /// The size of the shared image `digest`, if it is shared.
    pub(crate) async fn image_size(&self, digest: &str) -> Result<Option<u64>, CoordError> {
        timed(async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT bytes FROM weir_images WHERE digest = $1",
                    &[&digest],
                )
                .await
                .map_err(classify)?;
            Ok(row.map(|r| r.get::<_, i64>(0).max(0) as u64))
        })
        .await
    }

    /// Writes piece `index` of the image `digest` (over what an earlier
    /// push cut short left there).
    pub(crate) async fn put_image_piece(
        &self,
        digest: &str,
        index: i32,
        data: &[u8],
    ) -> Result<(), CoordError> {
        timed(async {
            let client = self.client().await?;
            client
                .execute(
                    "INSERT INTO weir_image_pieces (digest, piece, data) VALUES ($1, $2, $3)
                     ON CONFLICT (digest, piece) DO UPDATE SET data = EXCLUDED.data",
                    &[&digest, &index, &data],
                )
                .await
                .map_err(classify)?;
            Ok(())
        })
        .await
    }

    /// Names the image `digest` of `bytes` in `pieces` pieces as shared,
    /// if all of them are there (pieces past them, from a push of other
    /// pieces' size, go): false when some were removed meanwhile.
    pub(crate) async fn seal_image(
        &self,
        digest: &str,
        bytes: u64,
        pieces: i32,
    ) -> Result<bool, CoordError> {
        timed(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(classify)?;
            tx.execute(
                "DELETE FROM weir_image_pieces WHERE digest = $1 AND piece >= $2",
                &[&digest, &pieces],
            )
            .await
            .map_err(classify)?;
            let sealed = tx
                .execute(
                    "INSERT INTO weir_images (digest, bytes)
                     SELECT $1, $2
                     WHERE (SELECT count(*) FROM weir_image_pieces WHERE digest = $1) = $3
                     ON CONFLICT (digest) DO NOTHING",
                    &[&digest, &(bytes as i64), &(pieces as i64)],
                )
                .await
                .map_err(classify)?;
            let shared = sealed == 1
                || tx
                    .query_opt("SELECT 1 FROM weir_images WHERE digest = $1", &[&digest])
                    .await
                    .map_err(classify)?
                    .is_some();
            tx.commit().await.map_err(classify)?;
            Ok(shared)
        })
        .await
    }

    /// Piece `index` of the image `digest`.
    pub(crate) async fn image_piece(
        &self,
        digest: &str,
        index: i32,
    ) -> Result<Option<Vec<u8>>, CoordError> {
        timed(async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT data FROM weir_image_pieces WHERE digest = $1 AND piece = $2",
                    &[&digest, &index],
                )
                .await
                .map_err(classify)?;
            Ok(row.map(|r| r.get(0)))
        })
        .await
    }

    /// Every shared image and its size, by digest.
    pub(crate) async fn images(&self) -> Result<Vec<(String, u64)>, CoordError> {
        timed(async {
            let client = self.client().await?;
            let rows = client
                .query("SELECT digest, bytes FROM weir_images ORDER BY digest", &[])
                .await
                .map_err(classify)?;
            Ok(rows
                .iter()
                .map(|r| (r.get(0), r.get::<_, i64>(1).max(0) as u64))
                .collect())
        })
        .await
    }

    /// Stops sharing the image `digest`, its pieces with it: true if it
    /// was shared.
    pub(crate) async fn remove_image(&self, digest: &str) -> Result<bool, CoordError> {
        timed(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(classify)?;
            let removed = tx
                .execute("DELETE FROM weir_images WHERE digest = $1", &[&digest])
                .await
                .map_err(classify)?;
            tx.execute(
                "DELETE FROM weir_image_pieces WHERE digest = $1",
                &[&digest],
            )
            .await
            .map_err(classify)?;
            tx.commit().await.map_err(classify)?;
            Ok(removed == 1)
        })
        .await
    }
}
