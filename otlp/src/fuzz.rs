//! Entry points for the fuzzers (`fuzz/`), also replayed over the committed corpus by
//! `cargo test` (`tests/tests/fuzz_corpus.rs`). Each takes arbitrary bytes and must
//! neither panic nor allocate without bound; each asserts a property that must hold for
//! every input.

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

use crate::request::{self, Encoding};
use crate::signal::Signal;

/// An export request of the signal and encoding the first byte picks, taken apart with a
/// small record limit (so splitting is exercised): every record body fits the limit and
/// reads back as an export request of exactly one resource group.
pub fn export(data: &[u8]) {
    let Some((&choice, body)) = data.split_first() else {
        return;
    };
    let signal = [Signal::Traces, Signal::Metrics, Signal::Logs][usize::from(choice) % 3];
    let encoding = if choice & 0x80 == 0 {
        Encoding::Protobuf
    } else {
        Encoding::Json
    };
    let limit = 256 + usize::from(choice & 0x70) * 64;
    let Ok(groups) = request::parse(signal, encoding, &Bytes::copy_from_slice(body), limit) else {
        return;
    };
    for group in groups {
        let Ok((_, bodies)) = group.target else {
            continue;
        };
        for body in bodies {
            assert!(body.len() <= limit, "a record body fits in a record");
            assert_eq!(
                groups_in(signal, encoding, &body),
                Some(1),
                "a record holds one group"
            );
        }
    }
}

/// How many resource groups an export request holds, if it decodes.
fn groups_in(signal: Signal, encoding: Encoding, body: &[u8]) -> Option<usize> {
    match (signal, encoding) {
        (Signal::Traces, Encoding::Protobuf) => ExportTraceServiceRequest::decode(body)
            .ok()
            .map(|r| r.resource_spans.len()),
        (Signal::Metrics, Encoding::Protobuf) => ExportMetricsServiceRequest::decode(body)
            .ok()
            .map(|r| r.resource_metrics.len()),
        (Signal::Logs, Encoding::Protobuf) => ExportLogsServiceRequest::decode(body)
            .ok()
            .map(|r| r.resource_logs.len()),
        (Signal::Traces, Encoding::Json) => {
            serde_json::from_slice::<ExportTraceServiceRequest>(body)
                .ok()
                .map(|r| r.resource_spans.len())
        }
        (Signal::Metrics, Encoding::Json) => {
            serde_json::from_slice::<ExportMetricsServiceRequest>(body)
                .ok()
                .map(|r| r.resource_metrics.len())
        }
        (Signal::Logs, Encoding::Json) => serde_json::from_slice::<ExportLogsServiceRequest>(body)
            .ok()
            .map(|r| r.resource_logs.len()),
    }
}
