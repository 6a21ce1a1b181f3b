//! The SQL `MetadataStore`, one implementation for both backends: the embedded default
//! (a SQLite file written with `synchronous=FULL`, so a committed change survives power
//! loss) and PostgreSQL (shared by every node). The queries are the same; only the table
//! definitions and how a write transaction takes the write lock differ (`Dialect`).

use std::collections::BTreeMap;
use std::path::Path;

use async_trait::async_trait;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Executor, Row};
use time::OffsetDateTime;

use super::metadata::{BasinRecord, Created, ListPage, ListRange, MetadataStore, StreamRecord};
use crate::access::AccessTokenInfo;
use crate::error::{Error, Resource, Result};
use crate::names::{BasinName, StreamName};
use crate::segment::{CompactionCommit, SegmentRecord, StreamCheckpoint};
use crate::storage::cluster::{
    LiveNode, NodeRecord, OrphanedStream, StreamChange, StreamClaim, StreamOwner,
};
use crate::storage::usage::{Resolution, StoredBytes, UsagePoint, UsageQuery, UsageRow};

mod cluster;
mod usage;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Sqlite,
    Postgres,
}

/// Schema versions, applied in order; each runs once, recorded in `schema_version`.
/// Each is written once for both dialects, with the column types that differ left as
/// `{key}` (a name: compared and sorted bytewise in both, `COLLATE "C"` on PostgreSQL,
/// so listings page the same way on either backend), `{int}` (64-bit), `{bytes}` and
/// `{serial_key}` (an id the database assigns); see `Dialect::render`.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE basins (
    name          {key} PRIMARY KEY,
    location      TEXT NOT NULL,
    config        TEXT NOT NULL,
    created_at_ms {int} NOT NULL,
    deleted_at_ms {int},
    idempotency_key TEXT
);
CREATE TABLE streams (
    id            {serial_key},
    basin         {key} NOT NULL,
    name          {key} NOT NULL,
    config        TEXT NOT NULL,
    created_at_ms {int} NOT NULL,
    deleted_at_ms {int},
    idempotency_key TEXT,
    UNIQUE (basin, name)
);
CREATE TABLE node_epoch (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    epoch     {int} NOT NULL
);
INSERT INTO node_epoch (singleton, epoch) VALUES (1, 0);
"#,
    r#"
CREATE TABLE access_tokens (
    id            {key} PRIMARY KEY,
    secret_digest {bytes} NOT NULL UNIQUE,
    info          TEXT NOT NULL
);
"#,
    r#"
CREATE TABLE segments (
    stream_id      {int} NOT NULL,
    start_seq      {int} NOT NULL,
    end_seq        {int} NOT NULL,
    last_timestamp {int} NOT NULL,
    object_key     TEXT NOT NULL,
    written_at_ms  {int} NOT NULL,
    entries        {bytes} NOT NULL,
    PRIMARY KEY (stream_id, start_seq)
);
CREATE INDEX segments_by_end ON segments (stream_id, end_seq);
CREATE INDEX segments_by_timestamp ON segments (stream_id, last_timestamp, end_seq);
CREATE TABLE stream_checkpoints (
    stream_id      {int} PRIMARY KEY,
    next_seq       {int} NOT NULL,
    last_timestamp {int} NOT NULL,
    fencing_token  {bytes} NOT NULL,
    trim_point     {int} NOT NULL
);
CREATE TABLE wal_watermarks (
    epoch      {int} PRIMARY KEY,
    next_chunk {int} NOT NULL
);
CREATE TABLE obsolete_objects (
    object_key      {key} PRIMARY KEY,
    deletable_at_ms {int} NOT NULL
);
"#,
    // The cluster: nodes with their leases, and who sequences each stream. Streams that
    // exist already were written by one process before clusters: their records are in
    // the logs of epochs without a node (`log_epoch` -1).
    r#"
CREATE TABLE nodes (
    epoch            {int} PRIMARY KEY,
    identity         TEXT NOT NULL,
    advertise_url    TEXT NOT NULL,
    started_at_ms    {int} NOT NULL,
    heartbeat_at_ms  {int} NOT NULL,
    lease_expires_ms {int} NOT NULL,
    leases_lost      {int} NOT NULL
);
CREATE TABLE stream_leases (
    stream_id   {int} PRIMARY KEY,
    owner       {int} NOT NULL,
    lease_epoch {int} NOT NULL,
    log_epoch   {int} NOT NULL
);
CREATE INDEX stream_leases_by_owner ON stream_leases (owner);
CREATE INDEX stream_leases_by_log ON stream_leases (log_epoch);
INSERT INTO stream_leases (stream_id, owner, lease_epoch, log_epoch) SELECT id, 0, 0, -1 FROM streams;
ALTER TABLE streams ADD COLUMN changed_at_ms {int} NOT NULL DEFAULT 0;
CREATE INDEX streams_by_change ON streams (changed_at_ms);
"#,
    // A node that is shutting down hands its streams to the others first; while it does,
    // no stream is placed on it.
    r#"
ALTER TABLE nodes ADD COLUMN leaving {int} NOT NULL DEFAULT 0;
"#,
    // The cipher a stream encrypts its records with, fixed when it is created (NULL:
    // plaintext).
    r#"
ALTER TABLE streams ADD COLUMN cipher TEXT;
"#,
    // Usage for the metrics API: counts and gauge readings per bucket (`bucket_secs`
    // long, starting at `bucket_start`, in seconds); and how many bytes each segment
    // holds, for the storage gauges (0 for segments written before).
    r#"
