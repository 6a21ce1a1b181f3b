//! `ObjectStore` on any S3-compatible bucket (aws-sdk-s3): AWS S3, or a local S3 server
//! with path-style addressing. Endpoint, region and credentials come from the standard
//! AWS environment (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, profiles, ...);
//! requests that fail with 5xx, throttling or timeouts are retried with backoff.

use std::ops::Range;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::SdkError;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;
use bytes::Bytes;

use super::ObjectStore;
use crate::error::{Error, Result};

pub struct S3ObjectStore {
    client: Client,
    bucket: String,
    /// Prepended to every key (empty, or ending in `/`).
    prefix: String,
}

/// Where an `s3://bucket/prefix` URL points, and how to reach it.
#[derive(Debug, Clone, Default)]
pub struct S3Location {
    pub bucket: String,
    pub prefix: String,
    /// An S3-compatible server instead of AWS (also read from `AWS_ENDPOINT_URL`).
    pub endpoint: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), which local S3 servers need; on
    /// whenever an endpoint is given.
    pub force_path_style: bool,
}

impl S3Location {
    /// Parses `s3://bucket[/prefix]`.
    pub fn parse(url: &str) -> Result<S3Location> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| Error::invalid(format!("`{url}` is not an s3://bucket/prefix URL")))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(Error::invalid(format!("`{url}` names no bucket")));
        }
        let prefix = prefix.trim_matches('/');
        Ok(S3Location {
            bucket: bucket.to_owned(),
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
            ..Default::default()
        })
    }
}

impl S3ObjectStore {
    /// Connects, and creates the bucket if it does not exist yet.
    pub async fn connect(location: S3Location) -> Result<Self> {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(3)
                    .with_initial_backoff(Duration::from_millis(50))
                    .with_max_backoff(Duration::from_secs(1)),
            )
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(20))
                    .build(),
            );
        if let Some(endpoint) = &location.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        let shared = loader.load().await;
        let path_style = location.force_path_style || shared.endpoint_url().is_some();
        let config = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(path_style)
            .build();
        let store = S3ObjectStore {
            client: Client::from_conf(config),
            bucket: location.bucket,
            prefix: location.prefix,
        };
        store.ensure_bucket().await?;
        Ok(store)
    }

    async fn ensure_bucket(&self) -> Result<()> {
        match self.client.head_bucket().bucket(&self.bucket).send().await {
            Ok(_) => Ok(()),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_not_found()) => {
                match self
                    .client
                    .create_bucket()
                    .bucket(&self.bucket)
                    .send()
                    .await
                {
                    Ok(_) => {
                        tracing::info!(bucket = %self.bucket, "created the S3 bucket");
                        Ok(())
                    }
                    Err(err)
                        if err.as_service_error().is_some_and(|e| {
                            e.is_bucket_already_owned_by_you() || e.is_bucket_already_exists()
                        }) =>
                    {
                        Ok(())
                    }
                    Err(err) => Err(s3_error("creating the bucket", &self.bucket, err)),
                }
            }
            Err(err) => Err(s3_error("reaching the bucket", &self.bucket, err)),
        }
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
}

/// Turns an SDK failure into an error that says what failed and why. Failures to reach
/// S3 or to get an answer (connection refused or reset, timeouts, 5xx, throttling) are
/// `Unavailable`: waiting and retrying fixes them. Refusals (403, a missing bucket, ...)
/// are `Storage` errors, which need an operator.
fn s3_error<E>(what: &str, key: &str, err: SdkError<E, HttpResponse>) -> Error
where
    E: std::error::Error + 'static,
{
    let transient = match &err {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(_) => err
            .raw_response()
            .map(|response| response.status().as_u16())
            .is_some_and(|status| status >= 500 || status == 429),
        _ => false,
    };
    let message = format!("S3 {what} `{key}`: {}", with_causes(&err));
    if transient {
        Error::Unavailable(message)
    } else {
        Error::storage(message)
    }
}

