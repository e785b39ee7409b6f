#!/usr/bin/env bash
# The ResNet example on two Python workers against DDP-gloo, each process on
# a network host of its own: namespaces joined by veth pairs to a bridge (no
# rate limit, plain TCP; every process still shares this machine's cores).
#   tally   tally-server (coordinator and its shard) on host srv, one Python
#           worker (cpu:1) on each of hosts w1 and w2;
#   ddp     bench/pytorch_resnet.py rank 0 on w1, rank 1 on w2
#           (GLOO_SOCKET_IFNAME=eth0, one rank per namespace).
# Batch 64 per worker, SGD(lr 0.05, momentum 0.9), normalised Fashion-MNIST,
# STEPS steps per worker (default 150), one thread per process, alternating
# runs, REPEATS of each (default 3), medians. Both clocks start after the
# data is loaded: Tally's samples/s are the job's (the shards' training
# time, first pull to last step), DDP's its loop's after a barrier.
# Needs root and iproute2.
#   bench/python_netns.sh [REPEATS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
steps=${2:-150}
B=$PWD/build
[[ -f $B/python/tally/engine.py ]] || { echo "build first: deploy/build.sh --with-torch" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "needs root (network namespaces)" >&2; exit 1; }
. bench/lib.sh
three_hosts pn$$ ""
export PYTHONPATH=$B/python
PY=/usr/bin/python3
cp examples/resnet/model.py "$tmp/model.py"
sed -e "s/workers: 1/workers: 2, max_steps: $steps/" examples/resnet/job.yaml > "$tmp/job.yaml"

tally_run() {  # -> samples/s
  local server=${addrs[0]}:7480 id
  on "${hosts[0]}" "$B/server/tally-server" --port=7480 --insecure --lease_timeout_ms=10000 \
    > "$tmp/server.log" 2>&1 &
  pids+=($!)
  for i in 1 2; do
    on "${hosts[$i]}" env OMP_NUM_THREADS=1 $PY -m tally.worker --server="$server" --devices=cpu:1 \
      --name="w$i" --quiet > "$tmp/worker$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 100); do
    on "${hosts[0]}" "$B/client/tally" --server="$server" health > /dev/null 2>&1 && break
    sleep 0.1
  done
  id=$(on "${hosts[0]}" $PY -m tally submit "$tmp/job.yaml" --server="$server" | head -1)
  on "${hosts[0]}" $PY - "$server" "$id" <<'PYEOF'
import sys, tally
from tally import tally_pb2 as pb
c = tally.Client(sys.argv[1])
job = c.wait(sys.argv[2], timeout=1800)
assert job.state == pb.SUCCEEDED, (pb.JobState.Name(job.state), job.message)
print(job.metrics.samples / job.metrics.train_seconds)
PYEOF
  stop_pids
}

ddp_run() {  # -> samples/s
  local port=$((29600 + RANDOM % 1000))
  on "${hosts[2]}" env GLOO_SOCKET_IFNAME=eth0 $PY bench/pytorch_resnet.py --procs=2 --rank=1 \
    --master="${addrs[1]}" --port=$port --steps="$steps" > /dev/null 2> "$tmp/ddp1.log" &
  pids+=($!)
  on "${hosts[1]}" env GLOO_SOCKET_IFNAME=eth0 $PY bench/pytorch_resnet.py --procs=2 --rank=0 \
    --master="${addrs[1]}" --port=$port --steps="$steps" 2> "$tmp/ddp0.log" |
    $PY -c "import json, sys; print(json.load(sys.stdin)['samples_per_sec'])"
  stop_pids
}

: > "$tmp/tally"
: > "$tmp/ddp"
for ((r = 0; r < repeats; r++)); do
  tally_run >> "$tmp/tally"
  ddp_run >> "$tmp/ddp"
done
t=$(median < "$tmp/tally")
d=$(median < "$tmp/ddp")
printf "%-50s %10s %10s %8s\n" "ResNet, $steps steps/worker, batch 64, 3 hosts" "Tally" "DDP-gloo" "ratio"
printf "%-50s %10.1f %10.1f %8.3f\n" "two Python workers vs two DDP ranks, samples/s" "$t" "$d" "$(ratio "$t" "$d")"
echo "runs: Tally $(paste -sd' ' "$tmp/tally"); DDP $(paste -sd' ' "$tmp/ddp")"
