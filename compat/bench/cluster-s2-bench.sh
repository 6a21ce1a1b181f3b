#!/usr/bin/env bash
# The official `s2 bench` through a cluster: the write throughput of one streamgate node,
# then the sum over three nodes on one PostgreSQL database and one bucket, each node
# driven by an `s2 bench` of its own at the same time (their streams are placed over
# the nodes by id, so most appends are forwarded to another node, as for clients behind
# a load balancer). Records are on S3: `STREAMGATE_TEST_S3_ENDPOINT`, or a moto server
# started here from .venv-compat; PostgreSQL is `STREAMGATE_TEST_POSTGRES` (default the
# local server). A fresh database and bucket per cluster.
#
#   compat/bench/cluster-s2-bench.sh [seconds]    (needs the s2 CLI and a release build)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-10}"
s2="${S2_CLI:-$(command -v s2 || echo "$HOME/.cargo/bin/s2")}"
postgres="${STREAMGATE_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432}"
fail() { echo "cluster-s2-bench: $*" >&2; exit 1; }
[ -x "$s2" ] || fail "the s2 CLI is missing: cargo install --locked s2-cli --version 0.43.4"
work="$(mktemp -d "$PWD/target/cluster-s2-bench.XXXX")"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
cargo build --release --quiet --bin streamgate

export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
export AWS_REGION="${AWS_REGION:-us-east-1}"
s3="${STREAMGATE_TEST_S3_ENDPOINT:-}"
if [ -z "$s3" ]; then
  [ -x .venv-compat/bin/moto_server ] || fail "no S3 server: set STREAMGATE_TEST_S3_ENDPOINT or install moto into .venv-compat"
  .venv-compat/bin/moto_server -H 127.0.0.1 -p 15055 >"$work/moto.log" 2>&1 &
  s3="http://127.0.0.1:15055"
  for _ in $(seq 1 50); do curl -s -o /dev/null "$s3" && break; sleep 0.2; done
fi
curl -s -o /dev/null "$s3" || fail "the S3 server at $s3 does not answer"

token="cluster-bench-root-token-$RANDOM$RANDOM"
export S2_ACCESS_TOKEN="$token" NO_COLOR=1

# start_cluster NODES TAG: NODES nodes on database and bucket TAG, on ports 1909N.
nodes=()
start_cluster() {
  nodes=()
  for node in $(seq 0 $(($1 - 1))); do
    target/release/streamgate --data-dir "$work/$2-node$node" --listen "127.0.0.1:1909$node" \
      --resp-listen off --root-token "$token" --log warn \
      --metadata "$postgres/streamgate_bench_$2" --objects "s3://streamgate-bench-$2/records" \
      --s3-endpoint "$s3" >"$work/$2-node$node.log" 2>&1 &
    nodes+=($!)
  done
  for node in $(seq 0 $(($1 - 1))); do
    for _ in $(seq 1 100); do
      curl -sf -o /dev/null "http://127.0.0.1:1909$node/ready" && break
      sleep 0.2
    done
    curl -sf -o /dev/null "http://127.0.0.1:1909$node/ready" \
      || fail "node $node did not start: $(tail -3 "$work/$2-node$node.log")"
  done
}

stop_cluster() {
  kill "${nodes[@]}" 2>/dev/null || true
  wait "${nodes[@]}" 2>/dev/null || true
}

# bench_node NODE BASIN: an `s2 bench` through node NODE; prints its write MiB/s.
bench_node() {
  local endpoint="http://127.0.0.1:1909$1"
  S2_ACCOUNT_ENDPOINT="$endpoint" S2_BASIN_ENDPOINT="$endpoint" "$s2" create-basin "$2" >/dev/null 2>&1 \
    || fail "could not create basin $2 through node $1"
  S2_ACCOUNT_ENDPOINT="$endpoint" S2_BASIN_ENDPOINT="$endpoint" "$s2" bench "$2" \
    --duration "${seconds}s" --target-mibps 1000 --record-size 8192 --catchup-delay 0s \
    >"$work/bench-$2.log" 2>&1 || fail "s2 bench through node $1 failed: $(tail -3 "$work/bench-$2.log")"
}

# write_mibps BASIN: the write throughput `s2 bench` reported for BASIN.
write_mibps() {
  local mibps
  mibps="$(grep -E '^Write' "$work/bench-$1.log" | grep -oE '[0-9]+(\.[0-9]+)? MiB/s' | head -1 | cut -d' ' -f1)"
  [ -n "$mibps" ] || fail "no write throughput in the s2 bench output for $1: $(head -20 "$work/bench-$1.log")"
  echo "$mibps"
}

tag="$$$RANDOM"
echo "### one node, ${seconds}s, 8 KiB records, saturating"
start_cluster 1 "one$tag"
bench_node 0 "bench-one-0"
echo "node 0: $(write_mibps bench-one-0) MiB/s"
stop_cluster

echo "### three nodes, one s2 bench through each at once, ${seconds}s, 8 KiB records, saturating"
start_cluster 3 "three$tag"
pids=()
for node in 0 1 2; do
  bench_node "$node" "bench-three-$node" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || fail "an s2 bench failed"; done
total=0
for node in 0 1 2; do
  mibps="$(write_mibps "bench-three-$node")"
  echo "node $node: $mibps MiB/s"
  total="$(awk -v a="$total" -v b="$mibps" 'BEGIN { print a + b }')"
done
echo "three nodes together: $total MiB/s"
