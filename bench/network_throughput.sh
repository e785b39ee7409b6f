#!/usr/bin/env bash
# Push + pull throughput of a 67 MB model (one 4096 x 4096 linear layer)
# through tally-server on loopback, against iperf3's single-stream loopback
# TCP in the same run, and once more with the server checkpointing the job
# after every step (--state_dir, --checkpoint_interval_s=0: the worst case).
# REPEATS (default 3) alternating runs, medians.
#   bench/network_throughput.sh [REPEATS]
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
: > "$tmp/t"; : > "$tmp/c"; : > "$tmp/i"
# One push+pull run against a fresh server; extra flags go to the server.
pushpull() {  # port outfile [server flags]
  # The bench client sends no heartbeats: a long lease keeps it a member.
  $B/server/tally-server --listen=127.0.0.1 --port=$1 --lease_timeout_ms=600000 "${@:3}" > /dev/null 2>&1 &
  pids=($!)
  for _ in $(seq 100); do $B/client/tally --server=127.0.0.1:$1 health >/dev/null 2>&1 && break; sleep 0.05; done
  $B/bench/tally-bench-pushpull --server=127.0.0.1:$1 --steps=10 > "$tmp/p.json"
  python3 -c "import json; print(json.load(open('$tmp/p.json'))['gb_per_sec'])" >> "$2"
  kill "${pids[@]}"; wait 2>/dev/null || true
}
for ((r = 0; r < repeats; r++)); do
  pushpull $((7600 + r)) "$tmp/t"
  # The worst case for checkpoints: the job's state written after every step.
  rm -rf "$tmp/state"
  pushpull $((7650 + r)) "$tmp/c" --state_dir="$tmp/state" --checkpoint_interval_s=0
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
printf "%-52s %8.3f\n" "  the same, checkpointed after every step" "$c"
printf "%-52s %8.3f\n" "iperf3 one TCP stream, loopback" "$i"
printf "%-52s %8.2f\n" "ratio (Tally / iperf3)" "$(ratio "$t" "$i")"