/// The error and its source chain: the SDK's own Display is terse.
fn with_causes(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// How long one request may take before it is abandoned as unanswered (a network black
/// hole, a stalled server): a base, plus time to move `bytes` at a slow rate.
fn request_deadline(bytes: usize) -> Duration {
    const BASE: Duration = Duration::from_secs(5);
    const SLOWEST_BYTES_PER_SEC: f64 = 1024.0 * 1024.0;
    BASE + Duration::from_secs_f64(bytes as f64 / SLOWEST_BYTES_PER_SEC)
}

/// Runs one S3 request with its deadline (see `request_deadline`).
async fn bounded<T>(
    what: &str,
    key: &str,
    bytes: usize,
    request: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let unanswered = || format!("S3 {what} `{key}`");
    super::deadline::within(request_deadline(bytes), unanswered, request).await
}

/// What a whole-object read is assumed to move when its size is not known: the largest
/// object streamgate writes (a full WAL chunk or segment).
const LARGEST_OBJECT: usize = 8 * 1024 * 1024;

#[async_trait]
impl ObjectStore for S3ObjectStore {
    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        // A PUT is atomic: the object appears whole or not at all, and is durable in S3
        // once acknowledged.
        let size = data.len();
        let request = async {
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(self.key(key))
                .body(ByteStream::from(data))
                .send()
                .await
                .map_err(|e| s3_error("put", key, e))?;
            Ok(())
        };
        bounded("put", key, size, request).await
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        let request = async {
            let response = self
                .client
                .get_object()
                .bucket(&self.bucket)
                .key(self.key(key))
                .send()
                .await;
            match response {
                Ok(object) => {
                    let body = object.body.collect().await.map_err(|e| {
                        Error::Unavailable(format!("S3 get `{key}`: {}", with_causes(&e)))
                    })?;
                    Ok(Some(body.into_bytes()))
                }
                Err(err) if err.as_service_error().is_some_and(|e| e.is_no_such_key()) => Ok(None),
                Err(err) => Err(s3_error("get", key, err)),
            }
        };
        bounded("get", key, LARGEST_OBJECT, request).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let request = async {
            let object = self
                .client
                .get_object()
                .bucket(&self.bucket)
                .key(self.key(key))
                .range(format!("bytes={}-{}", range.start, range.end - 1))
                .send()
                .await
                .map_err(|e| s3_error("get", key, e))?;
            let body = object
                .body
                .collect()
                .await
                .map_err(|e| Error::Unavailable(format!("S3 get `{key}`: {}", with_causes(&e))))?
                .into_bytes();
            if body.len() as u64 != range.end - range.start {
                return Err(Error::storage(format!(
                    "S3 get `{key}`: range {range:?} is outside the object"
                )));
            }
            Ok(body)
        };
        let size = usize::try_from(range.end - range.start).unwrap_or(usize::MAX);
        bounded("get", key, size.min(LARGEST_OBJECT), request).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let mut keys = Vec::new();
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(self.key(prefix))
            .into_paginator()
            .send();
        loop {
            // Each page (up to 1000 keys) is one request with its own deadline.
            let page = bounded("list", prefix, 0, async { Ok(pages.next().await) }).await?;
            let Some(page) = page else { break };
            let page = page.map_err(|e| s3_error("list", prefix, e))?;
            keys.extend(
                page.contents()
                    .iter()
                    .filter_map(|object| object.key())
                    .filter_map(|key| key.strip_prefix(self.prefix.as_str()))
                    .map(str::to_owned),
            );
        }
        keys.sort();
        Ok(keys)
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let request = async {
            self.client
                .delete_object()
                .bucket(&self.bucket)
                .key(self.key(key))
                .send()
                .await
                .map_err(|e| s3_error("delete", key, e))?;
            Ok(())
        };
        bounded("delete", key, 0, request).await
    }

    fn describe(&self) -> String {
        format!("S3 s3://{}/{}", self.bucket, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_bucket_and_a_prefix() {
        let plain = S3Location::parse("s3://records").unwrap();
        assert_eq!(
            (plain.bucket.as_str(), plain.prefix.as_str()),
            ("records", "")
        );
        let nested = S3Location::parse("s3://records/prod/eu/").unwrap();
        assert_eq!(nested.prefix, "prod/eu/");
        assert!(S3Location::parse("s3://").is_err());
        assert!(S3Location::parse("file:///tmp").is_err());
    }

    /// Against the S3 server `STREAMGATE_TEST_S3_ENDPOINT` names (scripts/test.sh starts
    /// moto), in a bucket of its own.
    #[tokio::test]
    async fn passes_the_object_store_conformance_suite() {
        let endpoint = streamgate_tests::backends::s3_endpoint();
        let bucket = format!("streamgate-test-{:016x}", rand::random::<u64>());
        let store = S3ObjectStore::connect(S3Location {
            endpoint: Some(endpoint),
            ..S3Location::parse(&format!("s3://{bucket}/some/prefix")).unwrap()
        })
        .await
        .unwrap();
        super::super::objects::conformance(&store).await;
    }
}
