#!/usr/bin/env bash
# XADD throughput and latency with redis-benchmark: streamgate's RESP listener (every
# reply sent once the entry is durable) side by side with a Redis server started here with
# `appendonly yes` and `appendfsync always` (the durable peer: one fsync per event-loop
# turn), and with Redis in memory, for 1, 8 and 50 connections, unpipelined and pipelined.
#
#   compat/bench/resp-bench.sh [requests] [pipeline]     (needs redis-server, redis-benchmark)
#
# Prints one table row per (connections, pipeline) with the ratio streamgate / durable
# Redis, how streamgate grouped the XADDs (per WAL chunk, and each chunk's mean put, from
# its metrics endpoint), the CPU time each server spent per XADD (from /proc), and the
# CPU time redis-benchmark itself spent per XADD against each: the client shares the
# cores, so no row can go faster than the cores divided by the client's and the server's
# CPU per XADD together (the unpipelined rows measured so far stay well below that: they
# wait for the disk, not for CPU).
# Exits non-zero, saying why, when a server does not start or a run prints no rate.
#
# CONNECTIONS="1 8" picks the connection counts; RUN_TIMEOUT_SECS bounds each run (600);
# WARM=N first sends N XADDs to each server (default 0) from WARM_CONNECTIONS connections
# (default 50), then waits SETTLE seconds (default 0). A fresh streamgate creates a file
# per WAL chunk until its compactions recycle the files of compacted chunks (they are
# deleted about two compaction intervals, 60 s by default, after they were written); a
# server that has been running reuses them. For that steady state (one chunk per XADD
# from one connection, so one file each):
#   WARM=40000 WARM_CONNECTIONS=1 SETTLE=65 compat/bench/resp-bench.sh 20000 64
# Leave a minute or more after deleting a data directory of many files (an earlier run's):
# on ext4 without a journal, creating files is slow while recently freed inodes abound.
set -euo pipefail
cd "$(dirname "$0")/../.."
requests="${1:-200000}"
pipeline="${2:-64}"
connections="${CONNECTIONS:-1 8 50}"
for tool in redis-server redis-benchmark redis-cli curl; do
  command -v "$tool" >/dev/null || { echo "resp-bench: $tool is missing (Debian: redis-server, redis-tools, curl)" >&2; exit 1; }
done
mkdir -p target
work="$(mktemp -d "$PWD/target/resp-bench.XXXX")"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cargo build --release --quiet --bin streamgate

token="resp-bench-root-token-$RANDOM$RANDOM"
target/release/streamgate --data-dir "$work/data" --listen 127.0.0.1:18090 --resp-listen 127.0.0.1:16390 \
  --metrics-listen 127.0.0.1:19464 --root-token "$token" --log warn >/dev/null &
sg_pid=$!
mkdir "$work/durable" "$work/memory"
redis-server --port 16391 --dir "$work/durable" --appendonly yes --appendfsync always --save '' \
  --daemonize no >"$work/durable.log" 2>&1 &
durable_pid=$!
redis-server --port 16392 --dir "$work/memory" --appendonly no --save '' --daemonize no >"$work/memory.log" 2>&1 &
for _ in $(seq 1 50); do
  if curl -sf -o /dev/null http://127.0.0.1:18090/health && redis-cli -p 16391 ping >/dev/null 2>&1 &&
    redis-cli -p 16392 ping >/dev/null 2>&1; then
    break
  fi
  sleep 0.2
done
if ! curl -sf -X POST http://127.0.0.1:18090/v1/basins -H 'content-type: application/json' \
  -H "authorization: Bearer $token" \
  -d '{"basin":"resp-bench","config":{"create_stream_on_append":true}}' >/dev/null; then
  echo "resp-bench: streamgate did not start or did not create the benchmark basin" >&2
  exit 1
fi
for port in 16391 16392; do
  redis-cli -p "$port" ping >/dev/null || { echo "resp-bench: redis-server on port $port did not start" >&2; exit 1; }
done

