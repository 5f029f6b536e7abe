//! The operators' steps on PostgreSQL: an object's deletion, fenced like
//! a commit and whole (its row, log and snapshots in one transaction), the
//! listing of the objects with history, and which of some keys still have
//! history (a node's stale copies, found at start).

use super::{LIVE, Postgres, classify, timed};
use crate::coordinator::{CoordError, Deleted, Fence, Listed};

impl Postgres {
    pub(super) async fn delete_object(&self, fence: Fence) -> Result<Deleted, CoordError> {
        timed(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(classify)?;
            // The row first: its lock waits for any commit or snapshot that
            // holds it, so the statements after it see what they wrote,
            // and any that comes later finds no row and writes nothing.
            let head = tx
                .query_opt(
                    &format!(
                        "DELETE FROM weir_objects o
                         WHERE o.id = $1 AND o.owner = $2 AND o.epoch = $3 AND {LIVE}
                         RETURNING o.head"
                    ),
                    &[&fence.object, &fence.session, &fence.epoch],
                )
                .await
                .map_err(classify)?
                .map(|row| row.get::<_, i64>(0) as u64);
            let Some(head) = head else {
                let there = tx
                    .query_opt("SELECT 1 FROM weir_objects WHERE id = $1", &[&fence.object])
                    .await
                    .map_err(classify)?;
                return Ok(if there.is_some() {
                    Deleted::Fenced
                } else {
                    Deleted::Gone
                });
            };
            tx.execute("DELETE FROM weir_log WHERE object = $1", &[&fence.object])
                .await
                .map_err(classify)?;
            tx.execute(
                "DELETE FROM weir_snapshots WHERE object = $1",
                &[&fence.object],
            )
            .await
            .map_err(classify)?;
            tx.commit().await.map_err(classify)?;
            Ok(Deleted::Deleted { head })
        })
        .await
    }

    pub(super) async fn list_objects(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, CoordError> {
        // `left(…) = $1`, not `LIKE`: a prefix's `_` and `%` are its own.
        // A page after a key walks the key's index from there: two
        // statements rather than one with `$3 IS NULL OR …`, which a
        // generic plan could not walk by.
        const FIRST: &str = "SELECT o.key, o.alarm_at, n.name FROM weir_objects o
             LEFT JOIN weir_nodes n ON n.session = o.owner AND n.expires_at > now()
             WHERE left(o.key, length($1)) = $1 AND o.head > 0
             ORDER BY o.key LIMIT $2";
        const AFTER: &str = "SELECT o.key, o.alarm_at, n.name FROM weir_objects o
             LEFT JOIN weir_nodes n ON n.session = o.owner AND n.expires_at > now()
             WHERE left(o.key, length($1)) = $1 AND o.head > 0 AND o.key > $3
             ORDER BY o.key LIMIT $2";
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        timed(async {
            let client = self.client().await?;
            let rows = match after {
                None => client.query(FIRST, &[&prefix, &limit]).await,
                Some(after) => {
                    let from = format!("{prefix}{after}");
                    client.query(AFTER, &[&prefix, &limit, &from]).await
                }
            }
            .map_err(classify)?;
            Ok(rows
                .iter()
                .map(|row| Listed {
                    key: row.get(0),
                    alarm_at: row.get(1),
                    owner: row.get(2),
                })
                .collect())
        })
        .await
    }

    pub(super) async fn keys_with_history(
        &self,
        keys: &[String],
    ) -> Result<Vec<String>, CoordError> {
        timed(async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT key FROM weir_objects WHERE key = ANY($1) AND head > 0",
                    &[&keys],
                )
                .await
                .map_err(classify)?;
            Ok(rows.iter().map(|row| row.get(0)).collect())
        })
        .await
    }
}