CREATE TABLE usage (
    bucket_secs  {int} NOT NULL,
    metric       {key} NOT NULL,
    basin        {key} NOT NULL,
    stream       {key} NOT NULL,
    series       {key} NOT NULL,
    bucket_start {int} NOT NULL,
    value        {int} NOT NULL,
    PRIMARY KEY (bucket_secs, metric, basin, stream, series, bucket_start)
);
ALTER TABLE segments ADD COLUMN stored_bytes {int} NOT NULL DEFAULT 0;
"#,
    // Consumer groups belong to their stream: checkpointed with it (JSON; NULL when it
    // has none), with the number of group ops the checkpoint covers.
    r#"
ALTER TABLE stream_checkpoints ADD COLUMN groups {bytes};
ALTER TABLE stream_checkpoints ADD COLUMN next_group_op {int} NOT NULL DEFAULT 0;
"#,
    // A node is ready once it has started: taken back its streams, and serving. Until
    // then no stream is handed to it, for it would not answer requests for them. Nodes
    // from before this column were serving.
    r#"
ALTER TABLE nodes ADD COLUMN ready {int} NOT NULL DEFAULT 1;
"#,
];

impl Dialect {
    /// A migration in this dialect.
    fn render(self, migration: &str) -> String {
        let types: [(&str, &str); 4] = match self {
            Dialect::Sqlite => [
                ("{key}", "TEXT"),
                ("{int}", "INTEGER"),
                ("{bytes}", "BLOB"),
                ("{serial_key}", "INTEGER PRIMARY KEY AUTOINCREMENT"),
            ],
            Dialect::Postgres => [
                ("{key}", "TEXT COLLATE \"C\""),
                ("{int}", "BIGINT"),
                ("{bytes}", "BYTEA"),
                (
                    "{serial_key}",
                    "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
                ),
            ],
        };
        types.iter().fold(migration.to_owned(), |sql, (name, ty)| {
            sql.replace(name, ty)
        })
    }
}

/// How long PostgreSQL keeps a session that stopped talking inside a transaction:
/// every write transaction holds the cluster's write lock, and a node partitioned away
/// in the middle of one must not keep it from the others for long.
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "SET idle_in_transaction_session_timeout = 5000";

/// The key of the PostgreSQL advisory lock every write transaction takes: writers are
/// serialized as on SQLite, so check-then-insert needs no retry loop (metadata writes
/// are rare: creates, reconfigurations, deletions).
const WRITE_LOCK_KEY: i64 = 0x5354_5247_4154_4531;

pub struct SqlMetadataStore {
    pool: AnyPool,
    /// Connections of their own for lease renewals, so that a renewal never waits
    /// behind other work for a connection (the same pool on SQLite).
    lease_pool: AnyPool,
    dialect: Dialect,
}

impl SqlMetadataStore {
    /// A SQLite store in a new temporary directory (for unit tests), with the directory,
    /// which must outlive it.
    #[cfg(test)]
    pub(crate) async fn temporary() -> (Self, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = Self::open_sqlite(&dir.path().join("metadata.db"))
            .await
            .unwrap();
        (store, dir)
    }

