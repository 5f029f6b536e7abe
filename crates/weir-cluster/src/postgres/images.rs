//! The shared images on PostgreSQL: each image in pieces, one row each,
//! and a row naming the image that is written only once all its pieces
//! are there (a push cut short leaves pieces no fetch reads; the next push
//! of the same image completes them); a removed image leaves a row in
//! `weir_images_removed`, so that no node shares its own copy again. A
//! seal and a removal of one image take turns (an advisory lock).

use super::{Postgres, classify, timed};
use crate::coordinator::CoordError;

impl Postgres {
    /// The row `sql` finds, if any: one bounded statement.
    async fn row_of(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, CoordError> {
        timed(async {
            let client = self.client().await?;
            client.query_opt(sql, params).await.map_err(classify)
        })
        .await
    }

    /// The size of the shared image `digest`, if it is shared.
    pub(crate) async fn image_size(&self, digest: &str) -> Result<Option<u64>, CoordError> {
        let row = self
            .row_of(
                "SELECT bytes FROM weir_images WHERE digest = $1",
                &[&digest],
            )
            .await?;
        Ok(row.map(|r| r.get::<_, i64>(0).max(0) as u64))
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

    /// Whether the image `digest` was removed from the cluster.
    pub(crate) async fn image_removed(&self, digest: &str) -> Result<bool, CoordError> {
        let row = self
            .row_of(
                "SELECT 1 FROM weir_images_removed WHERE digest = $1",
                &[&digest],
            )
            .await?;
        Ok(row.is_some())
    }

    /// Names the image `digest` of `bytes` in `pieces` pieces as shared,
    /// if all of them are there (pieces past them, from a push of other
    /// pieces' size, go). `revive`: even if it was removed (its removal is
    /// forgotten); otherwise a removed image is not shared. False when it
    /// is not shared: removed, or its pieces removed meanwhile.
    pub(crate) async fn seal_image(
        &self,
        digest: &str,
        bytes: u64,
        pieces: i32,
        revive: bool,
    ) -> Result<bool, CoordError> {
        timed(async {
            let mut client = self.client().await?;
            let tx = image_transaction(&mut client, digest).await?;
            if revive {
                tx.execute(
                    "DELETE FROM weir_images_removed WHERE digest = $1",
                    &[&digest],
                )
                .await
                .map_err(classify)?;
            } else if tx
                .query_opt(
                    "SELECT 1 FROM weir_images_removed WHERE digest = $1",
                    &[&digest],
                )
                .await
                .map_err(classify)?
                .is_some()
            {
                return Ok(false);
            }
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
        let row = self
            .row_of(
                "SELECT data FROM weir_image_pieces WHERE digest = $1 AND piece = $2",
                &[&digest, &index],
            )
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Every shared image and its size, by digest, and every removed one.
    pub(crate) async fn images(&self) -> Result<(Vec<(String, u64)>, Vec<String>), CoordError> {
        timed(async {
            let client = self.client().await?;
            let shared = client
                .query("SELECT digest, bytes FROM weir_images ORDER BY digest", &[])
                .await
                .map_err(classify)?;
            let removed = client
                .query("SELECT digest FROM weir_images_removed", &[])
                .await
                .map_err(classify)?;
            Ok((
                shared
                    .iter()
                    .map(|r| (r.get(0), r.get::<_, i64>(1).max(0) as u64))
                    .collect(),
                removed.iter().map(|r| r.get(0)).collect(),
            ))
        })
        .await
    }

    /// Stops sharing the image `digest`, its pieces with it, and records
    /// its removal: true if it was shared.
    pub(crate) async fn remove_image(&self, digest: &str) -> Result<bool, CoordError> {
        timed(async {
            let mut client = self.client().await?;
            let tx = image_transaction(&mut client, digest).await?;
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
            tx.execute(
                "INSERT INTO weir_images_removed (digest) VALUES ($1)
                 ON CONFLICT (digest) DO UPDATE SET removed_at = now()",
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

/// A transaction holding the image `digest`'s lock: one seal or removal of
/// an image at a time.
async fn image_transaction<'a>(
    client: &'a mut deadpool_postgres::Object,
    digest: &str,
) -> Result<deadpool_postgres::Transaction<'a>, CoordError> {
    let tx = client.transaction().await.map_err(classify)?;
    tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&digest])
        .await
        .map_err(classify)?;
    Ok(tx)
}