# One redis-benchmark run: "<requests/s> <p50 ms> <the client's CPU µs per XADD>"; stops
# the script when it printed no rate.
run() {
  local label="$1" clients="$2" depth="$3" key="$4"
  shift 4
  local out rate p50 client_cpu
  # Each run starts with no dirty pages left by the runs before (the other server's
  # above all), whose writeback would otherwise share the disk with this run's flushes.
  sync
  # Bounded: redis-benchmark retries a lost server for ever.
  out="$(timeout "${RUN_TIMEOUT_SECS:-600}" redis-benchmark "$@" -c "$clients" -P "$depth" \
    -n "$requests" --csv XADD "$key" '*' field value-of-sixteen-b 2>/dev/null || true)"
  # The load generator shares the machine's cores with the servers, so its CPU bounds
  # every row: `times` gives this function's (a subshell's) reaped children,
  # that is the run just made, as "XmY.YYYs" user and system time on its second line.
  # `times` runs here, not in a pipeline's fork, which would have no children of its own.
  times >"$work/times"
  client_cpu="$(awk -v n="$requests" 'NR == 2 {
    for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); total += t[1] * 60 + t[2] }
    printf "%.0f", total * 1e6 / n }' "$work/times")"
  # --csv: a header line, then "test","rps","avg","min","p50",...
  rate="$(echo "$out" | awk -F'"' 'NR==2 {print $4}')"
  p50="$(echo "$out" | awk -F'"' 'NR==2 {print $10}')"
  if [ -z "$rate" ]; then
    echo "resp-bench: $label with $clients connection(s), pipeline $depth printed no rate:" >&2
    echo "$out" >&2
    exit 1
  fi
  echo "$rate $p50 $client_cpu"
}

# The WAL's chunk writes so far: "<count> <seconds>", from streamgate's metrics. The
# histogram appears with the first chunk written: before any (no warm-up), `before`
# reads "0 0"; after a run it must be there.
wal_writes() {
  local when=$1 metrics
  metrics="$(curl -sf http://127.0.0.1:19464/metrics)" ||
    { echo "resp-bench: streamgate's metrics endpoint did not answer" >&2; exit 1; }
  echo "$metrics" | awk -v when="$when" '
    /^streamgate_wal_flush_duration_seconds_count/ {count = $2}
    /^streamgate_wal_flush_duration_seconds_sum/ {sum = $2}
    END {
      if (count == "" && when == "before") {count = 0; sum = 0}
      if (count == "") exit 1
      print count, sum
    }' ||
    { echo "resp-bench: streamgate's metrics gave no WAL flush counts after a run" >&2; exit 1; }
}

# A process's CPU time so far (user and system), in clock ticks.
ticks_per_second="$(getconf CLK_TCK)"
cpu_ticks() {
  awk '{print $14 + $15}' "/proc/$1/stat" ||
    { echo "resp-bench: cannot read the CPU time of process $1" >&2; exit 1; }
}
# µs of CPU per XADD between two readings of cpu_ticks.
cpu_per_xadd() {
  awk -v before="$1" -v after="$2" -v n="$requests" -v hz="$ticks_per_second" \
    'BEGIN {printf "%.0f", (after - before) / hz * 1e6 / n}'
}

warm="${WARM:-0}"
warm_connections="${WARM_CONNECTIONS:-50}"
settle="${SETTLE:-0}"
if [ "$warm" -gt 0 ]; then
  echo "resp-bench: warming each server with $warm XADDs from $warm_connections connection(s)" >&2
  for server in "-p 16390 --user resp-bench -a $token" "-p 16391" "-p 16392"; do
    # shellcheck disable=SC2086 # the server's options are words
    timeout "${RUN_TIMEOUT_SECS:-600}" redis-benchmark $server -c "$warm_connections" -n "$warm" \
      XADD warm '*' field value-of-sixteen-b >/dev/null 2>&1 ||
      { echo "resp-bench: the warm-up failed ($server)" >&2; exit 1; }
  done
fi
if [ "$settle" -gt 0 ]; then
  echo "resp-bench: waiting $settle s for streamgate to compact the warm-up and recycle its files" >&2
  sleep "$settle"
