//! The embedded default `MetadataStore`: one SQLite file, written with `synchronous=FULL`
//! so that a committed change survives power loss.

use std::path::Path;
use std::str::FromStr;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};
use time::OffsetDateTime;

use super::metadata::{BasinRecord, Created, ListPage, ListRange, MetadataStore, StreamRecord};
use crate::access::AccessTokenInfo;
use crate::error::{Error, Result};
use crate::names::{BasinName, StreamName};

/// Schema versions, applied in order; each runs once, recorded in `schema_version`.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE basins (
    name          TEXT PRIMARY KEY,
    location      TEXT NOT NULL,
    config        TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    deleted_at_ms INTEGER,
    idempotency_key TEXT
);
CREATE TABLE streams (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    basin         TEXT NOT NULL,
    name          TEXT NOT NULL,
    config        TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    deleted_at_ms INTEGER,
    idempotency_key TEXT,
    UNIQUE (basin, name)
);
CREATE TABLE node_epoch (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    epoch     INTEGER NOT NULL
);
INSERT INTO node_epoch (singleton, epoch) VALUES (1, 0);
"#,
    r#"
CREATE TABLE access_tokens (
    id            TEXT PRIMARY KEY,
    secret_digest BLOB NOT NULL UNIQUE,
    info          TEXT NOT NULL
);
"#,
];

pub struct SqliteMetadataStore {
    pool: SqlitePool,
}

impl SqliteMetadataStore {
    pub async fn open(path: &Path) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .map_err(Error::storage)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(std::time::Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(|e| Error::storage(format!("opening {}: {e}", path.display())))?;
        let store = Self { pool };
        store.migrate().await?;
        Ok(store)
    }

    /// A transaction that holds the write lock from its start, so a read-then-write
    /// (check, then insert) never fails on a concurrent writer's snapshot.
    async fn write_transaction(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
        self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(db)
    }

    async fn migrate(&self) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        sqlx::query("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let applied: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM schema_version")
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?;
        if applied as usize > MIGRATIONS.len() {
            return Err(Error::storage(format!(
                "the metadata database has schema version {applied}, newer than this \
                 streamgate ({}); run a newer streamgate",
                MIGRATIONS.len()
            )));
        }
        for (version, sql) in MIGRATIONS.iter().enumerate().skip(applied as usize) {
            sqlx::raw_sql(sql).execute(&mut *tx).await.map_err(db)?;
            sqlx::query("INSERT INTO schema_version (version) VALUES (?)")
                .bind(version as i64 + 1)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        tx.commit().await.map_err(db)
    }
}

fn db(err: sqlx::Error) -> Error {
    Error::storage(format!("metadata store: {err}"))
}

fn to_ms(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

fn from_ms(ms: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("configs always serialize")
}

fn parse_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| Error::storage(format!("corrupt stored config: {e}")))
}

fn basin_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<BasinRecord> {
    Ok(BasinRecord {
        name: BasinName::new(row.get::<String, _>("name"))?,
        location: row.get("location"),
        config: parse_json(row.get::<&str, _>("config"))?,
        created_at: from_ms(row.get("created_at_ms")),
        deleted_at: row.get::<Option<i64>, _>("deleted_at_ms").map(from_ms),
        idempotency_key: row.get("idempotency_key"),
    })
}

fn stream_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<StreamRecord> {
    Ok(StreamRecord {
        id: row.get::<i64, _>("id") as u64,
        basin: BasinName::new(row.get::<String, _>("basin"))?,
        name: StreamName::new(row.get::<String, _>("name"))?,
        config: parse_json(row.get::<&str, _>("config"))?,
        created_at: from_ms(row.get("created_at_ms")),
        deleted_at: row.get::<Option<i64>, _>("deleted_at_ms").map(from_ms),
        idempotency_key: row.get("idempotency_key"),
    })
}

/// Splits `limit + 1` fetched rows into a page and its `has_more` flag.
fn page<T>(mut items: Vec<T>, limit: usize) -> ListPage<T> {
    let has_more = items.len() > limit;
    items.truncate(limit);
    ListPage { items, has_more }
}

