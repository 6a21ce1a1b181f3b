#!/usr/bin/env bash
# A soak of the kill -9 test (tests/tests/crash.rs,
# kill_9_under_load_loses_no_acknowledged_record): clients append through unary REST,
# S2S append sessions, pipelined XADDs and OTLP exports while the server is killed with
# kill -9 at a random moment, ROUNDS times (default 100; CI runs 12), with every
# acknowledged batch checked present exactly once after each restart. It runs once on the
# embedded default (SQLite and a local object directory) and once on PostgreSQL + S3
# (moto, as scripts/test.sh sets them up), and prints each run's summary line and wall
# time. Needs what scripts/test.sh needs for those two: a Rust toolchain, PostgreSQL
# (STREAMGATE_TEST_POSTGRES, with psql), and python3 with venv for moto unless
# STREAMGATE_TEST_S3_ENDPOINT names an S3 server already. Exits non-zero when a run fails;
# each run's output is in target/soak-<backend>.log.
#
#   scripts/soak.sh               # 100 rounds on each backend
#   ROUNDS=500 scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/backends.sh
rounds="${ROUNDS:-100}"
test_name=kill_9_under_load_loses_no_acknowledged_record

echo "==> PostgreSQL"
# Stale test databases are left alone: another test run may be using this server.
require_postgres

echo "==> S3 server"
venv=.venv-compat
if [ -z "${STREAMGATE_TEST_S3_ENDPOINT:-}" ]; then
  if [ ! -x "$venv/bin/moto_server" ]; then
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    # Only moto, at the version scripts/test.sh installs.
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
      "$(grep '^moto' compat/python/requirements.txt)"
  fi
fi
require_s3_server "$venv"

echo "==> building streamgate and the crash suite"
cargo build --locked --bin streamgate
export STREAMGATE_BIN="$PWD/target/debug/streamgate"
# Built before the clock starts, so the wall times are the soak's alone.
cargo test --locked -p streamgate-tests --test crash --no-run

failed=()
# soak LABEL [VAR=VALUE...]: one run of the test with the backend the variables choose.
soak() {
  local label=$1
  shift
  local log="target/soak-$label.log"
  echo "==> $rounds rounds on $label (output in $log)"
  local started=$SECONDS
  local status=0
  env -u STREAMGATE_TEST_METADATA -u STREAMGATE_TEST_OBJECTS "$@" \
    STREAMGATE_CRASH_ROUNDS="$rounds" \
    cargo test --locked -p streamgate-tests --test crash -- --exact "$test_name" --nocapture \
    >"$log" 2>&1 || status=$?
  local wall=$((SECONDS - started))
  if [ "$status" -eq 0 ] && grep -q '^summary:' "$log"; then
    echo "$label: $(grep '^summary:' "$log"); wall time ${wall} s"
  else
    echo "$label: FAILED (exit $status) after ${wall} s; the end of $log:" >&2
    tail -n 40 "$log" >&2
    failed+=("$label")
  fi
}

soak embedded
soak postgres+s3 STREAMGATE_TEST_METADATA=postgres STREAMGATE_TEST_OBJECTS=s3

if ((${#failed[@]})); then
  echo "soak failed on: ${failed[*]}" >&2
  exit 1
fi
