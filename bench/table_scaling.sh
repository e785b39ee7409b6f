#!/usr/bin/env bash
# The DLRM's tables spread over 1, 2 and 4 shard processes, where every
# process has a network host of its own whose link is held to RATE (default
# 100mbit, so that the rows, not the two cores, bound a step). Seven hosts
# (network namespaces) on one bridge, each link shaped by a token-bucket
# filter on both ends as in bench/shard_scaling.sh: the coordinator
# (tally-server --noshard), four shard hosts and two worker hosts.
#
# For k = 1, 2, 4: the coordinator and k shards start fresh, two Python
# workers (cpu:1) train the DLRM of examples/dlrm (26 hashed tables of
# ROWS x 16, default 400,000; 400,000 ids a feature, Zipf 1.05) on exactly
# k shards (training.shards: k), batch BATCH per worker (default 1024),
# STEPS steps per worker (default 30). The figures: the job's samples/s,
# the row bytes a step moves (the job's table figures: pull and push
# messages, both workers), and the time those bytes take on one link at
# RATE spread over k shard links, against the step's time. Medians of
# REPEATS (default 1) runs. Needs root, iproute2 (ip, tc), python3-torch and
# a build in build/ (deploy/build.sh --with-torch).
#   bench/table_scaling.sh [REPEATS] [RATE] [STEPS] [BATCH]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-1}
rate=${2:-100mbit}
steps=${3:-30}
batch=${4:-1024}
rows=${ROWS:-400000}
B=$PWD/build
[[ -f $B/python/tally/engine.py ]] || { echo "build first: deploy/build.sh --with-torch" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "needs root (network namespaces)" >&2; exit 1; }
. bench/lib.sh
tag=ts$$
hub=tally-tshub-$tag
hosts=(tally-tsc-$tag tally-tss1-$tag tally-tss2-$tag tally-tss3-$tag tally-tss4-$tag
       tally-tsw1-$tag tally-tsw2-$tag)
# bridged_hosts numbers the hosts 10.233.0.1, .2, ... in order.
coord_ip=10.233.0.1
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for h in "${hosts[@]}" "$hub"; do ip netns del "$h" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
bridged_hosts "$tag" "$hub" "$rate" "${hosts[@]}"
export PYTHONPATH=$B/python
PY=/usr/bin/python3
on() { local h=$1; shift; ip netns exec "$h" "$@"; }

dlrm_model "$rows" "$tmp/model.py"

run() {  # k -> appends "samples/s row-bytes-a-step step-seconds" to $tmp/k
  local k=$1 i
  sed -e "s/workers: [0-9]*/workers: 2, max_steps: $steps, shards: $k/" \
      -e "s/batch_size: [0-9]*/batch_size: $batch/" \
      -e "s/cardinality: [0-9]*/cardinality: 400000/" \
      examples/dlrm/job.yaml > "$tmp/job.yaml"
  on "${hosts[0]}" "$B/server/tally-server" --insecure --listen=$coord_ip --port=7070 --noshard \
    --lease_timeout_ms=60000 > "$tmp/coordinator.log" 2>&1 &
  pids=($!)
  for ((i = 1; i <= k; i++)); do
    on "${hosts[$i]}" "$B/server/tally-server" --insecure --listen="10.233.0.$((i + 1))" \
      --port=7071 --coordinator=$coord_ip:7070 --advertise="10.233.0.$((i + 1)):7071" \
      --lease_timeout_ms=60000 > "$tmp/shard$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 5 6; do
    on "${hosts[$i]}" env OMP_NUM_THREADS=1 $PY -m tally.worker --server=$coord_ip:7070 \
      --devices=cpu:1 --name="w$i" --quiet > "$tmp/worker$i.log" 2>&1 &
    pids+=($!)
  done
  on "${hosts[0]}" $PY - "$coord_ip:7070" "$tmp/job.yaml" "$k" "$steps" >> "$tmp/$k" <<'PYEOF'
import sys, time, tally
from tally import tally_pb2 as pb
c = tally.Client(sys.argv[1])
for _ in range(200):  # the shards register
    shards = c._call("ListShards", pb.ListShardsRequest, pb.ListShardsResponse)(
        pb.ListShardsRequest(), timeout=5).shards
    if sum(s.live for s in shards) >= int(sys.argv[3]):
        break
    time.sleep(0.1)
job = c.wait(c.submit(sys.argv[2]).id, timeout=1800)
assert job.state == pb.SUCCEEDED, (pb.JobState.Name(job.state), job.message)
m = job.metrics
rows = sum(t.pull_wire_bytes + t.push_wire_bytes for t in m.tables) / int(sys.argv[4])
print(m.samples / m.train_seconds, rows, m.train_seconds / int(sys.argv[4]))
PYEOF
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}

for ((r = 0; r < repeats; r++)); do
  for k in 1 2 4; do run "$k"; done
done
bits=$($PY -c "
import re, sys
n, u = re.fullmatch(r'([0-9.]+)([kmg]?)bit', sys.argv[1]).groups()
print(float(n) * {'': 1, 'k': 1e3, 'm': 1e6, 'g': 1e9}[u])" "$rate")
echo "links held to $rate; 2 workers, batch $batch each, $steps steps; 26 tables x $rows rows x 16; medians of $repeats"
printf "%-7s %12s %18s %14s %22s %12s\n" shards samples/s "row bytes a step" "step (ms)" \
  "rows on k links (ms)" "vs 1 shard"
base=$(cut -d' ' -f1 < "$tmp/1" | median)
for k in 1 2 4; do
  s=$(cut -d' ' -f1 < "$tmp/$k" | median)
  b=$(cut -d' ' -f2 < "$tmp/$k" | median)
  t=$(cut -d' ' -f3 < "$tmp/$k" | median)
  # Both workers' rows go through the shards' links, k of them, each way
  # at RATE: half the bytes each way.
  link=$(awk -v b="$b" -v k="$k" -v r="$bits" 'BEGIN {print b / 2 * 8 / r / k * 1000}')
  printf "%-7s %12.0f %18.0f %14.1f %22.1f %12.2f\n" "$k" "$s" "$b" "$(awk -v t="$t" 'BEGIN {print t * 1000}')" \
    "$link" "$(ratio "$s" "$base")"
done
