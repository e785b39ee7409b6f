#!/usr/bin/env bash
# bfloat16 on the wire where the link is the limit: tally-server and the
# push + pull bench client on two network hosts (Linux network namespaces
# joined by a veth pair) whose link is held to RATE (default 1gbit) with a
# token-bucket filter on both ends. One worker pushes a full gradient and
# pulls the new weights of a 16.8 MB model (4096 x 1024), 10 steps, with
# float32 and with bfloat16 on the wire; iperf3 measures the link itself in
# the same run. Figures are float32 model bytes moved per second (what a
# training job sees), medians of REPEATS (default 3) alternating runs.
# Needs root, iproute2 (ip, tc) and iperf3.
#   bench/wire_dtype.sh [REPEATS] [RATE]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
rate=${2:-1gbit}
B=$(pwd)/build
tag=b$$
hosts=(tally-bsrv-$tag tally-bcli-$tag)
addrs=(10.232.0.1 10.232.0.2)
[[ $(id -u) == 0 ]] || { echo "needs root (network namespaces)" >&2; exit 1; }
command -v iperf3 > /dev/null || { echo "needs iperf3 (deploy/install-deps.sh --with-torch)" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  for h in "${hosts[@]}"; do ip netns del "$h" 2> /dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
. bench/lib.sh  # median, ratio, iperf_gbps, linked_hosts

linked_hosts "${hosts[@]}" "${addrs[@]}" "$rate" "$tag"

in_srv() { ip netns exec "${hosts[0]}" "$@"; }
in_cli() { ip netns exec "${hosts[1]}" "$@"; }
: > "$tmp/f32"; : > "$tmp/bf16"; : > "$tmp/iperf"
for ((r = 0; r < repeats; r++)); do
  for dtype in float32 bfloat16; do
    # A fresh server each run: the bench registers one worker per run.
    # Not through in_srv: a function in the background is a subshell, and
    # $! would be its pid, not the server's.
    ip netns exec "${hosts[0]}" "$B/server/tally-server" --insecure --port=7070 --lease_timeout_ms=600000 \
      > /dev/null 2>&1 &
    pids=($!)
    for _ in $(seq 100); do
      in_cli "$B/client/tally" --server="${addrs[0]}:7070" health > /dev/null 2>&1 && break
      sleep 0.05
    done
    in_cli "$B/bench/tally-bench-pushpull" --server="${addrs[0]}:7070" --steps=10 \
      --in=4096 --out=1024 --dtype=$dtype > "$tmp/p.json"
    python3 -c "import json; print(json.load(open('$tmp/p.json'))['gb_per_sec'])" \
      >> "$tmp/$([[ $dtype == float32 ]] && echo f32 || echo bf16)"
    kill "${pids[@]}"; wait 2> /dev/null || true
  done
  ip netns exec "${hosts[0]}" iperf3 -s -1 -p 5301 > /dev/null 2>&1 &
  pids=($!)
  sleep 0.5
  in_cli iperf3 -c "${addrs[0]}" -p 5301 -t 3 -J > "$tmp/i.json"
  iperf_gbps "$tmp/i.json" >> "$tmp/iperf"
  wait 2> /dev/null || true
done
f32=$(median < "$tmp/f32"); bf16=$(median < "$tmp/bf16"); link=$(median < "$tmp/iperf")
printf "%-44s %8s\n" "path (link held to $rate)" "GB/s"
printf "%-44s %8.3f\n" "Tally push+pull, float32 on the wire" "$f32"
printf "%-44s %8.3f\n" "Tally push+pull, bfloat16 on the wire" "$bf16"
printf "%-44s %8.3f\n" "iperf3 one TCP stream, same link" "$link"
printf "%-44s %8.2f\n" "bfloat16 / float32" "$(ratio "$bf16" "$f32")"
