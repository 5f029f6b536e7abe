//! The coordinator on PostgreSQL: each protocol step is one statement (or
//! one transaction), so PostgreSQL's own atomicity and row locks make it
//! atomic, and PostgreSQL's clock (`now()`) is the one that decides when a
//! lease has expired.
//!
//! The connections, and the bounds on every statement, are `connection`'s;
//! the tables and their creation `schema`'s; the operators' steps
//! (deletion, listing) `operators`'; the shared images' `images`'.

use async_trait::async_trait;

mod connection;
mod images;
mod operators;
mod password;
mod schema;

pub use connection::{
    CALL_TIMEOUT, CONNECT_TIMEOUT, LEASE_POOL_SIZE, POOL_SIZE, STATEMENT_TIMEOUT, has_password,
    redacted,
};
use connection::{Connections, classify, timed};
pub use schema::SCHEMA_PATIENCE;

use crate::coordinator::{
    Claimed, CoordError, Coordinator, Deleted, DueObject, Fence, History, Listed, NodeInfo,
    ObjectState, Owner, Registration, Renewal, SessionId, ShipBatch,
};

/// `session`'s lease is live, by PostgreSQL's clock.
const LIVE: &str =
    "EXISTS (SELECT 1 FROM weir_nodes n WHERE n.session = $2 AND n.expires_at > now())";

/// The coordinator on one PostgreSQL database.
pub struct Postgres {
    connections: Connections,
}

fn state(row: &tokio_postgres::Row, at: usize) -> ObjectState {
    ObjectState {
        id: row.get(at),
        epoch: row.get(at + 1),
        head: row.get::<_, i64>(at + 2) as u64,
        checksum: row.get::<_, i64>(at + 3) as u64,
        log_bytes: row.get::<_, i64>(at + 4).max(0) as u64,
    }
}

impl Postgres {
    async fn nodes(client: &deadpool_postgres::Object) -> Result<Vec<NodeInfo>, CoordError> {
        let stmt = client
            .prepare_cached(
                "SELECT session, name, address FROM weir_nodes WHERE expires_at > now() ORDER BY session",
            )
            .await
            .map_err(classify)?;
        Ok(client
            .query(&stmt, &[])
            .await
            .map_err(classify)?
            .iter()
            .map(|r| NodeInfo {
                session: r.get(0),
                name: r.get(1),
                address: r.get(2),
            })
            .collect())
    }
}

fn ttl(ttl_ms: u64) -> f64 {
    ttl_ms as f64 / 1000.0
}