    /// The embedded default: a SQLite file, created if missing.
    pub async fn open_sqlite(path: &Path) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let pool = AnyPoolOptions::new()
            .max_connections(4)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute(
                        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 10000;",
                    )
                    .await
                    .map(|_| ())
                })
            })
            .connect(&url)
            .await
            .map_err(|e| Error::storage_caused(format!("opening {}", path.display()), e))?;
        Self::ready(pool.clone(), pool, Dialect::Sqlite).await
    }

    /// PostgreSQL at `url` (`postgres://user:password@host:port/database`). A database
    /// that does not exist yet is created (the role needs `CREATEDB` for that).
    pub async fn connect_postgres(url: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let pool = match Self::postgres_pool(url, 8).await {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("3D000") => {
                create_postgres_database(url).await?;
                Self::postgres_pool(url, 8).await
            }
            other => other,
        }
        .map_err(|e| Error::storage_caused("connecting to PostgreSQL", e))?;
        let lease_pool = Self::postgres_pool(url, 2)
            .await
            .map_err(|e| Error::storage_caused("connecting to PostgreSQL", e))?;
        Self::ready(pool, lease_pool, Dialect::Postgres).await
    }

    async fn postgres_pool(
        url: &str,
        connections: u32,
    ) -> std::result::Result<AnyPool, sqlx::Error> {
        AnyPoolOptions::new()
            .max_connections(connections)
            // A node cut off in the middle of a write transaction must not hold the
            // write lock for the whole cluster: the server ends such a session soon.
            .after_connect(|conn, _| {
                Box::pin(async move { conn.execute(IDLE_IN_TRANSACTION_TIMEOUT).await.map(|_| ()) })
            })
            // A connection the server closed (restart, failover) is noticed and replaced
            // before use, so the server rides out a database restart on its own.
            .test_before_acquire(true)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect(url)
            .await
    }

    async fn ready(pool: AnyPool, lease_pool: AnyPool, dialect: Dialect) -> Result<Self> {
        let store = Self {
            pool,
            lease_pool,
            dialect,
        };
        store.migrate().await?;
        Ok(store)
    }

    /// One page of a listing: the rows `select` gives whose `key` is in `range` (and
    /// whose `scope` column, if any, has the given value), in `key` order. One row more
    /// than the page is fetched to learn whether there are more.
    async fn page<T>(
        &self,
        select: &str,
        key: &str,
        scope: Option<(&str, &str)>,
        range: &ListRange,
        from_row: impl Fn(&AnyRow) -> Result<T>,
    ) -> Result<ListPage<T>> {
        let (scope_clause, first) = match scope {
            Some((column, _)) => (format!("{column} = $1 AND "), 2),
            None => (String::new(), 1),
        };
        let sql = format!(
            "{select} WHERE {scope_clause}{key} > ${} AND {key} >= ${} \
             AND substr({key}, 1, length(${})) = ${} ORDER BY {key} LIMIT ${}",
            first,
            first + 1,
            first + 2,
            first + 3,
            first + 4
        );
        let mut query = sqlx::query(&sql);
        if let Some((_, value)) = scope {
            query = query.bind(value);
        }
        let rows = query
            .bind(&range.start_after)
            .bind(&range.prefix)
            .bind(&range.prefix)
            .bind(&range.prefix)
            .bind(range.limit as i64 + 1)
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
        let mut items = rows.iter().map(from_row).collect::<Result<Vec<_>>>()?;
        let has_more = items.len() > range.limit;
        items.truncate(range.limit);
        Ok(ListPage { items, has_more })
    }

    /// A transaction that holds the write lock from its start, so a read-then-write
    /// (check, then insert) never races another writer.
    async fn write_transaction(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>> {
        match self.dialect {
            Dialect::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(db),
            Dialect::Postgres => {
                let mut tx = self.pool.begin().await.map_err(db)?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(WRITE_LOCK_KEY)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
                Ok(tx)
            }
        }
    }

    async fn migrate(&self) -> Result<()> {
        let mut tx = self.write_transaction().await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
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
        for (version, migration) in MIGRATIONS.iter().enumerate().skip(applied as usize) {
            let sql = self.dialect.render(migration);
            sqlx::raw_sql(&sql).execute(&mut *tx).await.map_err(db)?;
            sqlx::query("INSERT INTO schema_version (version) VALUES ($1)")
                .bind(version as i64 + 1)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        tx.commit().await.map_err(db)
    }
}

/// Creates the database `url` names, through the server's `postgres` database.
async fn create_postgres_database(url: &str) -> Result<()> {
    let (server, name) = url
        .split_once('?')
        .map_or(url, |(base, _)| base)
        .rsplit_once('/')
        .ok_or_else(|| Error::invalid(format!("`{url}` names no database")))?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(Error::invalid(format!(
            "database `{name}` does not exist; create it, or name one of letters, digits, `_` and `-` for streamgate to create"
        )));
    }
    let mut admin =
        <sqlx::AnyConnection as sqlx::Connection>::connect(&format!("{server}/postgres"))
            .await
            .map_err(|e| {
                Error::storage_caused(format!("connecting to PostgreSQL to create `{name}`"), e)
            })?;
    match admin
        .execute(format!("CREATE DATABASE \"{name}\"").as_str())
        .await
    {
        // Another node created it first (23505: at the same moment, which PostgreSQL
        // reports as a clash in its catalog rather than as a duplicate database).
        Err(sqlx::Error::Database(e)) if matches!(e.code().as_deref(), Some("42P04" | "23505")) => {
            Ok(())
        }
        Err(e) => Err(Error::storage_caused(
            format!("creating database `{name}`"),
            e,
        )),
        Ok(_) => {
            tracing::info!(database = name, "created the PostgreSQL database");
            Ok(())
        }
    }
}

/// A database failure as the engine's error: `Unavailable` when waiting and retrying
/// fixes it (the connection broke or timed out, the server is restarting or overloaded,
/// a lock was busy), `Storage` when it needs an operator.
fn db(err: sqlx::Error) -> Error {
    let transient = match &err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(e) => e.code().is_some_and(|code| {
            // PostgreSQL: connection exceptions (08), serialization failures and
            // deadlocks (40), insufficient resources (53), operator intervention such
            // as a shutdown (57). SQLite: busy (5) and locked (6), reported as extended
            // codes (at most 4 digits, unlike SQLSTATEs) whose low byte is the primary one.
            ["08", "40", "53", "57"]
                .iter()
                .any(|class| code.starts_with(class))
                || (code.len() < 5 && code.parse::<i32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6)))
        }),
        _ => false,
    };
    if transient {
        Error::Unavailable(format!("metadata store: {err}"))
    } else {
        Error::storage_caused("metadata store", err)
    }
}

