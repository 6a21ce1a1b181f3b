#!/usr/bin/env bash
# Runs the official `s2 bench` against streamgate and against `s2 lite --local-root`
# (the reference server shipped in the same CLI) on this machine, one after the other:
# at a saturating target (8 KiB and 1 KiB records), at 10 MiB/s, and at 100 MiB/s for
# 15 s followed by the catch-up read of those ~1.5 GB (the history-read comparison).
# Both servers acknowledge only durable writes. Also measures the disk's sequential
# read bandwidth with O_DIRECT (`dd iflag=direct bs=8M`) in the same run, and prints
# the catch-up rows side by side: streamgate / s2-lite, and streamgate / the disk, with
# each server's and the client's CPU during that catch-up.
#
#   compat/bench/s2-bench-compare.sh [seconds]      (needs the s2 CLI and a release build)
#
# Exits non-zero, saying why, when a server does not start or a run prints no numbers.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-10}"
s2="${S2_CLI:-$(command -v s2 || echo "$HOME/.cargo/bin/s2")}"
fail() { echo "s2-bench-compare: $*" >&2; exit 1; }
[ -x "$s2" ] || fail "the s2 CLI is missing: cargo install --locked s2-cli --version 0.43.4"
mkdir -p target
work="$(mktemp -d "$PWD/target/s2-bench.XXXX")"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cargo build --release --quiet --bin streamgate

# name port: every run against one server; its catch-up rate at 100 MiB/s goes to
# $work/<name>.catchup
token="s2-bench-root-token-$RANDOM$RANDOM"
# A process's CPU time so far (user and system) in clock ticks; empty once it has ended.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || true; }
# The server's and the client's CPU over the catch-up (its last seconds, as `s2 bench`
# timed it), from the samples of the run that just ended.
catchup_cpu() {
  local secs
  secs=$(grep -oE "^Catchup: .* in [0-9.]+s" "$work/out" | grep -oE "[0-9.]+s$" | tr -d s)
  awk -v secs="$secs" -v hz="$(getconf CLK_TCK)" -v name="$1" '
    NF == 3 {t[n] = $1; server[n] = $2; client[n] = $3; n++}
    END {
      if (n < 2 || secs == "") {print "s2-bench-compare: no CPU samples of the catch-up on " name > "/dev/stderr"; exit 1}
      last = n - 1
      for (first = last; first > 0 && t[last] - t[first] < secs; first--) {}
      took = t[last] - t[first]
      if (took <= 0) {print "s2-bench-compare: the catch-up was too short to sample on " name > "/dev/stderr"; exit 1}
      printf "CPU during the catch-up (last %.1f s): %s %.0f%% of a core, s2 client %.0f%%\n",
        took, name, 100 * (server[last] - server[first]) / hz / took,
        100 * (client[last] - client[first]) / hz / took
    }' "$work/cpu" | tee "$work/$1.cpu"
  [ -s "$work/$1.cpu" ] || fail "no CPU figures for the catch-up on $1"
}

run_bench() {
  local name=$1 port=$2
  export S2_ACCOUNT_ENDPOINT="http://127.0.0.1:$port" S2_BASIN_ENDPOINT="http://127.0.0.1:$port"
  export S2_ACCESS_TOKEN="$token" NO_COLOR=1
  "$s2" create-basin "bench-$name" >/dev/null || fail "could not create basin bench-$name on $name"
  for run in "1000 8192 $seconds" "1000 1024 $seconds" "10 8192 $seconds" "100 8192 15"; do
    set -- $run
    echo "### $name, target $1 MiB/s, $2-byte records, ${3}s"
    "$s2" bench "bench-$name" --duration "${3}s" --target-mibps "$1" --record-size "$2" \
      --catchup-delay 0s >"$work/out" 2>&1 &
    local bench=$!
    # Both processes' CPU time (clock ticks), every 0.1 s, for the catch-up's share below.
    : >"$work/cpu"
    while kill -0 "$bench" 2>/dev/null; do
      echo "$(date +%s.%N) $(cpu_ticks "$server_pid") $(cpu_ticks "$bench")" >>"$work/cpu"
      sleep 0.1
    done
    wait "$bench" || { cat "$work/out" >&2; fail "s2 bench failed on $name"; }
    grep -E "^(Write|Read|Catchup)|min |p50|p90|p99|max |Statistics" "$work/out" \
      || fail "s2 bench printed no numbers on $name"
    if [ "$1" = 100 ]; then
      grep -oE "^Catchup: [0-9.]+" "$work/out" | awk '{print $2}' >"$work/$name.catchup"
      [ -s "$work/$name.catchup" ] || fail "no catch-up rate on $name"
      # How much it read back: a server that fell behind the 100 MiB/s wrote less.
      grep -oE "^Catchup: .*\([0-9]+ bytes" "$work/out" | grep -oE "[0-9]+ bytes" | awk '{print $1}' \
        >"$work/$name.volume"
      [ -s "$work/$name.volume" ] || fail "no catch-up volume on $name"
      catchup_cpu "$name"
    fi
  done
}

target/release/streamgate --data-dir "$work/streamgate" --listen 127.0.0.1:18080 --resp-listen off \
  --root-token "$token" --log warn >/dev/null &
server=$!
server_pid=$server
sleep 2
kill -0 $server 2>/dev/null || fail "streamgate did not start"
run_bench streamgate 18080
kill $server; wait $server 2>/dev/null || true
rm -rf "$work/streamgate"

"$s2" lite --local-root "$work/lite" --port 18081 >/dev/null 2>&1 &
server=$!
server_pid=$server
sleep 3
kill -0 $server 2>/dev/null || fail "s2 lite did not start"
run_bench s2-lite 18081
kill $server; wait $server 2>/dev/null || true
rm -rf "$work/lite"

# The disk's own sequential read rate, around the page cache, over a file as large as
# the catch-up.
dd if=/dev/urandom of="$work/disk" bs=8M count=192 status=none
sync
disk=$(dd if="$work/disk" of=/dev/null bs=8M iflag=direct 2>&1 | awk '/copied/ {print $(NF-1)" "$NF}')
rm -f "$work/disk"
[ -n "$disk" ] || fail "dd did not report a read rate"
disk_mibps=$(echo "$disk" | awk '{r=$1; if ($2=="GB/s") r*=1000; if ($2=="kB/s") r/=1000; printf "%.0f", r*1000000/1048576}')

sg=$(cat "$work/streamgate.catchup")
lite=$(cat "$work/s2-lite.catchup")
echo "### catch-up read after 15 s at 100 MiB/s"
echo "disk, O_DIRECT sequential read (dd bs=8M): $disk_mibps MiB/s"
awk -v sg="$sg" -v lite="$lite" -v disk="$disk_mibps" 'BEGIN {
  printf "streamgate %.1f MiB/s, s2-lite %.1f MiB/s: %.2fx s2-lite, %.0f%% of the disk\n",
    sg, lite, sg / lite, 100 * sg / disk }'
awk -v sg="$(cat "$work/streamgate.volume")" -v lite="$(cat "$work/s2-lite.volume")" 'BEGIN {
  printf "read back: streamgate %.2f GB, s2-lite %.2f GB", sg / 1e9, lite / 1e9
  if (sg > lite * 1.01 || lite > sg * 1.01)
    print " (not equal: a server fell behind the 100 MiB/s, so the ratio compares unequal reads)"
  else
    print " (equal volume)"
}'
cat "$work/streamgate.cpu" "$work/s2-lite.cpu"
