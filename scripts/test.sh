#!/usr/bin/env bash
# Runs every streamgate test: the Rust suites (unit, engine, black-box HTTP, sessions,
# crash and drain, access tokens, OTLP, encryption, metrics, Rust SDK and TLS
# compatibility), the Rust SDK's own metrics test suite, then the suites driven by the
# official clients: the s2 CLI, the Python SDK, redis-py, the OpenTelemetry Python
# exporters and a Collector build from PyPI (pytest), and the TypeScript SDK (on
# Node.js, and in headless Chromium from a page of another origin), node-redis, ioredis
# and the OpenTelemetry Node.js exporters (node --test). Needs a Rust
# toolchain, PostgreSQL (STREAMGATE_TEST_POSTGRES, default postgres://postgres@127.0.0.1:5432,
# with psql), python3 with venv (moto from PyPI is the S3 server), curl,
# Node.js with npm, redis-cli and redis-server (a Redis on 127.0.0.1:6379 is used if one
# runs; otherwise the comparison test starts its own).
# Installs the s2 CLI into ~/.cargo/bin and the Python SDK into .venv-compat on first
# use. Exits non-zero when any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/backends.sh

echo "==> PostgreSQL"
# The metadata-store conformance suite, the engine suite and the black-box suites also
# run against PostgreSQL, each test server in a database of its own that streamgate
# creates. Databases left by an earlier run are dropped first.
require_postgres
drop_stale_test_databases

echo "==> Python environment (client suites; moto, the S3 server)"
venv=.venv-compat
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r compat/python/requirements.txt

echo "==> S3 server (moto)"
# The object-store conformance suite and the engine and black-box suites run against
# a real S3-API server process over HTTP, each test in a bucket of its own.
require_s3_server "$venv"

echo "==> building streamgate and the test suites"
# Everything at once, so the binary and the tests share one build of each dependency
# (building the binary alone would resolve features without the dev-dependencies and
# compile much of the tree twice).
cargo build --locked --workspace --all-targets
export STREAMGATE_BIN="$PWD/target/debug/streamgate"

echo "==> Rust test suites"
cargo test --locked --workspace

echo "==> engine and black-box suites again, on PostgreSQL and S3"
export STREAMGATE_TEST_METADATA=postgres STREAMGATE_TEST_OBJECTS=s3
cargo test --locked -p streamgate-core --test engine
cargo test --locked -p streamgate-tests
unset STREAMGATE_TEST_METADATA STREAMGATE_TEST_OBJECTS

echo "==> the official Rust SDK's own metrics tests (tests/metrics_ops.rs of s2-sdk)"
compat/rust-sdk-own-tests.sh

echo "==> the official s2 CLI"
# Built once (about 12 minutes on two cores) into ~/.cargo/bin and reused afterwards.
if [ -z "${S2_CLI:-}" ]; then
  if ! command -v s2 >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/s2" ]; then
    cargo install --locked s2-cli --version 0.43.4
  fi
  S2_CLI="$(command -v s2 || echo "$HOME/.cargo/bin/s2")"
fi
export S2_CLI
"$S2_CLI" --version

echo "==> s2 CLI, Python SDK, redis-py, OpenTelemetry exporter and Collector suites"
"$venv/bin/python" -m pytest -q compat/python

echo "==> TypeScript SDK, node-redis, ioredis and OpenTelemetry exporter suites (Node.js)"
(cd compat/node && npm ci --no-audit --no-fund --silent && node --test)