const BASIN_COLUMNS: &str = "name, location, config, created_at_ms, deleted_at_ms, idempotency_key";
const STREAM_COLUMNS: &str =
    "id, basin, name, config, created_at_ms, deleted_at_ms, idempotency_key";

#[async_trait]
impl MetadataStore for SqliteMetadataStore {
    async fn create_basin(&self, basin: BasinRecord) -> Result<Created<BasinRecord>> {
        let mut tx = self.write_transaction().await?;
        let existing = sqlx::query(&format!(
            "SELECT {BASIN_COLUMNS} FROM basins WHERE name = ?"
        ))
        .bind(basin.name.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        if let Some(row) = existing {
            // End the transaction now: a dropped one would hold the write lock until
            // its connection is next used.
            tx.rollback().await.map_err(db)?;
            let existing = basin_from_row(&row)?;
            return match existing_outcome(
                &existing.deleted_at,
                &existing.idempotency_key,
                &basin.idempotency_key,
            ) {
                Outcome::DeletionPending => {
                    Err(Error::BasinDeletionPending(basin.name.to_string()))
                }
                Outcome::Retry => Ok(Created::Existing(existing)),
                Outcome::Conflict => Err(Error::AlreadyExists(format!("basin `{}`", basin.name))),
            };
        }
        sqlx::query(
            "INSERT INTO basins (name, location, config, created_at_ms, deleted_at_ms, idempotency_key) \
             VALUES (?, ?, ?, ?, NULL, ?)",
        )
        .bind(basin.name.as_str())
        .bind(&basin.location)
        .bind(json(&basin.config))
        .bind(to_ms(basin.created_at))
        .bind(&basin.idempotency_key)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(Created::New(basin))
    }

    async fn get_basin(&self, name: &BasinName) -> Result<Option<BasinRecord>> {
        sqlx::query(&format!(
            "SELECT {BASIN_COLUMNS} FROM basins WHERE name = ?"
        ))
        .bind(name.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(db)?
        .as_ref()
        .map(basin_from_row)
        .transpose()
    }

    async fn list_basins(&self, range: &ListRange) -> Result<ListPage<BasinRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {BASIN_COLUMNS} FROM basins \
             WHERE name > ? AND name >= ? AND substr(name, 1, length(?)) = ? \
             ORDER BY name LIMIT ?"
        ))
        .bind(&range.start_after)
        .bind(&range.prefix)
        .bind(&range.prefix)
        .bind(&range.prefix)
        .bind(range.limit as i64 + 1)
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        let items = rows
            .iter()
            .map(basin_from_row)
            .collect::<Result<Vec<_>>>()?;
        Ok(page(items, range.limit))
    }

    async fn set_basin_config(
        &self,
        name: &BasinName,
        config: &crate::config::BasinConfig,
    ) -> Result<()> {
        sqlx::query("UPDATE basins SET config = ? WHERE name = ?")
            .bind(json(config))
            .bind(name.as_str())
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn mark_basin_deleted(&self, name: &BasinName, at: OffsetDateTime) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        sqlx::query("UPDATE basins SET deleted_at_ms = ? WHERE name = ? AND deleted_at_ms IS NULL")
            .bind(to_ms(at))
            .bind(name.as_str())
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query(
            "UPDATE streams SET deleted_at_ms = ? WHERE basin = ? AND deleted_at_ms IS NULL",
        )
        .bind(to_ms(at))
        .bind(name.as_str())
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)
    }

    async fn remove_basin(&self, name: &BasinName) -> Result<()> {
        sqlx::query("DELETE FROM basins WHERE name = ?")
            .bind(name.as_str())
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn create_stream(&self, stream: StreamRecord) -> Result<Created<StreamRecord>> {
        let mut tx = self.write_transaction().await?;
        // Checked inside the write transaction, so a basin deletion cannot slip between
        // the check and the insert and leave a live stream in a deleted basin.
        let basin_deleted: Option<Option<i64>> =
            sqlx::query_scalar("SELECT deleted_at_ms FROM basins WHERE name = ?")
                .bind(stream.basin.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
        match basin_deleted {
            None => {
                tx.rollback().await.map_err(db)?;
                return Err(Error::BasinNotFound(stream.basin.to_string()));
            }
            Some(Some(_)) => {
                tx.rollback().await.map_err(db)?;
                return Err(Error::BasinDeletionPending(stream.basin.to_string()));
            }
            Some(None) => {}
        }
        let existing = sqlx::query(&format!(
            "SELECT {STREAM_COLUMNS} FROM streams WHERE basin = ? AND name = ?"
        ))
        .bind(stream.basin.as_str())
        .bind(stream.name.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        if let Some(row) = existing {
            // End the transaction now: a dropped one would hold the write lock until
            // its connection is next used.
            tx.rollback().await.map_err(db)?;
            let existing = stream_from_row(&row)?;
            return match existing_outcome(
                &existing.deleted_at,
                &existing.idempotency_key,
                &stream.idempotency_key,
            ) {
                Outcome::DeletionPending => {
                    Err(Error::StreamDeletionPending(stream.name.to_string()))
                }
                Outcome::Retry => Ok(Created::Existing(existing)),
                Outcome::Conflict => Err(Error::AlreadyExists(format!("stream `{}`", stream.name))),
            };
        }
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO streams (basin, name, config, created_at_ms, deleted_at_ms, idempotency_key) \
             VALUES (?, ?, ?, ?, NULL, ?) RETURNING id",
        )
        .bind(stream.basin.as_str())
        .bind(stream.name.as_str())
        .bind(json(&stream.config))
        .bind(to_ms(stream.created_at))
        .bind(&stream.idempotency_key)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(Created::New(StreamRecord {
            id: id as u64,
            ..stream
        }))
    }

    async fn get_stream(
        &self,
        basin: &BasinName,
        name: &StreamName,
    ) -> Result<Option<StreamRecord>> {
        sqlx::query(&format!(
            "SELECT {STREAM_COLUMNS} FROM streams WHERE basin = ? AND name = ?"
        ))
        .bind(basin.as_str())
        .bind(name.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(db)?
        .as_ref()
        .map(stream_from_row)
        .transpose()
    }

    async fn list_streams(
        &self,
        basin: &BasinName,
        range: &ListRange,
    ) -> Result<ListPage<StreamRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {STREAM_COLUMNS} FROM streams \
             WHERE basin = ? AND name > ? AND name >= ? AND substr(name, 1, length(?)) = ? \
             ORDER BY name LIMIT ?"
        ))
        .bind(basin.as_str())
        .bind(&range.start_after)
        .bind(&range.prefix)
        .bind(&range.prefix)
        .bind(&range.prefix)
        .bind(range.limit as i64 + 1)
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        let items = rows
            .iter()
            .map(stream_from_row)
            .collect::<Result<Vec<_>>>()?;
        Ok(page(items, range.limit))
    }

    async fn set_stream_config(&self, id: u64, config: &crate::config::StreamConfig) -> Result<()> {
        sqlx::query("UPDATE streams SET config = ? WHERE id = ?")
            .bind(json(config))
            .bind(id as i64)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn mark_stream_deleted(&self, id: u64, at: OffsetDateTime) -> Result<()> {
        sqlx::query("UPDATE streams SET deleted_at_ms = ? WHERE id = ? AND deleted_at_ms IS NULL")
            .bind(to_ms(at))
            .bind(id as i64)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn remove_stream(&self, id: u64) -> Result<()> {
        sqlx::query("DELETE FROM streams WHERE id = ?")
            .bind(id as i64)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn pending_deletions(&self) -> Result<(Vec<StreamRecord>, Vec<BasinName>)> {
        let streams = sqlx::query(&format!(
            "SELECT {STREAM_COLUMNS} FROM streams WHERE deleted_at_ms IS NOT NULL ORDER BY id"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?
        .iter()
        .map(stream_from_row)
        .collect::<Result<Vec<_>>>()?;
        let basins = sqlx::query_scalar::<_, String>(
            "SELECT name FROM basins WHERE deleted_at_ms IS NOT NULL ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db)?
        .into_iter()
        .map(BasinName::new)
        .collect::<Result<Vec<_>>>()?;
        Ok((streams, basins))
    }

    async fn live_streams(&self) -> Result<Vec<StreamRecord>> {
        sqlx::query(&format!(
            "SELECT {STREAM_COLUMNS} FROM streams WHERE deleted_at_ms IS NULL ORDER BY id"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?
        .iter()
        .map(stream_from_row)
        .collect()
    }

    async fn next_epoch(&self) -> Result<u64> {
        let epoch: i64 = sqlx::query_scalar(
            "UPDATE node_epoch SET epoch = epoch + 1 WHERE singleton = 1 RETURNING epoch",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(db)?;
        Ok(epoch as u64)
    }

    async fn put_access_token(
        &self,
        token: &AccessTokenInfo,
        secret_digest: &[u8],
        replace: bool,
    ) -> Result<()> {
        let mut tx = self.write_transaction().await?;
        let exists = sqlx::query("SELECT 1 FROM access_tokens WHERE id = ?")
            .bind(&token.id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?
            .is_some();
        if exists && !replace {
            tx.rollback().await.map_err(db)?; // release the write lock now
            return Err(Error::AlreadyExists(format!("access token `{}`", token.id)));
        }
        sqlx::query("DELETE FROM access_tokens WHERE id = ?")
            .bind(&token.id)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query("INSERT INTO access_tokens (id, secret_digest, info) VALUES (?, ?, ?)")
            .bind(&token.id)
            .bind(secret_digest)
            .bind(json(token))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)
    }

    async fn access_token_by_digest(
        &self,
        digest: &[u8],
    ) -> Result<Option<(AccessTokenInfo, Vec<u8>)>> {
        let row =
            sqlx::query("SELECT info, secret_digest FROM access_tokens WHERE secret_digest = ?")
                .bind(digest)
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
        row.map(|row| Ok((parse_json(row.get("info"))?, row.get("secret_digest"))))
            .transpose()
    }

    async fn list_access_tokens(&self, range: &ListRange) -> Result<ListPage<AccessTokenInfo>> {
        let rows = sqlx::query(
            "SELECT info FROM access_tokens \
             WHERE id > ? AND id >= ? AND substr(id, 1, length(?)) = ? \
             ORDER BY id LIMIT ?",
        )
        .bind(&range.start_after)
        .bind(&range.prefix)
        .bind(&range.prefix)
        .bind(&range.prefix)
        .bind(range.limit as i64 + 1)
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        let items = rows
            .iter()
            .map(|row| parse_json(row.get("info")))
            .collect::<Result<Vec<_>>>()?;
        Ok(page(items, range.limit))
    }

    async fn delete_access_token(&self, id: &str) -> Result<bool> {
        let result = sqlx::query("DELETE FROM access_tokens WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(result.rows_affected() > 0)
    }
}

/// How a create that finds an existing row of the same name ends.
pub(crate) enum Outcome {
    DeletionPending,
    /// The same request token: a retry of the call that created it.
    Retry,
    Conflict,
}

pub(crate) fn existing_outcome(
    deleted_at: &Option<OffsetDateTime>,
    existing_token: &Option<String>,
    idempotency_key: &Option<String>,
) -> Outcome {
    if deleted_at.is_some() {
        Outcome::DeletionPending
    } else if idempotency_key.is_some() && existing_token == idempotency_key {
        Outcome::Retry
    } else {
        Outcome::Conflict
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn passes_the_metadata_store_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::SqliteMetadataStore::open(&dir.path().join("meta.db"))
            .await
            .unwrap();
        super::super::metadata::conformance(&store).await;
    }
}