fi
# Files kept for reuse by the local store (its `.recycled` folder): what the rows start with.
spares="$work/data/objects/.recycled"
[ -d "$spares" ] || { echo "resp-bench: streamgate's spare-file folder $spares is missing" >&2; exit 1; }
recycled="$(find "$spares" -type f | wc -l)"
echo "resp-bench: streamgate starts the rows with $recycled recycled files" >&2

# Redis's rows are measured first, all of them, then streamgate's: a streamgate row leaves
# background work behind (compacting its WAL chunks, one per XADD from one connection,
# and deleting them), which would otherwise share the disk with the Redis rows after it
# and slow their flushes (durable Redis at 50 connections: 50,000/s with
# streamgate's rows interleaved, 67,000-77,000/s without). This way any such cost falls
# on streamgate's own rows. The table is printed once every row is measured (each row as
# it comes to stderr), so a run that fails prints no half table.
declare -A durable_runs durable_cpus memory_runs
for depth in 1 "$pipeline"; do
  for clients in $connections; do
    # Plain assignments, so that a run that fails stops the script (`set -e`).
    cpu_before="$(cpu_ticks "$durable_pid")"
    durable_runs[$clients,$depth]="$(run "durable Redis" "$clients" "$depth" "bench-$clients-$depth" -p 16391)"
    cpu_after="$(cpu_ticks "$durable_pid")"
    durable_cpus[$clients,$depth]="$(cpu_per_xadd "$cpu_before" "$cpu_after")"
    memory_runs[$clients,$depth]="$(run "in-memory Redis" "$clients" "$depth" "bench-$clients-$depth" -p 16392)"
    echo "resp-bench: measured Redis with $clients connection(s), pipeline $depth" >&2
  done
done
rows=""
for depth in 1 "$pipeline"; do
  for clients in $connections; do
    writes_before="$(wal_writes before)"
    cpu_before="$(cpu_ticks "$sg_pid")"
    sg_run="$(run streamgate "$clients" "$depth" "bench-$clients-$depth" -p 16390 --user resp-bench -a "$token")"
    cpu_after="$(cpu_ticks "$sg_pid")"
    sg_cpu="$(cpu_per_xadd "$cpu_before" "$cpu_after")"
    writes_after="$(wal_writes after)"
    grouping="$(awk -v n="$requests" -v before="$writes_before" -v after="$writes_after" 'BEGIN {
      split(before, b, " "); split(after, a, " "); chunks = a[1] - b[1]
      if (chunks <= 0) {print "no chunk written"; exit}
      printf "%.1f, %.0f µs", n / chunks, (a[2] - b[2]) / chunks * 1e6 }')"
    dur_cpu="${durable_cpus[$clients,$depth]}"
    read -r sg sg50 sg_client <<<"$sg_run"
    read -r dur dur50 dur_client <<<"${durable_runs[$clients,$depth]}"
    read -r mem _ _ <<<"${memory_runs[$clients,$depth]}"
    ratio="$(awk -v a="$sg" -v b="$dur" 'BEGIN {printf "%.2f×", a / b}')"
    row="$(printf '| %s | %s | %.0f/s, p50 %s ms | %s | %.0f/s, p50 %s ms | %s | %s / %s µs | %s / %s µs | %.0f/s |' \
      "$clients" "$depth" "$sg" "$sg50" "$grouping" "$dur" "$dur50" "$ratio" "$sg_cpu" "$dur_cpu" \
      "$sg_client" "$dur_client" "$mem")"
    echo "resp-bench: measured $row" >&2
    rows+="$row"$'\n'
  done
done

echo "$requests XADDs per run; rates in XADD/s, p50 in ms; streamgate started the rows with $recycled recycled files"
echo
echo "| connections | pipeline | streamgate (durable) | XADDs per chunk, mean put | Redis, appendfsync always | ratio | server CPU per XADD (streamgate / Redis) | redis-benchmark's CPU per XADD (against streamgate / Redis) | Redis, in memory |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
printf '%s' "$rows"
