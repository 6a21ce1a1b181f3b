#!/usr/bin/env bash
# Runs test suites of the official Rust SDK itself (crate s2-sdk as published, the
# version compat/ builds against) against a fresh streamgate: its `metrics_ops` tests,
# with S2_METRICS_LONG=1 so the storage tests also require data. The crate's source
# comes from cargo's registry and is copied to a temporary directory (outside this
# workspace) to build there, with its build kept under target/; nothing of it is kept
# in the repository. Needs STREAMGATE_BIN (scripts/test.sh sets it). Exits
# non-zero when a test fails or the server does not start.
set -euo pipefail
cd "$(dirname "$0")/.."

binary=${STREAMGATE_BIN:?set STREAMGATE_BIN to a built streamgate binary}
version=$(awk '/^name = "s2-sdk"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
[ -n "$version" ] || { echo "s2-sdk is not in Cargo.lock" >&2; exit 1; }
cargo fetch --locked --quiet
source_dir=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"s2-sdk-$version" 2>/dev/null | head -1)
[ -d "$source_dir" ] || { echo "the source of s2-sdk $version is not in cargo's registry" >&2; exit 1; }
build_dir="$PWD/target/s2-sdk-own-tests"
data_dir=$(mktemp -d)
cp -r "$source_dir" "$data_dir/s2-sdk"
banner="$data_dir/banner"
"$binary" --data-dir "$data_dir/data" --listen 127.0.0.1:0 --resp-listen off \
  --root-token streamgate-test-root-token-0123456789 \
  --compaction-interval-ms 300 --storage-metrics-interval-secs 1 >"$banner" 2>"$data_dir/log" &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -rf "$data_dir"' EXIT
endpoint=""
for _ in $(seq 1 300); do
  endpoint=$(sed -n 's/.* listening on \(http[^ ]*\).*/\1/p' "$banner" | head -1)
  grep -q "export S2_ACCESS_TOKEN=" "$banner" && [ -n "$endpoint" ] && break
  kill -0 "$server" 2>/dev/null || { echo "streamgate exited:" >&2; cat "$data_dir/log" >&2; exit 1; }
  sleep 0.2
done
[ -n "$endpoint" ] || { echo "streamgate did not report its address" >&2; exit 1; }

echo "==> s2-sdk $version: tests/metrics_ops.rs against $endpoint"
(
  cd "$data_dir/s2-sdk"
  S2_ACCOUNT_ENDPOINT="$endpoint" S2_BASIN_ENDPOINT="$endpoint" \
    S2_ACCESS_TOKEN=streamgate-test-root-token-0123456789 S2_METRICS_LONG=1 \
    CARGO_TARGET_DIR="$build_dir" cargo test --locked --quiet --test metrics_ops
)
