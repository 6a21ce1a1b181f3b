# Sourced by scripts/test.sh and scripts/soak.sh: the storage services the suites run
# against on their PostgreSQL + S3 pass. Each function exits the calling script with a
# message when its service cannot be had.

# PostgreSQL at STREAMGATE_TEST_POSTGRES (default postgres://postgres@127.0.0.1:5432),
# which must answer; exported for the tests. Each test server gets a database of its own
# there, which streamgate creates.
require_postgres() {
  export STREAMGATE_TEST_POSTGRES="${STREAMGATE_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432}"
  if ! psql "$STREAMGATE_TEST_POSTGRES/postgres" -qAtc 'select 1' >/dev/null; then
    echo "PostgreSQL does not answer at $STREAMGATE_TEST_POSTGRES: start it, or set STREAMGATE_TEST_POSTGRES (.ci/run installs one)" >&2
    exit 1
  fi
}

# Drops the test databases an earlier run left behind.
drop_stale_test_databases() {
  psql "$STREAMGATE_TEST_POSTGRES/postgres" -qAtc \
    "select datname from pg_database where datname like 'streamgate\_test\_%'" |
    while read -r stale; do psql "$STREAMGATE_TEST_POSTGRES/postgres" -qc "drop database \"$stale\""; done
}

# An S3 server: the one at STREAMGATE_TEST_S3_ENDPOINT if that is set, otherwise moto
# from the virtual environment $1 (which must have it installed), started here on a free
# port and stopped when the calling script exits. Exports the endpoint and the (dummy)
# AWS credentials and region the S3 client needs.
require_s3_server() {
  local venv=$1
  if [ -z "${STREAMGATE_TEST_S3_ENDPOINT:-}" ]; then
    local port
    port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    mkdir -p target
    "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" > target/moto.log 2>&1 &
    moto_pid=$!
    trap 'kill "$moto_pid" 2>/dev/null || true' EXIT
    for _ in $(seq 1 50); do
      curl -fs -o /dev/null "http://127.0.0.1:$port/" && break
      sleep 0.2
    done
    export STREAMGATE_TEST_S3_ENDPOINT="http://127.0.0.1:$port"
  fi
  export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
  export AWS_REGION="${AWS_REGION:-us-east-1}"
}
