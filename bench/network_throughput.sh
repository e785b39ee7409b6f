#!/usr/bin/env bash
# Push + pull throughput of a 67 MB model (one 4096 x 4096 linear layer)
# through tally-server on loopback, driven by the worker's own parameter
# client (tally-bench-shard-pushpull: push step t, then pull version t + 1
# with the commit, as tally-worker does), against iperf3's single-stream
# loopback TCP in the same run, and once more with the server checkpointing
# the job after every step (--state_dir, --checkpoint_interval_s=0: the
# worst case). REPEATS (default 3) alternating runs, medians.
#   bench/network_throughput.sh [REPEATS]
# With BASELINE=DIR (another build tree, e.g. of an earlier commit) its
# server and client run too, alternating, as a row of their own;
# BASELINE_FLAGS (tally-bench-shard-pushpull flags, e.g. --exchange=false)
# go to the baseline's client and BASELINE_SERVER_FLAGS (tally-server
# flags, e.g. --stream_window_bytes=16777216) to its server, whose build is
# then this one unless BASELINE is set. With
# PROFILE=1 one more run of each is recorded with perf on the server, and
# the shares of its CPU time in memmove/memcpy and in libprotobuf printed.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
B=build
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
command -v iperf3 >/dev/null || { echo "needs iperf3 (deploy/install-deps.sh --with-torch)" >&2; exit 1; }
. bench/lib.sh  # median, ratio, iperf_gbps
: > "$tmp/t"; : > "$tmp/c"; : > "$tmp/i"; : > "$tmp/b"
[[ (${BASELINE_FLAGS:-} || ${BASELINE_SERVER_FLAGS:-}) && ! ${BASELINE:-} ]] && BASELINE=$B
# One push+pull run against a fresh server; extra flags go to the server.
pushpull() {  # build port outfile [server flags]
  local b=$1 port=$2 out=$3 cflags=(${client_flags:-})
  # The bench client heartbeats; a long lease keeps it a member regardless.
  $b/server/tally-server --listen=127.0.0.1 --port=$port --lease_timeout_ms=600000 "${@:4}" > "$tmp/server.log" 2>&1 &
  pids=($!)
  for _ in $(seq 100); do $b/client/tally --server=127.0.0.1:$port health >/dev/null 2>&1 && break; sleep 0.05; done
  if [[ ${perf_out:-} ]]; then
    perf record -q -g -o "$perf_out" -p "${pids[0]}" > /dev/null 2>&1 &
    pids+=($!)
    sleep 0.3
  fi
  $b/bench/tally-bench-shard-pushpull --server=127.0.0.1:$port --submit --shards=1 \
    --workers=1 --steps=11 "${cflags[@]}" > "$tmp/p.json"
  python3 -c "import json; print(json.load(open('$tmp/p.json'))['gb_per_sec'])" >> "$out"
  kill -INT "${pids[@]:1}" 2>/dev/null || true
  sleep 0.5
  kill "${pids[0]}"; wait 2>/dev/null || true
}
for ((r = 0; r < repeats; r++)); do
  pushpull $B $((7600 + r)) "$tmp/t"
  [[ ${BASELINE:-} ]] && client_flags=${BASELINE_FLAGS:-} pushpull "$BASELINE" $((7620 + r)) "$tmp/b" ${BASELINE_SERVER_FLAGS:-}
  # The worst case for checkpoints: the job's state written after every step.
  rm -rf "$tmp/state"
  pushpull $B $((7650 + r)) "$tmp/c" --state_dir="$tmp/state" --checkpoint_interval_s=0
  iperf3 -s -1 -p $((5301 + r)) > /dev/null 2>&1 &
  pids=($!)
  sleep 0.5
  iperf3 -c 127.0.0.1 -p $((5301 + r)) -t 3 -J > "$tmp/i.json"
  iperf_gbps "$tmp/i.json" >> "$tmp/i"
  wait 2>/dev/null || true
done
t=$(median < "$tmp/t"); c=$(median < "$tmp/c"); i=$(median < "$tmp/i")
printf "%-52s %8s\n" "path" "GB/s"
printf "%-52s %8.3f\n" "Tally push+pull, 67 MB model, loopback" "$t"
if [[ ${BASELINE:-} ]]; then
  printf "%-52s %8.3f\n" "  the same, baseline ($BASELINE ${BASELINE_FLAGS:-} ${BASELINE_SERVER_FLAGS:-})" "$(median < "$tmp/b")"
fi
printf "%-52s %8.3f\n" "  the same, checkpointed after every step" "$c"
printf "%-52s %8.3f\n" "iperf3 one TCP stream, loopback" "$i"
printf "%-52s %8.2f\n" "ratio (Tally / iperf3)" "$(ratio "$t" "$i")"
if [[ ${PROFILE:-} ]]; then
  command -v perf >/dev/null || { echo "PROFILE needs perf (linux-perf)" >&2; exit 1; }
  builds=("$B")
  [[ ${BASELINE:-} ]] && builds+=("$BASELINE")
  printf "\n%-40s %9s %11s\n" "server profile" "memmove" "libprotobuf"
  for k in "${!builds[@]}"; do
    b=${builds[$k]} flags=""
    ((k > 0)) && flags=${BASELINE_FLAGS:-}
    client_flags=$flags perf_out=$tmp/perf.data pushpull "$b" 7690 "$tmp/x"
    mem=$(perf report -i "$tmp/perf.data" --no-children --sort sym --stdio 2>/dev/null |
      awk '/mem(move|cpy)/ {gsub("%", "", $1); s += $1} END {printf "%.1f%%", s}')
    pb=$(perf report -i "$tmp/perf.data" --no-children --sort dso --stdio 2>/dev/null |
      awk '/libprotobuf/ {gsub("%", "", $1); s += $1} END {printf "%.1f%%", s}')
    printf "%-40s %9s %11s\n" "$b $flags" "$mem" "$pb"
  done
fi
