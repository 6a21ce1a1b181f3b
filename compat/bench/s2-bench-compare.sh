#!/usr/bin/env bash
# Runs the official `s2 bench` against streamgate and against `s2 lite --local-root`
# (the reference server shipped in the same CLI) on this machine, one after the other,
# at a saturating target (8 KiB and 1 KiB records) and at 10 MiB/s. Both acknowledge only durable writes.
#
#   compat/bench/s2-bench-compare.sh [seconds]      (needs the s2 CLI and a release build)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-10}"
s2="${S2_CLI:-$(command -v s2 || echo "$HOME/.cargo/bin/s2")}"
work="$(mktemp -d "$PWD/target/s2-bench.XXXX")"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cargo build --release --quiet --bin streamgate

token="s2-bench-root-token-$RANDOM$RANDOM"
run_bench() { # name port
  export S2_ACCOUNT_ENDPOINT="http://127.0.0.1:$2" S2_BASIN_ENDPOINT="http://127.0.0.1:$2"
  export S2_ACCESS_TOKEN="$token" NO_COLOR=1
  if ! "$s2" create-basin "bench-$1" >/dev/null; then
    echo "s2-bench-compare: could not create basin bench-$1 on $1" >&2
    exit 1
  fi
  for run in "1000 8192" "1000 1024" "10 8192"; do
    set -- "$1" $run
    echo "### $1, target $2 MiB/s, $3-byte records, ${seconds}s"
    "$s2" bench "bench-$1" --duration "${seconds}s" --target-mibps "$2" --record-size "$3" --catchup-delay 0s 2>&1 \
      | grep -E "^(Write|Read|Catchup)|min |p50|p90|p99|max |Statistics"
  done
}

target/release/streamgate --data-dir "$work/streamgate" --listen 127.0.0.1:18080 --resp-listen off \
  --root-token "$token" --log warn >/dev/null &
sleep 2
run_bench streamgate 18080
kill %1; wait %1 2>/dev/null || true

"$s2" lite --local-root "$work/lite" --port 18081 >/dev/null 2>&1 &
sleep 3
run_bench s2-lite 18081
