//! The `usage` table for the SQL metadata store: counts are added to their bucket's row
//! in one upsert each, gauges overwrite theirs, many rows per statement.

use sqlx::Row;

use super::{column, db, SqlMetadataStore};
use crate::error::Result;
use crate::storage::usage::{Resolution, StoredBytes, UsagePoint, UsageQuery, UsageRow};

/// Rows per statement (7 parameters each, well inside SQLite's limit).
const ROWS_PER_STATEMENT: usize = 400;

impl SqlMetadataStore {
    pub(super) async fn usage_add(&self, counts: &[UsageRow], gauges: &[UsageRow]) -> Result<()> {
        if counts.is_empty() && gauges.is_empty() {
            return Ok(());
        }
        // One row per key and statement: PostgreSQL refuses an upsert that touches a
        // row twice (counts of two minutes of one hour, say), so rows that share a key
        // are merged first (counts added, the last gauge reading kept).
        let counts = merged(counts, |total, row| total + row.value);
        let gauges = merged(gauges, |_, row| row.value);
        let mut tx = self.pool.begin().await.map_err(db)?;
        for (rows, merge) in [
            (&counts, "value = usage.value + excluded.value"),
            (&gauges, "value = excluded.value"),
        ] {
            for chunk in rows.chunks(ROWS_PER_STATEMENT) {
                let values: Vec<String> = (0..chunk.len())
                    .map(|i| {
                        let p = i * 7;
                        format!(
                            "(${}, ${}, ${}, ${}, ${}, ${}, ${})",
                            p + 1,
                            p + 2,
                            p + 3,
                            p + 4,
                            p + 5,
                            p + 6,
                            p + 7
                        )
                    })
                    .collect();
                let sql = format!(
                    "INSERT INTO usage (bucket_secs, metric, basin, stream, series, bucket_start, value) \
                     VALUES {} ON CONFLICT (bucket_secs, metric, basin, stream, series, bucket_start) \
                     DO UPDATE SET {merge}",
                    values.join(", ")
                );
                let mut query = sqlx::query(&sql);
                for row in chunk {
                    query = query
                        .bind(row.resolution.secs() as i64)
                        .bind(row.metric)
                        .bind(row.basin.as_str())
                        .bind(row.stream.as_str())
                        .bind(row.series.as_str())
                        .bind(column(row.bucket))
                        .bind(column(row.value));
                }
                query.execute(&mut *tx).await.map_err(db)?;
            }
        }
        tx.commit().await.map_err(db)
    }

    pub(super) async fn usage_read(&self, query: &UsageQuery) -> Result<Vec<UsagePoint>> {
        let rows = sqlx::query(
            "SELECT bucket_start, series, value FROM usage \
             WHERE bucket_secs = $1 AND metric = $2 AND basin = $3 AND stream = $4 \
             AND bucket_start >= $5 AND bucket_start < $6 ORDER BY bucket_start, series",
        )
        .bind(query.resolution.secs() as i64)
        .bind(query.metric)
        .bind(query.basin.as_str())
        .bind(query.stream.as_str())
        .bind(column(query.from))
        .bind(column(query.to))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        Ok(rows
            .iter()
            .map(|row| UsagePoint {
                bucket: row.get::<i64, _>("bucket_start") as u64,
                series: row.get("series"),
                value: row.get::<i64, _>("value").max(0) as u64,
            })
            .collect())
    }

    pub(super) async fn usage_expire(&self, resolution: Resolution, before: u64) -> Result<()> {
        sqlx::query("DELETE FROM usage WHERE bucket_secs = $1 AND bucket_start < $2")
            .bind(resolution.secs() as i64)
            .bind(column(before))
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    pub(super) async fn usage_stored_bytes(&self) -> Result<Vec<StoredBytes>> {
        let rows = sqlx::query(
            "SELECT s.basin AS basin, s.name AS name, CAST(SUM(g.stored_bytes) AS BIGINT) AS bytes \
             FROM segments g JOIN streams s ON s.id = g.stream_id \
             WHERE s.deleted_at_ms IS NULL GROUP BY s.basin, s.name",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter()
            .map(|row| {
                Ok(StoredBytes {
                    basin: row.get("basin"),
                    stream: row.get("name"),
                    bytes: row.try_get::<i64, _>("bytes").map_err(db)?.max(0) as u64,
                })
            })
            .collect()
    }

    pub(super) async fn usage_basins_with_streams(
        &self,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT DISTINCT basin FROM streams WHERE created_at_ms <= $2 \
             AND (deleted_at_ms IS NULL OR deleted_at_ms >= $1) ORDER BY basin",
        )
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        Ok(rows.iter().map(|row| row.get("basin")).collect())
    }
}

/// `rows` with those of one key merged into one, in first-seen order.
fn merged(rows: &[UsageRow], merge: impl Fn(u64, &UsageRow) -> u64) -> Vec<UsageRow> {
    let mut index: std::collections::HashMap<(Resolution, u64, &str, &str, &str, &str), usize> =
        std::collections::HashMap::new();
    let mut out: Vec<UsageRow> = Vec::with_capacity(rows.len());
    for row in rows {
        let key = (
            row.resolution,
            row.bucket,
            row.metric,
            row.basin.as_str(),
            row.stream.as_str(),
            row.series.as_str(),
        );
        match index.get(&key) {
            Some(&at) => out[at].value = merge(out[at].value, row),
            None => {
                index.insert(key, out.len());
                out.push(row.clone());
            }
        }
    }
    out
}
