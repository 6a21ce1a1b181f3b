#!/usr/bin/env bash
# Runs every streamgate test: the Rust suites (unit, engine, black-box HTTP, crash and
# drain, Rust SDK compatibility) and the Python SDK compatibility suite.
# Needs: a Rust toolchain and python3 (with venv). Installs the Python SDK into
# .venv-compat on first use. Exits non-zero when any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> building streamgate"
cargo build --locked --bin streamgate
export STREAMGATE_BIN="$PWD/target/debug/streamgate"

echo "==> Rust test suites"
cargo test --locked --workspace

echo "==> Python SDK compatibility suite"
venv=.venv-compat
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r compat/python/requirements.txt
"$venv/bin/python" -m pytest -q compat/python

echo "==> TypeScript SDK compatibility suite (Node.js)"
(cd compat/node && npm ci --no-audit --no-fund --silent && node --test)
