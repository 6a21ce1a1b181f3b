#!/usr/bin/env bash
# Pipelined XADD throughput and latency with redis-benchmark, against streamgate's RESP
# listener (every reply after the entry is durable) and against the Redis server on this
# machine (in memory, no persistence), one after the other.
#
#   compat/bench/resp-bench.sh [requests] [pipeline]    (needs a release build, redis-benchmark)
set -euo pipefail
cd "$(dirname "$0")/../.."
requests="${1:-500000}"
pipeline="${2:-64}"
work="$(mktemp -d "$PWD/target/resp-bench.XXXX")"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cargo build --release --quiet --bin streamgate

token="resp-bench-root-token-$RANDOM$RANDOM"
target/release/streamgate --data-dir "$work/data" --listen 127.0.0.1:18090 --resp-listen 127.0.0.1:16390 \
  --root-token "$token" --log warn >/dev/null &
sleep 2
if ! curl -sf -X POST http://127.0.0.1:18090/v1/basins -H 'content-type: application/json' \
  -H "authorization: Bearer $token" \
  -d '{"basin":"resp-bench","config":{"create_stream_on_append":true}}' >/dev/null; then
  echo "resp-bench: streamgate did not create the benchmark basin; see its log" >&2
  exit 1
fi

for clients in 1 8; do
  echo "### streamgate, $clients connection(s), pipeline $pipeline, $requests XADDs"
  redis-benchmark -p 16390 --user resp-bench -a "$token" -c "$clients" -P "$pipeline" -n "$requests" \
    XADD "bench-$clients" '*' field value-of-sixteen-b 2>/dev/null | grep -E "throughput summary|avg|^ +[0-9]" | tail -3
  echo "### redis (in memory), $clients connection(s), pipeline $pipeline, $requests XADDs"
  redis-benchmark -p "${REDIS_PORT:-6379}" -c "$clients" -P "$pipeline" -n "$requests" \
    XADD "streamgate-bench-$clients" '*' field value-of-sixteen-b 2>/dev/null | grep -E "throughput summary|avg|^ +[0-9]" | tail -3
  redis-cli -p "${REDIS_PORT:-6379}" DEL "streamgate-bench-$clients" >/dev/null
done
