//! `/v1/metrics`, `/v1/metrics/{basin}`, `/v1/metrics/{basin}/{stream}`: usage of the
//! account, a basin or a stream (the S2 metrics API), as the engine answers it, in the
//! spec's JSON: `{"values": [{"accumulation": {...}} | {"gauge": {...}} | {"label":
//! {...}}]}`, timeseries as `[epoch seconds, value]` pairs.

use axum::extract::Path;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use streamgate_core::metrics::Metric;
use streamgate_core::names::{BasinName, StreamName};

use super::error::{ApiError, ApiResult};
use super::extract::{ApiQuery, Authenticated};

#[derive(Debug, Deserialize)]
pub struct MetricsQuery {
    set: Option<String>,
    start: Option<u64>,
    end: Option<u64>,
    interval: Option<String>,
}

pub async fn account(
    Authenticated(caller): Authenticated,
    ApiQuery(query): ApiQuery<MetricsQuery>,
) -> ApiResult<Json<Value>> {
    answer(&caller, None, None, query).await
}

pub async fn basin(
    Authenticated(caller): Authenticated,
    Path(basin): Path<String>,
    ApiQuery(query): ApiQuery<MetricsQuery>,
) -> ApiResult<Json<Value>> {
    let basin = BasinName::new(basin).map_err(ApiError::bad_path)?;
    answer(&caller, Some(&basin), None, query).await
}

pub async fn stream(
    Authenticated(caller): Authenticated,
    Path((basin, stream)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<MetricsQuery>,
) -> ApiResult<Json<Value>> {
    let basin = BasinName::new(basin).map_err(ApiError::bad_path)?;
    let stream = StreamName::new(stream).map_err(ApiError::bad_path)?;
    answer(&caller, Some(&basin), Some(&stream), query).await
}

async fn answer(
    caller: &streamgate_core::Caller,
    basin: Option<&BasinName>,
    stream: Option<&StreamName>,
    query: MetricsQuery,
) -> ApiResult<Json<Value>> {
    let set = query
        .set
        .as_deref()
        .ok_or_else(|| ApiError::invalid("`set` is required: the metric set to read"))?;
    let metrics = caller
        .metrics(
            basin,
            stream,
            set,
            (query.start, query.end),
            query.interval.as_deref(),
        )
        .await?;
    let values: Vec<Value> = metrics.iter().map(metric_json).collect();
    Ok(Json(json!({ "values": values })))
}

fn points(values: &[(u64, f64)]) -> Vec<Value> {
    values.iter().map(|(t, v)| json!([t, v])).collect()
}

fn metric_json(metric: &Metric) -> Value {
    match metric {
        Metric::Accumulation {
            name,
            unit,
            interval,
            values,
        } => json!({"accumulation": {
            "name": name,
            "unit": unit.name(),
            "interval": interval.name(),
            "values": points(values),
        }}),
        Metric::Gauge { name, unit, values } => json!({"gauge": {
            "name": name,
            "unit": unit.name(),
            "values": points(values),
        }}),
        Metric::Label { name, values } => json!({"label": {"name": name, "values": values}}),
    }
}