fn to_ms(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

fn from_ms(ms: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// A sequence number or timestamp as a column value. Columns are signed 64-bit; the
/// few timestamps beyond (uncapped client timestamps) saturate, which keeps the order
/// the queries rely on. Exact values live in the segment's entry table.
fn column(value: u64) -> i64 {
    value.min(i64::MAX as u64) as i64
}

fn segment_from_row(row: &AnyRow) -> Result<SegmentRecord> {
    let key: String = row.get("object_key");
    let entries = SegmentRecord::decode_entries(&key, row.get::<&[u8], _>("entries"))?;
    Ok(SegmentRecord {
        stream_id: row.get::<i64, _>("stream_id") as u64,
        key,
        written_at_ms: row.get::<i64, _>("written_at_ms") as u64,
        entries,
    })
}

/// A row if stream `$1` exists and is not deleted.
const LIVE_STREAM: &str = "SELECT 1 FROM streams WHERE id = $1 AND deleted_at_ms IS NULL";

const SEGMENT_COLUMNS: &str = "stream_id, object_key, written_at_ms, entries";

/// Records objects as obsolete (deletable from `after`) inside a transaction: by key, or
/// every object a `SELECT object_key ...` query returns.
async fn mark_obsolete(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    keys: &[String],
    after: OffsetDateTime,
) -> Result<()> {
    // Many rows per statement: a compaction retires one WAL chunk per small append
    // (tens of thousands), and a statement per key kept SQLite's worker thread busy
    // while appends went on.
    for batch in keys.chunks(KEYS_PER_STATEMENT) {
        let values = placeholders(batch.len(), 2)
            .map(|key| format!("({key}, $1)"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "INSERT INTO obsolete_objects (object_key, deletable_at_ms) VALUES {values} \
             ON CONFLICT (object_key) DO NOTHING"
        );
        let mut query = sqlx::query(&sql).bind(to_ms(after));
        for key in batch {
            query = query.bind(key);
        }
        query.execute(&mut **tx).await.map_err(db)?;
    }
    Ok(())
}

/// How many keys one statement binds: well under the bound parameters SQLite (32,766)
/// and PostgreSQL (65,535) take.
const KEYS_PER_STATEMENT: usize = 500;

/// `count` numbered placeholders from `$first` on.
fn placeholders(count: usize, first: usize) -> impl Iterator<Item = String> {
    (first..first + count).map(|number| format!("${number}"))
}

/// Whether stream `id` is live (`None` if not) and, if so, which node holds its lease
/// (`None` without one), inside a transaction.
async fn live_stream_owner(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    id: u64,
) -> Result<Option<Option<i64>>> {
    sqlx::query_scalar(
        "SELECT l.owner FROM streams s LEFT JOIN stream_leases l ON l.stream_id = s.id \
         WHERE s.id = $1 AND s.deleted_at_ms IS NULL",
    )
    .bind(id as i64)
    .fetch_optional(&mut **tx)
    .await
    .map_err(db)
}

/// Indexes `segment`, replacing a row that starts where it does, inside a transaction.
async fn upsert_segment(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    segment: &SegmentRecord,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO segments (stream_id, start_seq, end_seq, last_timestamp, object_key, written_at_ms, entries, stored_bytes) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (stream_id, start_seq) DO UPDATE SET \
         end_seq = excluded.end_seq, last_timestamp = excluded.last_timestamp, \
         object_key = excluded.object_key, written_at_ms = excluded.written_at_ms, \
         entries = excluded.entries, stored_bytes = excluded.stored_bytes",
    )
    .bind(segment.stream_id as i64)
    .bind(column(segment.start_seq()))
    .bind(column(segment.end_seq()))
    .bind(column(segment.last_timestamp()))
    .bind(&segment.key)
    .bind(column(segment.written_at_ms))
    .bind(segment.encode_entries())
    .bind(column(segment.stored_bytes()))
    .execute(&mut **tx)
    .await
    .map_err(db)?;
    Ok(())
}

/// Moves a stream's segment rows that start at or below `through_start` into the
/// obsolete objects, inside a transaction.
async fn retire_segments(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    stream_id: u64,
    through_start: i64,
    after: OffsetDateTime,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO obsolete_objects (object_key, deletable_at_ms) \
         SELECT object_key, $3 FROM segments WHERE stream_id = $1 AND start_seq <= $2 \
         ON CONFLICT (object_key) DO NOTHING",
    )
    .bind(stream_id as i64)
    .bind(through_start)
    .bind(to_ms(after))
    .execute(&mut **tx)
    .await
    .map_err(db)?;
    sqlx::query("DELETE FROM segments WHERE stream_id = $1 AND start_seq <= $2")
        .bind(stream_id as i64)
        .bind(through_start)
        .execute(&mut **tx)
        .await
        .map_err(db)?;
    Ok(())
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("configs always serialize")
}

fn parse_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| Error::storage_caused("corrupt stored config", e))
}

fn basin_from_row(row: &AnyRow) -> Result<BasinRecord> {
    Ok(BasinRecord {
        name: BasinName::new(row.get::<String, _>("name"))?,
        location: row.get("location"),
        config: parse_json(row.get::<&str, _>("config"))?,
        created_at: from_ms(row.get("created_at_ms")),
        deleted_at: row.get::<Option<i64>, _>("deleted_at_ms").map(from_ms),
        idempotency_key: row.get("idempotency_key"),
    })
}

fn stream_from_row(row: &AnyRow) -> Result<StreamRecord> {
    Ok(StreamRecord {
        id: row.get::<i64, _>("id") as u64,
        basin: BasinName::new(row.get::<String, _>("basin"))?,
        name: StreamName::new(row.get::<String, _>("name"))?,
        config: parse_json(row.get::<&str, _>("config"))?,
        cipher: match row.get::<Option<String>, _>("cipher") {
            None => None,
            Some(text) => Some(
                crate::encryption::Cipher::parse(&text)
                    .ok_or_else(|| Error::storage(format!("unknown stored cipher `{text}`")))?,
            ),
        },
        created_at: from_ms(row.get("created_at_ms")),
        deleted_at: row.get::<Option<i64>, _>("deleted_at_ms").map(from_ms),
        idempotency_key: row.get("idempotency_key"),
    })
}

const CHECKPOINT_COLUMNS: &str =
    "stream_id, next_seq, last_timestamp, fencing_token, trim_point, groups, next_group_op";

fn checkpoint_from_row(row: &AnyRow) -> Result<(u64, StreamCheckpoint)> {
    let checkpoint = StreamCheckpoint {
        next_seq: row.get::<i64, _>("next_seq") as u64,
        last_timestamp: row.get::<i64, _>("last_timestamp") as u64,
        fencing_token: String::from_utf8(row.get("fencing_token"))
            .map_err(|_| Error::storage("a stored fencing token is not UTF-8"))?,
        trim_point: row.get::<i64, _>("trim_point") as u64,
        groups: match row.get::<Option<Vec<u8>>, _>("groups") {
            None => Default::default(),
            Some(json) => std::sync::Arc::new(serde_json::from_slice(&json).map_err(|e| {
                Error::storage_caused("a stream's stored consumer groups are corrupt", e)
            })?),
        },
        next_group_op: row.get::<i64, _>("next_group_op") as u64,
    };
    Ok((row.get::<i64, _>("stream_id") as u64, checkpoint))
}

const BASIN_COLUMNS: &str = "name, location, config, created_at_ms, deleted_at_ms, idempotency_key";
const STREAM_COLUMNS: &str =
    "id, basin, name, config, cipher, created_at_ms, deleted_at_ms, idempotency_key";