#[async_trait]
impl Coordinator for Postgres {
    async fn register(
        &self,
        name: &str,
        address: &str,
        ttl_ms: u64,
    ) -> Result<Registration, CoordError> {
        timed(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(classify)?;
            // One registration of a name at a time.
            tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&name])
                .await
                .map_err(classify)?;
            let live = tx
                .query_opt(
                    "SELECT session FROM weir_nodes WHERE name = $1 AND expires_at > now()",
                    &[&name],
                )
                .await
                .map_err(classify)?;
            if live.is_some() {
                return Ok(Registration::NameInUse);
            }
            // Expired sessions of this name own nothing anyone waits for.
            tx.execute(
                "DELETE FROM weir_nodes WHERE name = $1 AND expires_at <= now()
                   AND NOT EXISTS (SELECT 1 FROM weir_objects o WHERE o.owner = weir_nodes.session)",
                &[&name],
            )
            .await
            .map_err(classify)?;
            let row = tx
                .query_one(
                    "INSERT INTO weir_nodes (name, address, expires_at)
                     VALUES ($1, $2, now() + make_interval(secs => $3)) RETURNING session",
                    &[&name, &address, &ttl(ttl_ms)],
                )
                .await
                .map_err(classify)?;
            tx.commit().await.map_err(classify)?;
            let nodes = Postgres::nodes(&client).await?;
            Ok(Registration::Registered {
                session: row.get(0),
                nodes,
            })
        })
        .await
    }

    async fn renew(&self, session: SessionId, ttl_ms: u64) -> Result<Renewal, CoordError> {
        timed(async {
            let client = self.client().await?;
            let stmt = client
                // Judged by the clock as it is when the row is reached,
                // not when the statement began: a renewal that waited for
                // the row past the lease's expiry finds it expired (and
                // leaves it so), whatever the node then makes of it.
                .prepare_cached(
                    "UPDATE weir_nodes SET expires_at = clock_timestamp() + make_interval(secs => $2)
                     WHERE session = $1 AND expires_at > clock_timestamp() RETURNING session",
                )
                .await
                .map_err(classify)?;
            let renewed = client
                .query_opt(&stmt, &[&session, &ttl(ttl_ms)])
                .await
                .map_err(classify)?;
            if renewed.is_none() {
                return Ok(Renewal::Expired);
            }
            Ok(Renewal::Renewed(Postgres::nodes(&client).await?))
        })
        .await
    }

    async fn release(&self, session: SessionId) -> Result<(), CoordError> {
        timed(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(classify)?;
            tx.execute(
                "UPDATE weir_objects SET owner = NULL WHERE owner = $1",
                &[&session],
            )
            .await
            .map_err(classify)?;
            tx.execute("DELETE FROM weir_nodes WHERE session = $1", &[&session])
                .await
                .map_err(classify)?;
            tx.commit().await.map_err(classify)
        })
        .await
    }

    async fn left(&self, address: &str) -> Result<bool, CoordError> {
        timed(async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached("SELECT NOT EXISTS (SELECT 1 FROM weir_nodes WHERE address = $1)")
                .await
                .map_err(classify)?;
            let row = client
                .query_one(&stmt, &[&address])
                .await
                .map_err(classify)?;
            Ok(row.get(0))
        })
        .await
    }

    async fn lookup(&self, key: &str, session: SessionId) -> Result<Owner, CoordError> {
        timed(async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(
                    "SELECT o.id, o.epoch, o.head, o.checksum, o.log_bytes, o.owner, n.address,
                            COALESCE(n.expires_at > now(), false)
                     FROM weir_objects o LEFT JOIN weir_nodes n ON n.session = o.owner
                     WHERE o.key = $1",
                )
                .await
                .map_err(classify)?;
            let Some(row) = client.query_opt(&stmt, &[&key]).await.map_err(classify)? else {
                return Ok(Owner::Nobody);
            };
            let owner: Option<i64> = row.get(5);
            let live: bool = row.get(7);
            Ok(match owner {
                Some(owner) if live && owner == session => Owner::Me(state(&row, 0)),
                Some(owner) if live => Owner::Other {
                    session: owner,
                    address: row.get(6),
                },
                _ => Owner::Nobody,
            })
        })
        .await
    }

    async fn claim(
        &self,
        key: &str,
        session: SessionId,
        empty_checksum: u64,
    ) -> Result<Claimed, CoordError> {
        let claimed = timed(async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(&format!(
                    "INSERT INTO weir_objects (key, owner, epoch, head, checksum)
                     SELECT $1, $2, 1, 0, $3 WHERE {LIVE}
                     ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, epoch = weir_objects.epoch + 1
                     WHERE weir_objects.owner IS NULL OR NOT EXISTS (
                         SELECT 1 FROM weir_nodes n
                         WHERE n.session = weir_objects.owner AND n.expires_at > now())
                     RETURNING id, epoch, head, checksum, log_bytes"
                ))
                .await
                .map_err(classify)?;
            Ok(client
                .query_opt(&stmt, &[&key, &session, &(empty_checksum as i64)])
                .await
                .map_err(classify)?
                .map(|row| state(&row, 0)))
        })
        .await?;
        if let Some(state) = claimed {
            return Ok(Claimed::Owned(state));
        }
        // Not claimed: somebody live owns it (this session, perhaps), or
        // this session's lease is not live.
        Ok(match self.lookup(key, session).await? {
            Owner::Me(state) => Claimed::Owned(state),
            Owner::Other { session, address } => Claimed::Other { session, address },
            Owner::Nobody => Claimed::LeaseLost,
        })
    }

    async fn commit_many(&self, all: &[ShipBatch]) -> Result<Vec<bool>, CoordError> {
        let batches: Vec<&ShipBatch> = all.iter().filter(|b| !b.entries.is_empty()).collect();
        if batches.is_empty() {
            return Ok(vec![true; all.len()]);
        }
        // Per object: its fence (each batch under the session it was
        // shipped under: two sessions never share one), where it was,
        // where it goes.
        let mut objects = Vec::with_capacity(batches.len());
        let mut sessions = Vec::with_capacity(batches.len());
        let mut epochs = Vec::with_capacity(batches.len());
        let mut previous = Vec::with_capacity(batches.len());
        let mut heads = Vec::with_capacity(batches.len());
        let mut checksums = Vec::with_capacity(batches.len());
        let mut alarms = Vec::with_capacity(batches.len());
        let mut journaled = Vec::with_capacity(batches.len());
        let mut bytes = Vec::with_capacity(batches.len());
        // Per entry.
        let mut entry_objects = Vec::new();
        let mut entry_heads = Vec::new();
        let mut entry_ltx: Vec<&[u8]> = Vec::new();
        for b in &batches {
            let last = b.entries.last().expect("not empty");
            objects.push(b.fence.object);
            sessions.push(b.fence.session);
            epochs.push(b.fence.epoch);
            previous.push(b.previous as i64);
            heads.push(last.head as i64);
            checksums.push(last.checksum as i64);
            alarms.push(b.mirror.alarm);
            journaled.push(b.mirror.journaled);
            bytes.push(b.entries.iter().map(|e| e.ltx.len() as i64).sum::<i64>());
            for e in &b.entries {
                entry_objects.push(b.fence.object);
                entry_heads.push(e.head as i64);
                entry_ltx.push(&e.ltx);
            }
        }
        let kept: Vec<i64> = timed(async {
            let client = self.client().await?;
            // One statement, so one round trip and one transaction: each
            // object's fence moves its head only if it still holds, and
            // its entries are written only where it moved.
            let stmt = client
                .prepare_cached(
                    "WITH input AS (
                        SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[],
                                             $5::bigint[], $6::bigint[], $7::bigint[], $12::boolean[],
                                             $8::bigint[])
                            AS i(object, epoch, previous, head, checksum, alarm, bytes, journaled, session)
                     ), fence AS (
                        UPDATE weir_objects o
                        SET head = i.head, checksum = i.checksum, alarm_at = i.alarm,
                            journaled = i.journaled,
                            log_bytes = o.log_bytes + i.bytes
                        FROM input i
                        -- `= ANY` lets the plan reach each row by its key,
                        -- whatever the planner guesses of `input`'s size.
                        WHERE o.id = ANY($1::bigint[]) AND o.id = i.object
                          AND o.owner = i.session AND o.epoch = i.epoch
                          AND o.head = i.previous
                          AND EXISTS (SELECT 1 FROM weir_nodes n WHERE n.session = i.session AND n.expires_at > now())
                        RETURNING o.id
                     ), logged AS (
                        INSERT INTO weir_log (object, head, ltx)
                        SELECT e.object, e.head, e.ltx
                        FROM unnest($9::bigint[], $10::bigint[], $11::bytea[]) AS e(object, head, ltx)
                        WHERE e.object IN (SELECT id FROM fence)
                        RETURNING 1
                     )
                     SELECT coalesce(array_agg(id), '{}') FROM fence",
                )
                .await
                .map_err(classify)?;
            let row = client
                .query_one(
                    &stmt,
                    &[
                        &objects,
                        &epochs,
                        &previous,
                        &heads,
                        &checksums,
                        &alarms,
                        &bytes,
                        &sessions,
                        &entry_objects,
                        &entry_heads,
                        &entry_ltx,
                        &journaled,
                    ],
                )
                .await
                .map_err(classify)?;
            Ok(row.get(0))
        })
        .await?;
        // An empty batch moves nothing and is kept as it is.
        Ok(all
            .iter()
            .map(|b| b.entries.is_empty() || kept.contains(&b.fence.object))
            .collect())
    }

    async fn snapshot(&self, fence: Fence, head: u64, ltx: &[u8]) -> Result<bool, CoordError> {
        timed(async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(&format!(
                    "WITH fence AS (
                        UPDATE weir_objects o SET log_bytes = 0
                        WHERE o.id = $1 AND o.owner = $2 AND o.epoch = $3 AND o.head >= $4 AND {LIVE}
                        RETURNING o.id
                     ), stored AS (
                        INSERT INTO weir_snapshots (object, head, ltx)
                        SELECT id, $4, $5 FROM fence ON CONFLICT DO NOTHING RETURNING 1
                     )
                     SELECT count(*) FROM fence"
                ))
                .await
                .map_err(classify)?;
            let row = client
                .query_one(
                    &stmt,
                    &[&fence.object, &fence.session, &fence.epoch, &(head as i64), &ltx],
                )
                .await
                .map_err(classify)?;
            let stored = row.get::<_, i64>(0) == 1;
            if stored {
                // What the snapshot makes redundant goes in a transaction
                // of its own, outside the owner row's lock and off the
                // shipper's way (its next commit does not wait for it):
                // history up to a stored snapshot never changes, and
                // commits meanwhile write only later heads.
                let connections = self.connections.clone();
                let (object, head) = (fence.object, head as i64);
                tokio::spawn(async move {
                    let dropped = timed(async {
                        let client = connections.get().await?;
                        client
                            .execute(
                                "WITH old_log AS (DELETE FROM weir_log WHERE object = $1 AND head <= $2)
                                 DELETE FROM weir_snapshots WHERE object = $1 AND head < $2",
                                &[&object, &head],
                            )
                            .await
                            .map_err(classify)
                    })
                    .await;
                    if let Err(e) = dropped {
                        tracing::warn!(error = %e, "cannot drop a log a snapshot made redundant; the next snapshot will");
                    }
                });
            }
            Ok(stored)
        })
        .await
    }

    async fn delete(&self, fence: Fence) -> Result<Deleted, CoordError> {
        self.delete_object(fence).await
    }

    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, CoordError> {
        self.list_objects(prefix, after, limit).await
    }

    async fn with_history(&self, keys: &[String]) -> Result<Vec<String>, CoordError> {
        self.keys_with_history(keys).await
    }

    async fn history(&self, id: i64, head: u64) -> Result<History, CoordError> {
        timed(async {
            let mut client = self.client().await?;
            // One snapshot of the database for both reads: a compaction in
            // between cannot take the log from under the snapshot read.
            let tx = client
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(classify)?;
            let head = head as i64;
            let snapshot = tx
                .query_opt(
                    "SELECT head, ltx FROM weir_snapshots WHERE object = $1 AND head <= $2
                     ORDER BY head DESC LIMIT 1",
                    &[&id, &head],
                )
                .await
                .map_err(classify)?
                .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, Vec<u8>>(1)));
            let from = snapshot.as_ref().map_or(0, |(h, _)| *h as i64);
            let log = tx
                .query(
                    "SELECT head, ltx FROM weir_log WHERE object = $1 AND head > $2 AND head <= $3
                     ORDER BY head",
                    &[&id, &from, &head],
                )
                .await
                .map_err(classify)?
                .iter()
                .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, Vec<u8>>(1)))
                .collect();
            tx.commit().await.map_err(classify)?;
            Ok(History { snapshot, log })
        })
        .await
    }

    async fn claim_due(
        &self,
        session: SessionId,
        limit: i64,
    ) -> Result<Vec<DueObject>, CoordError> {
        timed(async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(&format!(
                    "WITH due AS (
                        SELECT o.id FROM weir_objects o
                        WHERE o.alarm_at <= (extract(epoch from now()) * 1000)::bigint
                          AND o.key LIKE 'actor/%'
                          AND (o.owner IS NULL OR o.owner = $2 OR NOT EXISTS (
                              SELECT 1 FROM weir_nodes n WHERE n.session = o.owner AND n.expires_at > now()))
                          AND {LIVE}
                        ORDER BY o.alarm_at
                        LIMIT $1
                        FOR UPDATE SKIP LOCKED
                     ), orphaned AS (
                        -- Owners of resident processes nobody holds: due
                        -- at once, whatever their alarm.
                        SELECT o.id FROM weir_objects o
                        WHERE o.journaled
                          AND o.key LIKE 'actor/%'
                          AND (o.owner IS NULL OR (o.owner <> $2 AND NOT EXISTS (
                              SELECT 1 FROM weir_nodes n WHERE n.session = o.owner AND n.expires_at > now())))
                          AND {LIVE}
                        LIMIT $1
                        FOR UPDATE SKIP LOCKED
                     )
                     UPDATE weir_objects o SET owner = $2,
                         epoch = CASE WHEN o.owner = $2 THEN o.epoch ELSE o.epoch + 1 END
                     WHERE o.id IN (SELECT id FROM due UNION SELECT id FROM orphaned)
                     RETURNING o.id, o.epoch, o.head, o.checksum, o.log_bytes, o.key, o.alarm_at,
                         o.journaled"
                ))
                .await
                .map_err(classify)?;
            Ok(client
                .query(&stmt, &[&limit, &session])
                .await
                .map_err(classify)?
                .iter()
                .map(|row| DueObject {
                    state: state(row, 0),
                    key: row.get(5),
                    alarm_at: row.get(6),
                    journaled: row.get(7),
                })
                .collect())
        })
        .await
    }
}
