//! The cluster's tables (`nodes`, `stream_leases`) for the SQL metadata store. Every
//! lease decision compares times by the database's clock, never by a node's, so nodes
//! with skewed clocks still agree on whose lease has run out.

use sqlx::Row;

use super::{db, from_ms, stream_from_row, Dialect, SqlMetadataStore, STREAM_COLUMNS};
use crate::error::{Error, Result};
use crate::storage::cluster::{
    LiveNode, NodeRecord, OrphanedStream, StreamChange, StreamClaim, StreamLog, StreamOwner,
};

/// `log_epoch` of a stream written before clusters (see `StreamLog::Legacy`).
pub(super) const LEGACY_LOG: i64 = -1;

/// Streams whose leases one statement gives up.
const RELEASES_PER_STATEMENT: usize = 500;

impl Dialect {
    /// The database's clock, in ms since the Unix epoch, as an SQL expression.
    pub(super) fn now_ms(self) -> &'static str {
        match self {
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
            Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        }
    }
}

/// The columns of `streams` qualified by the alias `s`.
fn stream_columns_of_s() -> String {
    STREAM_COLUMNS
        .split(", ")
        .map(|c| format!("s.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl SqlMetadataStore {
    fn sql(&self, template: &str) -> String {
        template.replace("{now}", self.dialect.now_ms())
    }

    pub(super) async fn cluster_join(
        &self,
        epoch: u64,
        identity: &str,
        advertise_url: &str,
        lease_ms: u64,
    ) -> Result<()> {
        let mut tx = self.write_transaction().await?;
        sqlx::query("UPDATE nodes SET lease_expires_ms = 0 WHERE identity = $1 AND epoch < $2")
            .bind(identity)
            .bind(epoch as i64)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query(&self.sql(
            "INSERT INTO nodes (epoch, identity, advertise_url, started_at_ms, heartbeat_at_ms, lease_expires_ms, leases_lost, ready) \
             VALUES ($1, $2, $3, {now}, {now}, {now} + $4, 0, 0)",
        ))
        .bind(epoch as i64)
        .bind(identity)
        .bind(advertise_url)
        .bind(lease_ms as i64)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)
    }

    pub(super) async fn cluster_renew(
        &self,
        epoch: u64,
        lease_ms: u64,
        ready: bool,
    ) -> Result<bool> {
        let renewed = sqlx::query(&self.sql(
            "UPDATE nodes SET lease_expires_ms = {now} + $2, heartbeat_at_ms = {now}, ready = $3 \
             WHERE epoch = $1 AND leases_lost = 0 AND lease_expires_ms <> 0",
        ))
        .bind(epoch as i64)
        .bind(lease_ms as i64)
        .bind(i64::from(ready))
        .execute(&self.lease_pool)
        .await
        .map_err(db)?;
        Ok(renewed.rows_affected() == 1)
    }

    pub(super) async fn cluster_leave(&self, epoch: u64) -> Result<()> {
        sqlx::query("UPDATE nodes SET lease_expires_ms = 0 WHERE epoch = $1")
            .bind(epoch as i64)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    pub(super) async fn cluster_begin_leaving(&self, epoch: u64) -> Result<()> {
        let mut tx = self.write_transaction().await?;
        self.check_intact(&mut tx, epoch).await?;
        sqlx::query("UPDATE nodes SET leaving = 1 WHERE epoch = $1")
            .bind(epoch as i64)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)
    }

    pub(super) async fn cluster_release(
        &self,
        epoch: u64,
        stream_ids: &[u64],
        to: Option<u64>,
    ) -> Result<u64> {
        let mut tx = self.write_transaction().await?;
        self.check_intact(&mut tx, epoch).await?;
        if let Some(to) = to {
            // Read in the same transaction that hands the leases over: a node that left
            // or lapsed meanwhile gets none (they would wait out its lease), nor one
            // still starting (it would not answer for them until it serves).
            let target: Option<i64> = sqlx::query_scalar(&self.sql(
                "SELECT epoch FROM nodes WHERE epoch = $1 AND lease_expires_ms > {now} \
                 AND leaving = 0 AND leases_lost = 0 AND ready = 1",
            ))
            .bind(to as i64)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
            if target.is_none() {
                return Ok(0);
            }
        }
        let new_owner = to.unwrap_or(0) as i64;
        let mut released = 0;
        for ids in stream_ids.chunks(RELEASES_PER_STATEMENT) {
            // Numbers this node formats itself, so they can go in the text.
            let list = ids
                .iter()
                .map(|id| (*id as i64).to_string())
                .collect::<Vec<_>>()
                .join(", ");
            let done = sqlx::query(&format!(
                "UPDATE stream_leases SET owner = $2 WHERE owner = $1 AND stream_id IN ({list})"
            ))
            .bind(epoch as i64)
            .bind(new_owner)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            released += done.rows_affected();
        }
        tx.commit().await.map_err(db)?;
        Ok(released)
    }

    pub(super) async fn cluster_owned(&self, epoch: u64) -> Result<Vec<u64>> {
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT l.stream_id FROM stream_leases l JOIN streams s ON s.id = l.stream_id \
             WHERE l.owner = $1 AND s.deleted_at_ms IS NULL ORDER BY l.stream_id",
        )
        .bind(epoch as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        Ok(ids.into_iter().map(|id| id as u64).collect())
    }

    pub(super) async fn cluster_nodes(&self) -> Result<Vec<NodeRecord>> {
        let rows = sqlx::query(&self.sql(
            "SELECT n.epoch, n.identity, n.advertise_url, n.started_at_ms, \
             {now} - n.heartbeat_at_ms AS heartbeat_age_ms, \
             CASE WHEN n.lease_expires_ms > {now} THEN 1 ELSE 0 END AS live, n.leaving, n.ready, \
             (SELECT COUNT(*) FROM stream_leases l WHERE l.owner = n.epoch) AS owned \
             FROM nodes n ORDER BY n.epoch",
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        Ok(rows
            .iter()
            .map(|row| NodeRecord {
                epoch: row.get::<i64, _>("epoch") as u64,
                identity: row.get("identity"),
                advertise_url: row.get("advertise_url"),
                started_at: from_ms(row.get("started_at_ms")),
                heartbeat_age_ms: row.get::<i64, _>("heartbeat_age_ms").max(0) as u64,
                live: row.get::<i64, _>("live") == 1,
                leaving: row.get::<i64, _>("leaving") != 0,
                ready: row.get::<i64, _>("ready") != 0,
                streams_owned: row.get::<i64, _>("owned") as u64,
            })
            .collect())
    }

    pub(super) async fn cluster_live_nodes(&self) -> Result<Vec<LiveNode>> {
        let rows: Vec<(i64, String, i64)> = sqlx::query_as(&self.sql(
            "SELECT epoch, advertise_url, ready FROM nodes \
             WHERE lease_expires_ms > {now} AND leaving = 0 ORDER BY epoch",
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        Ok(rows
            .into_iter()
            .map(|(epoch, advertise_url, ready)| LiveNode {
                epoch: epoch as u64,
                advertise_url,
                ready: ready != 0,
            })
            .collect())
    }

    pub(super) async fn cluster_stream_owner(&self, stream_id: u64) -> Result<StreamOwner> {
        let row = sqlx::query(&self.sql(
            "SELECT l.owner, n.advertise_url, \
             CASE WHEN n.lease_expires_ms > {now} THEN 1 ELSE 0 END AS live \
             FROM stream_leases l LEFT JOIN nodes n ON n.epoch = l.owner WHERE l.stream_id = $1",
        ))
        .bind(stream_id as i64)
        .fetch_optional(&self.pool)
        .await
        .map_err(db)?;
        let Some(row) = row else {
            return Ok(StreamOwner::Nobody);
        };
        let owner = row.get::<i64, _>("owner") as u64;
        let live = row.get::<Option<i64>, _>("live") == Some(1);
        Ok(match (owner, live) {
            (0, _) => StreamOwner::Nobody,
            (epoch, true) => StreamOwner::Live {
                epoch,
                advertise_url: row.get("advertise_url"),
            },
            (epoch, false) => StreamOwner::Lapsed { epoch },
        })
    }

    /// Fails unless node `epoch` is known, has not left (nor been retired by a later run
    /// of itself), and none of its leases were taken.
    pub(super) async fn check_intact(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        epoch: u64,
    ) -> Result<()> {
        let state: Option<(i64, i64)> =
            sqlx::query_as("SELECT leases_lost, lease_expires_ms FROM nodes WHERE epoch = $1")
                .bind(epoch as i64)
                .fetch_optional(&mut **tx)
                .await
                .map_err(db)?;
        match state {
            Some((0, expires)) if expires != 0 => Ok(()),
            _ => Err(Error::LeaseLost),
        }
    }

    pub(super) async fn cluster_claim(
        &self,
        epoch: u64,
        stream_ids: &[u64],
    ) -> Result<Vec<StreamClaim>> {
        let mut tx = self.write_transaction().await?;
        self.check_intact(&mut tx, epoch).await?;
        let select = self.sql(&format!(
            "SELECT {}, l.owner, l.lease_epoch, l.log_epoch, \
             CASE WHEN n.lease_expires_ms > {{now}} THEN 1 ELSE 0 END AS owner_live \
             FROM streams s JOIN stream_leases l ON l.stream_id = s.id \
             LEFT JOIN nodes n ON n.epoch = l.owner \
             WHERE s.id = $1 AND s.deleted_at_ms IS NULL",
            stream_columns_of_s()
        ));
        // The owner's lease is checked again in the row lock that marks it lost, so
        // a renewal that slipped in since the select wins.
        let mark_lost = self.sql(
            "UPDATE nodes SET leases_lost = leases_lost + 1 \
             WHERE epoch = $1 AND lease_expires_ms <= {now}",
        );
        let mut claims = Vec::new();
        for id in stream_ids {
            let Some(row) = sqlx::query(&select)
                .bind(*id as i64)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?
            else {
                continue; // gone, or being deleted
            };
            let owner = row.get::<i64, _>("owner") as u64;
            let owner_live = row.get::<Option<i64>, _>("owner_live") == Some(1);
            // Already this node's, yet asked for again: the caller does not serve it, so
            // an earlier takeover of it failed part way. It is claimed again (a new lease
            // epoch), and rebuilt from the log the stream's records are still in.
            if owner != 0 && owner != epoch && owner_live {
                continue;
            }
            if owner != 0 && owner != epoch {
                let node_known: Option<i64> =
                    sqlx::query_scalar("SELECT epoch FROM nodes WHERE epoch = $1")
                        .bind(owner as i64)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db)?;
                if node_known.is_some() {
                    let marked = sqlx::query(&mark_lost)
                        .bind(owner as i64)
                        .execute(&mut *tx)
                        .await
                        .map_err(db)?;
                    if marked.rows_affected() == 0 {
                        continue; // it renewed just now
                    }
                }
            }
            let lease_epoch = row.get::<i64, _>("lease_epoch") + 1;
            sqlx::query(
                "UPDATE stream_leases SET owner = $2, lease_epoch = $3 WHERE stream_id = $1",
            )
            .bind(*id as i64)
            .bind(epoch as i64)
            .bind(lease_epoch)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            claims.push(StreamClaim {
                stream: stream_from_row(&row)?,
                lease_epoch: lease_epoch as u64,
                log: StreamLog::from_column(row.get("log_epoch")),
            });
        }
        tx.commit().await.map_err(db)?;
        Ok(claims)
    }

    pub(super) async fn cluster_commit_takeover(
        &self,
        epoch: u64,
        claims: &[(u64, u64)],
    ) -> Result<()> {
        let mut tx = self.write_transaction().await?;
        self.check_intact(&mut tx, epoch).await?;
        for (id, lease_epoch) in claims {
            sqlx::query(
                "UPDATE stream_leases SET log_epoch = $2 \
                 WHERE stream_id = $1 AND owner = $2 AND lease_epoch = $3",
            )
            .bind(*id as i64)
            .bind(epoch as i64)
            .bind(*lease_epoch as i64)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        }
        tx.commit().await.map_err(db)
    }

    pub(super) async fn cluster_orphans(&self, limit: usize) -> Result<Vec<OrphanedStream>> {
        // The node that matters is the owner, or for a stream without one, the node
        // whose log has its records (it handed the stream over and left): once that
        // node is gone, the stream is taken even if nobody uses it, so the log can go.
        let rows = sqlx::query(&self.sql(&format!(
            "SELECT {}, n.identity, l.log_epoch FROM streams s \
             JOIN stream_leases l ON l.stream_id = s.id \
             LEFT JOIN nodes n ON n.epoch = CASE WHEN l.owner <> 0 THEN l.owner ELSE l.log_epoch END \
             WHERE s.deleted_at_ms IS NULL AND ( \
               ((l.owner <> 0 OR l.log_epoch > 0) AND (n.epoch IS NULL OR n.lease_expires_ms <= {{now}})) \
               OR (l.owner = 0 AND l.log_epoch = {LEGACY_LOG})) \
             ORDER BY s.id LIMIT $1",
            stream_columns_of_s()
        )))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter()
            .map(|row| {
                Ok(OrphanedStream {
                    stream: stream_from_row(row)?,
                    previous_identity: row.get("identity"),
                    legacy: row.get::<i64, _>("log_epoch") == LEGACY_LOG,
                })
            })
            .collect()
    }

    pub(super) async fn cluster_stream_changes(
        &self,
        epoch: u64,
        since_ms: i64,
    ) -> Result<(Vec<StreamChange>, i64)> {
        let now: i64 = sqlx::query_scalar(&self.sql("SELECT {now}"))
            .fetch_one(&self.pool)
            .await
            .map_err(db)?;
        let rows = sqlx::query(
            "SELECT s.id, s.config, s.deleted_at_ms FROM streams s \
             JOIN stream_leases l ON l.stream_id = s.id \
             WHERE l.owner = $1 AND s.changed_at_ms >= $2",
        )
        .bind(epoch as i64)
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        let changes = rows
            .iter()
            .map(|row| {
                Ok(StreamChange {
                    id: row.get::<i64, _>("id") as u64,
                    config: super::parse_json(row.get::<&str, _>("config"))?,
                    deleted: row.get::<Option<i64>, _>("deleted_at_ms").is_some(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((changes, now))
    }

    pub(super) async fn cluster_dead_logs(&self, dead_for_ms: u64) -> Result<Vec<u64>> {
        let rows: Vec<i64> = sqlx::query_scalar(&self.sql(
            "SELECT n.epoch FROM nodes n WHERE n.lease_expires_ms < {now} - $1 \
             AND NOT EXISTS (SELECT 1 FROM stream_leases l WHERE l.log_epoch = n.epoch) \
             ORDER BY n.epoch",
        ))
        .bind(dead_for_ms as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        Ok(rows.into_iter().map(|e| e as u64).collect())
    }

    pub(super) async fn cluster_legacy_logs_needed(&self) -> Result<bool> {
        let found: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT 1 FROM stream_leases WHERE log_epoch = {LEGACY_LOG} LIMIT 1"
        ))
        .fetch_optional(&self.pool)
        .await
        .map_err(db)?;
        Ok(found.is_some())
    }

    pub(super) async fn cluster_forget_node(&self, epoch: u64) -> Result<()> {
        let mut tx = self.write_transaction().await?;
        for table in ["nodes", "wal_watermarks"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE epoch = $1"))
                .bind(epoch as i64)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        tx.commit().await.map_err(db)
    }
}