#[async_trait]
impl MetadataStore for SqlMetadataStore {
    async fn create_basin(&self, basin: BasinRecord) -> Result<Created<BasinRecord>> {
        let mut tx = self.write_transaction().await?;
        let existing = sqlx::query(&format!(
            "SELECT {BASIN_COLUMNS} FROM basins WHERE name = $1"
        ))
        .bind(basin.name.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        if let Some(row) = existing {
            let existing = basin_from_row(&row)?;
            let resource = Resource::Basin(basin.name.to_string());
            return found_existing(tx, existing, &basin.idempotency_key, resource).await;
        }
        sqlx::query(
            "INSERT INTO basins (name, location, config, created_at_ms, deleted_at_ms, idempotency_key) \
             VALUES ($1, $2, $3, $4, NULL, $5)",
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
            "SELECT {BASIN_COLUMNS} FROM basins WHERE name = $1"
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
        let select = format!("SELECT {BASIN_COLUMNS} FROM basins");
        self.page(&select, "name", None, range, basin_from_row)
            .await
    }

    async fn set_basin_config(
        &self,
        name: &BasinName,
        config: &crate::config::BasinConfig,
    ) -> Result<()> {
        sqlx::query("UPDATE basins SET config = $1 WHERE name = $2")
            .bind(json(config))
            .bind(name.as_str())
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn mark_basin_deleted(&self, name: &BasinName, at: OffsetDateTime) -> Result<()> {
        let mut tx = self.write_transaction().await?;
        sqlx::query(
            "UPDATE basins SET deleted_at_ms = $1 WHERE name = $2 AND deleted_at_ms IS NULL",
        )
        .bind(to_ms(at))
        .bind(name.as_str())
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        sqlx::query(&format!(
            "UPDATE streams SET deleted_at_ms = $1, changed_at_ms = {} WHERE basin = $2 AND deleted_at_ms IS NULL",
            self.dialect.now_ms()
        ))
        .bind(to_ms(at))
        .bind(name.as_str())
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)
    }

    async fn remove_basin(&self, name: &BasinName) -> Result<()> {
        sqlx::query("DELETE FROM basins WHERE name = $1")
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
            sqlx::query_scalar("SELECT deleted_at_ms FROM basins WHERE name = $1")
                .bind(stream.basin.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
        match basin_deleted {
            None => {
                tx.rollback().await.map_err(db)?;
                return Err(Error::NotFound(Resource::Basin(stream.basin.to_string())));
            }
            Some(Some(_)) => {
                tx.rollback().await.map_err(db)?;
                return Err(Error::DeletionPending(Resource::Basin(
                    stream.basin.to_string(),
                )));
            }
            Some(None) => {}
        }
        let existing = sqlx::query(&format!(
            "SELECT {STREAM_COLUMNS} FROM streams WHERE basin = $1 AND name = $2"
        ))
        .bind(stream.basin.as_str())
        .bind(stream.name.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db)?;
        if let Some(row) = existing {
            let existing = stream_from_row(&row)?;
            let resource = Resource::Stream(stream.name.clone());
            return found_existing(tx, existing, &stream.idempotency_key, resource).await;
        }
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO streams (basin, name, config, cipher, created_at_ms, deleted_at_ms, idempotency_key) \
             VALUES ($1, $2, $3, $4, $5, NULL, $6) RETURNING id",
        )
        .bind(stream.basin.as_str())
        .bind(stream.name.as_str())
        .bind(json(&stream.config))
        .bind(stream.cipher.map(|c| c.as_str()))
        .bind(to_ms(stream.created_at))
        .bind(&stream.idempotency_key)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        sqlx::query(
            "INSERT INTO stream_leases (stream_id, owner, lease_epoch, log_epoch) VALUES ($1, 0, 0, 0)",
        )
        .bind(id)
        .execute(&mut *tx)
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
            "SELECT {STREAM_COLUMNS} FROM streams WHERE basin = $1 AND name = $2"
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
        let select = format!("SELECT {STREAM_COLUMNS} FROM streams");
        let in_basin = Some(("basin", basin.as_str()));
        self.page(&select, "name", in_basin, range, stream_from_row)
            .await
    }

    async fn set_stream_config(&self, id: u64, config: &crate::config::StreamConfig) -> Result<()> {
        sqlx::query(&format!(
            "UPDATE streams SET config = $1, changed_at_ms = {} WHERE id = $2",
            self.dialect.now_ms()
        ))
        .bind(json(config))
        .bind(id as i64)
        .execute(&self.pool)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn mark_stream_deleted(&self, id: u64, at: OffsetDateTime) -> Result<()> {
        sqlx::query(&format!(
            "UPDATE streams SET deleted_at_ms = $1, changed_at_ms = {} WHERE id = $2 AND deleted_at_ms IS NULL",
            self.dialect.now_ms()
        ))
        .bind(to_ms(at))
        .bind(id as i64)
        .execute(&self.pool)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn remove_stream(&self, id: u64) -> Result<()> {
        let mut tx = self.write_transaction().await?;
        retire_segments(&mut tx, id, i64::MAX, OffsetDateTime::now_utc()).await?;
        for table in [
            "stream_checkpoints WHERE stream_id",
            "stream_leases WHERE stream_id",
            "streams WHERE id",
        ] {
            sqlx::query(&format!("DELETE FROM {table} = $1"))
                .bind(id as i64)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        tx.commit().await.map_err(db)
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

    async fn stream_is_live(&self, id: u64) -> Result<bool> {
        let found = sqlx::query(LIVE_STREAM)
            .bind(id as i64)
            .fetch_optional(&self.pool)
            .await
            .map_err(db)?;
        Ok(found.is_some())
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

    async fn join_cluster(
        &self,
        epoch: u64,
        identity: &str,
        advertise_url: &str,
        lease_ms: u64,
    ) -> Result<()> {
        self.cluster_join(epoch, identity, advertise_url, lease_ms)
            .await
    }

    async fn renew_lease(&self, epoch: u64, lease_ms: u64, ready: bool) -> Result<bool> {
        self.cluster_renew(epoch, lease_ms, ready).await
    }

    async fn leave_cluster(&self, epoch: u64) -> Result<()> {
        self.cluster_leave(epoch).await
    }

    async fn begin_leaving(&self, epoch: u64) -> Result<()> {
        self.cluster_begin_leaving(epoch).await
    }

    async fn release_streams(
        &self,
        epoch: u64,
        stream_ids: &[u64],
        to: Option<u64>,
    ) -> Result<u64> {
        self.cluster_release(epoch, stream_ids, to).await
    }

    async fn streams_owned(&self, epoch: u64) -> Result<Vec<u64>> {
        self.cluster_owned(epoch).await
    }

    async fn cluster_nodes(&self) -> Result<Vec<NodeRecord>> {
        SqlMetadataStore::cluster_nodes(self).await
    }

    async fn live_nodes(&self) -> Result<Vec<LiveNode>> {
        self.cluster_live_nodes().await
    }

    async fn stream_owner(&self, stream_id: u64) -> Result<StreamOwner> {
        self.cluster_stream_owner(stream_id).await
    }

    async fn claim_streams(&self, epoch: u64, stream_ids: &[u64]) -> Result<Vec<StreamClaim>> {
        self.cluster_claim(epoch, stream_ids).await
    }

    async fn commit_takeover(&self, epoch: u64, claims: &[(u64, u64)]) -> Result<()> {
        self.cluster_commit_takeover(epoch, claims).await
    }

    async fn orphaned_streams(&self, limit: usize) -> Result<Vec<OrphanedStream>> {
        self.cluster_orphans(limit).await
    }

    async fn stream_changes(&self, epoch: u64, since_ms: i64) -> Result<(Vec<StreamChange>, i64)> {
        self.cluster_stream_changes(epoch, since_ms).await
    }

    async fn dead_logs(&self, dead_for_ms: u64) -> Result<Vec<u64>> {
        self.cluster_dead_logs(dead_for_ms).await
    }

    async fn legacy_logs_needed(&self) -> Result<bool> {
        self.cluster_legacy_logs_needed().await
    }

    async fn forget_node(&self, epoch: u64) -> Result<()> {
        self.cluster_forget_node(epoch).await
    }

    async fn commit_compaction(
        &self,
        commit: &CompactionCommit,
        obsolete_after: OffsetDateTime,
    ) -> Result<()> {
        let mut tx = self.write_transaction().await?;
        if let Some(node) = commit.committed_by {
            self.check_intact(&mut tx, node).await?;
            for id in &commit.skipped_streams {
                let log: Option<i64> = sqlx::query_scalar(
                    "SELECT l.log_epoch FROM stream_leases l JOIN streams s ON s.id = l.stream_id \
                     WHERE l.stream_id = $1 AND s.deleted_at_ms IS NULL",
                )
                .bind(*id as i64)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
                if log == Some(node as i64) {
                    // Handed over, and not yet taken up by its new owner, which reads
                    // its records from this log: the commit must wait until it has.
                    return Err(Error::StreamMoved);
                }
            }
        }
        let mut live = std::collections::HashMap::new();
        let ids = commit.segments.iter().map(|s| s.stream_id);
        for id in ids.chain(commit.checkpoints.iter().map(|(id, _)| *id)) {
            if let std::collections::hash_map::Entry::Vacant(slot) = live.entry(id) {
                let owner = live_stream_owner(&mut tx, id).await?;
                // A node commits only for streams it holds: one it handed over is
                // rebuilt by its new owner from the log, and must not be indexed twice.
                if let (Some(node), Some(Some(owner))) = (commit.committed_by, owner) {
                    if owner != node as i64 {
                        return Err(Error::StreamMoved);
                    }
                }
                slot.insert(owner.is_some());
            }
        }
        let mut orphans = Vec::new();
        for segment in &commit.segments {
            if !live[&segment.stream_id] {
                orphans.push(segment.key.clone());
                continue;
            }
            upsert_segment(&mut tx, segment).await?;
        }
        for (id, checkpoint) in commit.checkpoints.iter().filter(|(id, _)| live[id]) {
            sqlx::query(
                "INSERT INTO stream_checkpoints (stream_id, next_seq, last_timestamp, fencing_token, trim_point, groups, next_group_op) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (stream_id) DO UPDATE SET \
                 next_seq = excluded.next_seq, last_timestamp = excluded.last_timestamp, \
                 fencing_token = excluded.fencing_token, trim_point = excluded.trim_point, \
                 groups = excluded.groups, next_group_op = excluded.next_group_op \
                 WHERE excluded.next_seq >= stream_checkpoints.next_seq \
                 AND excluded.next_group_op >= stream_checkpoints.next_group_op",
            )
            .bind(*id as i64)
            // Stored bit for bit (never compared in a query), so restored exactly.
            .bind(checkpoint.next_seq as i64)
            .bind(checkpoint.last_timestamp as i64)
            // Bytes: a token may hold any UTF-8, NUL included, which TEXT refuses.
            .bind(checkpoint.fencing_token.as_bytes())
            .bind(checkpoint.trim_point as i64)
            .bind(
                (!checkpoint.groups.is_empty())
                    .then(|| serde_json::to_vec(&*checkpoint.groups).expect("groups serialize")),
            )
            .bind(checkpoint.next_group_op as i64)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        }
        for (epoch, next_chunk) in &commit.wal_watermarks {
            sqlx::query(
                "INSERT INTO wal_watermarks (epoch, next_chunk) VALUES ($1, $2) \
                 ON CONFLICT (epoch) DO UPDATE SET next_chunk = excluded.next_chunk \
                 WHERE excluded.next_chunk > wal_watermarks.next_chunk",
            )
            .bind(*epoch as i64)
            .bind(*next_chunk as i64)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        }
        mark_obsolete(&mut tx, &orphans, obsolete_after).await?;
        mark_obsolete(&mut tx, &commit.obsolete_objects, obsolete_after).await?;
        tx.commit().await.map_err(db)
    }

    async fn stream_checkpoints(&self) -> Result<BTreeMap<u64, StreamCheckpoint>> {
        let rows = sqlx::query(&format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM stream_checkpoints"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter().map(checkpoint_from_row).collect()
    }

    async fn stream_checkpoint(&self, stream_id: u64) -> Result<Option<StreamCheckpoint>> {
        let row = sqlx::query(&format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM stream_checkpoints WHERE stream_id = $1"
        ))
        .bind(stream_id as i64)
        .fetch_optional(&self.pool)
        .await
        .map_err(db)?;
        row.as_ref()
            .map(|row| checkpoint_from_row(row).map(|(_, c)| c))
            .transpose()
    }

    async fn wal_watermarks(&self) -> Result<BTreeMap<u64, u64>> {
        let rows: Vec<(i64, i64)> = sqlx::query_as("SELECT epoch, next_chunk FROM wal_watermarks")
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
        Ok(rows
            .into_iter()
            .map(|(epoch, next)| (epoch as u64, next as u64))
            .collect())
    }

    async fn segment_at(&self, stream_id: u64, seq_num: u64) -> Result<Option<SegmentRecord>> {
        sqlx::query(&format!(
            "SELECT {SEGMENT_COLUMNS} FROM segments WHERE stream_id = $1 AND end_seq > $2 \
             ORDER BY end_seq LIMIT 1"
        ))
        .bind(stream_id as i64)
        .bind(column(seq_num))
        .fetch_optional(&self.pool)
        .await
        .map_err(db)?
        .as_ref()
        .map(segment_from_row)
        .transpose()
    }

    async fn segment_at_timestamp(
        &self,
        stream_id: u64,
        timestamp: u64,
    ) -> Result<Option<SegmentRecord>> {
        sqlx::query(&format!(
            "SELECT {SEGMENT_COLUMNS} FROM segments WHERE stream_id = $1 AND last_timestamp >= $2 \
             ORDER BY last_timestamp, end_seq LIMIT 1"
        ))
        .bind(stream_id as i64)
        .bind(column(timestamp))
        .fetch_optional(&self.pool)
        .await
        .map_err(db)?
        .as_ref()
        .map(segment_from_row)
        .transpose()
    }

    async fn newest_segments(&self, stream_id: u64, limit: usize) -> Result<Vec<SegmentRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {SEGMENT_COLUMNS} FROM segments WHERE stream_id = $1 \
             ORDER BY start_seq DESC LIMIT $2"
        ))
        .bind(stream_id as i64)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        let mut segments = rows
            .iter()
            .map(segment_from_row)
            .collect::<Result<Vec<_>>>()?;
        segments.reverse();
        Ok(segments)
    }

    async fn merge_segments(
        &self,
        merged: &SegmentRecord,
        replaced: &[String],
        committed_by: Option<u64>,
        obsolete_after: OffsetDateTime,
    ) -> Result<bool> {
        let mut tx = self.write_transaction().await?;
        if let Some(node) = committed_by {
            self.check_intact(&mut tx, node).await?;
        }
        let held_elsewhere = match live_stream_owner(&mut tx, merged.stream_id).await? {
            None => true, // gone
            Some(owner) => {
                matches!((committed_by, owner), (Some(node), Some(owner)) if owner != node as i64)
            }
        };
        if held_elsewhere {
            return Ok(false);
        }
        let current: Vec<String> = sqlx::query_scalar(
            "SELECT object_key FROM segments WHERE stream_id = $1 AND start_seq >= $2 \
             AND start_seq < $3 ORDER BY start_seq",
        )
        .bind(merged.stream_id as i64)
        .bind(column(merged.start_seq()))
        .bind(column(merged.end_seq()))
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        if current != replaced {
            return Ok(false);
        }
        sqlx::query(
            "DELETE FROM segments WHERE stream_id = $1 AND start_seq >= $2 AND start_seq < $3",
        )
        .bind(merged.stream_id as i64)
        .bind(column(merged.start_seq()))
        .bind(column(merged.end_seq()))
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        upsert_segment(&mut tx, merged).await?;
        mark_obsolete(&mut tx, replaced, obsolete_after).await?;
        tx.commit().await.map_err(db)?;
        Ok(true)
    }

    async fn drop_segments(
        &self,
        stream_id: u64,
        trim_point: u64,
        written_before_ms: u64,
        limit: usize,
        obsolete_after: OffsetDateTime,
    ) -> Result<usize> {
        let mut tx = self.write_transaction().await?;
        // Both conditions select a prefix of the stream's segments (rounds write them in
        // order), so the selection ends at the last start it returns.
        let starts: Vec<i64> = sqlx::query_scalar(
            "SELECT start_seq FROM segments WHERE stream_id = $1 \
             AND (end_seq <= $2 OR written_at_ms < $3) ORDER BY end_seq LIMIT $4",
        )
        .bind(stream_id as i64)
        .bind(column(trim_point))
        .bind(column(written_before_ms))
        .bind(limit as i64)
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        if let Some(last) = starts.last() {
            retire_segments(&mut tx, stream_id, *last, obsolete_after).await?;
        }
        tx.commit().await.map_err(db)?;
        Ok(starts.len())
    }

    async fn obsolete_objects(&self, now: OffsetDateTime, limit: usize) -> Result<Vec<String>> {
        sqlx::query_scalar(
            "SELECT object_key FROM obsolete_objects WHERE deletable_at_ms <= $1 \
             ORDER BY deletable_at_ms, object_key LIMIT $2",
        )
        .bind(to_ms(now))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(db)
    }

    async fn forget_obsolete_objects(&self, keys: &[String]) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        for batch in keys.chunks(KEYS_PER_STATEMENT) {
            let listed = placeholders(batch.len(), 1).collect::<Vec<_>>().join(", ");
            let sql = format!("DELETE FROM obsolete_objects WHERE object_key IN ({listed})");
            let mut query = sqlx::query(&sql);
            for key in batch {
                query = query.bind(key);
            }
            query.execute(&mut *tx).await.map_err(db)?;
        }
        tx.commit().await.map_err(db)
    }

    async fn put_access_token(
        &self,
        token: &AccessTokenInfo,
        secret_digest: &[u8],
        replace: bool,
    ) -> Result<()> {
        let mut tx = self.write_transaction().await?;
        let exists = sqlx::query("SELECT 1 FROM access_tokens WHERE id = $1")
            .bind(&token.id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?
            .is_some();
        if exists && !replace {
            tx.rollback().await.map_err(db)?; // release the write lock now
            return Err(Error::AlreadyExists(Resource::AccessToken(
                token.id.to_string(),
            )));
        }
        sqlx::query("DELETE FROM access_tokens WHERE id = $1")
            .bind(&token.id)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query("INSERT INTO access_tokens (id, secret_digest, info) VALUES ($1, $2, $3)")
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
            sqlx::query("SELECT info, secret_digest FROM access_tokens WHERE secret_digest = $1")
                .bind(digest)
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
        row.map(|row| Ok((parse_json(row.get("info"))?, row.get("secret_digest"))))
            .transpose()
    }

    async fn list_access_tokens(&self, range: &ListRange) -> Result<ListPage<AccessTokenInfo>> {
        let info = |row: &AnyRow| parse_json(row.get("info"));
        self.page("SELECT info FROM access_tokens", "id", None, range, info)
            .await
    }

    async fn delete_access_token(&self, id: &str) -> Result<bool> {
        let result = sqlx::query("DELETE FROM access_tokens WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(result.rows_affected() > 0)
    }

    async fn add_usage(&self, counts: &[UsageRow], gauges: &[UsageRow]) -> Result<()> {
        self.usage_add(counts, gauges).await
    }

    async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsagePoint>> {
        self.usage_read(query).await
    }

    async fn expire_usage(&self, resolution: Resolution, before: u64) -> Result<()> {
        self.usage_expire(resolution, before).await
    }

    async fn stored_bytes(&self) -> Result<Vec<StoredBytes>> {
        self.usage_stored_bytes().await
    }

    async fn basins_with_streams(&self, from_ms: i64, to_ms: i64) -> Result<Vec<String>> {
        self.usage_basins_with_streams(from_ms, to_ms).await
    }
}

/// A basin or stream row as a create call that finds it sees it.
trait CreatedRow {
    fn deleted_at(&self) -> Option<OffsetDateTime>;
    /// What identified the create call that made it.
    fn idempotency_key(&self) -> &Option<String>;
}

impl CreatedRow for BasinRecord {
    fn deleted_at(&self) -> Option<OffsetDateTime> {
        self.deleted_at
    }
    fn idempotency_key(&self) -> &Option<String> {
        &self.idempotency_key
    }
}

impl CreatedRow for StreamRecord {
    fn deleted_at(&self) -> Option<OffsetDateTime> {
        self.deleted_at
    }
    fn idempotency_key(&self) -> &Option<String> {
        &self.idempotency_key
    }
}

/// Ends a create that found a row of the same name: the transaction ends at once (a
/// dropped one would hold the write lock until its connection is next used), then the
/// existing row is returned if this call retries the one that created it (same
/// idempotency key); otherwise the name of `resource` is taken: deletion pending, or
/// a conflict.
async fn found_existing<T: CreatedRow>(
    tx: sqlx::Transaction<'static, sqlx::Any>,
    existing: T,
    requested_key: &Option<String>,
    resource: Resource,
) -> Result<Created<T>> {
    tx.rollback().await.map_err(db)?;
    if existing.deleted_at().is_some() {
        Err(Error::DeletionPending(resource))
    } else if requested_key.is_some() && existing.idempotency_key() == requested_key {
        Ok(Created::Existing(existing))
    } else {
        Err(Error::AlreadyExists(resource))
    }
}

#[cfg(test)]
mod tests {
    use super::SqlMetadataStore;

    #[tokio::test]
    async fn sqlite_passes_the_metadata_store_conformance_suite() {
        let (store, _dir) = SqlMetadataStore::temporary().await;
        super::super::metadata::conformance(&store).await;
    }

    /// Against the PostgreSQL server `STREAMGATE_TEST_POSTGRES` names (by default the
    /// local one), in a database of its own that `connect_postgres` creates.
    #[tokio::test]
    async fn postgres_passes_the_metadata_store_conformance_suite() {
        let server = streamgate_tests::backends::postgres_server();
        let name = format!("streamgate_test_{:016x}", rand::random::<u64>());
        let store = SqlMetadataStore::connect_postgres(&format!("{server}/{name}"))
            .await
            .unwrap_or_else(|e| {
                panic!("PostgreSQL at {server} (start one, or set STREAMGATE_TEST_POSTGRES): {e}")
            });
        super::super::metadata::conformance(&store).await;
        // Opening it again finds the schema in place.
        SqlMetadataStore::connect_postgres(&format!("{server}/{name}"))
            .await
            .unwrap();
    }
}
