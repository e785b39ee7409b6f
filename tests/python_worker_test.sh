#!/usr/bin/env bash
# A worker written in Python from the documentation alone
# (tests/python_worker.py) trains beside a C++ tally-worker, so that
# docs/cluster.md and proto/tally.proto cannot drift from what Tally does.
#   tests/python_worker_test.sh BUILD_DIR
#
# 1. `python_worker.py --self-test`: the test vectors of docs/cluster.md
#    (SplitMix64, xoshiro256**, EpochOrder, the example synthetic dataset),
#    read from the file, and the docs' own Python snippets.
# 2. One plaintext tally-server (coordinator and shard): the 2-worker
#    synthetic job (examples/synthetic-2workers.yaml) with two C++ workers,
#    then with one C++ and one Python worker. The mixed job must succeed,
#    the Python worker must report its own evaluation, and both test
#    accuracies and the final weights must match the C++ pair's: the data
#    order, loss, gradient and protocol are the same, only float32 rounding
#    inside the matrix products differs (numpy's summation order is not the
#    C++ kernels'). Observed: the same test accuracy; final weights within
#    2e-7 with the Python worker as rank 0, and within 3.3e-3 as rank 1
#    (its batch of step 271 has a ReLU pre-activation of 1e-7, which the two
#    round to opposite signs, and momentum carries the difference on); a
#    worker with a wrong data split ends 0.16 away.
# 3. The same with the parameters split over two shard processes
#    (coordinator --noshard, training.shards: 2).
# Exits 77 (skipped) without a python3 that has grpc, numpy and protobuf,
# or without protoc.
set -euo pipefail
build=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
bin_server=$build/server/tally-server
bin_worker=$build/worker/tally-worker
bin_tally=$build/client/tally
ACC_TOL=0.03       # |test accuracy, mixed - C++ pair|; 0 or 0.001 observed
WEIGHT_TOL=0.03    # max |weight, mixed - C++ pair|; 2e-7 or 3.3e-3 observed

py=
for candidate in ${PYTHON:-} python3 /usr/bin/python3; do
  if "$candidate" -c 'import grpc, numpy, google.protobuf' 2>/dev/null; then
    py=$candidate
    break
  fi
done
[[ -n $py ]] || { echo "SKIP: no python3 with grpc, numpy and protobuf"; exit 77; }
command -v protoc > /dev/null || { echo "SKIP: no protoc"; exit 77; }

. tests/process_helpers.sh
began=$SECONDS

# ---- 1: the documented test vectors ----
"$py" tests/python_worker.py --self-test > "$dir/selftest.log" 2>&1 || fail "self-test: $(cat "$dir/selftest.log")"
cat "$dir/selftest.log"

job_spec() {  # shards -> a path
  local f=$dir/job-$1.yaml
  # examples/synthetic-2workers.yaml, with training.shards.
  cat > "$f" <<YAML
name: python-worker-$1
model:
  layers:
    - linear: {in_features: 32, out_features: 64}
    - relu
    - linear: {in_features: 64, out_features: 4}
dataset: {name: synthetic, train_size: 8192, test_size: 1024, features: 32, classes: 4, seed: 1}
training: {epochs: 5, batch_size: 64, seed: 1, workers: 2, shards: $1}
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
YAML
  echo "$f"
}

# Processes of the case running now, stopped at its end.
case_pids=()
stop_case() {
  for pid in "${case_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${case_pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  case_pids=()
}
spawn() {  # log command... (in the background)
  local log=$1
  shift
  "$@" > "$log" 2>&1 &
  pids+=($!)
  case_pids+=($!)
  last_pid=$!
}
wait_for() {  # what file pattern seconds
  local deadline=$((SECONDS + $4))
  while ((SECONDS < deadline)); do
    grep -q "$3" "$2" 2>/dev/null && return 0
    sleep 0.05
  done
  fail "$1 did not come up (no '$3' in $2 within $4 s)"
}

# run_case NAME SHARDS KIND -> acc_NAME, weights in $dir/NAME.safetensors
#   SHARDS 1: one tally-server, coordinator and shard; 2: a coordinator
#   with --noshard and two shard processes.  KIND cpp: two tally-workers;
#   mixed: one tally-worker and one python_worker.py.
run_case() {
  local name=$1 shards=$2 kind=$3
  local port addr
  port=$(free_port)
  addr=127.0.0.1:$port
  if ((shards == 1)); then
    spawn "$dir/$name-server.log" "$bin_server" --listen=127.0.0.1 --port="$port"
  else
    spawn "$dir/$name-server.log" "$bin_server" --listen=127.0.0.1 --port="$port" --noshard
  fi
  wait_for "$name: tally-server" "$dir/$name-server.log" "listening on" 10
  if ((shards == 2)); then
    local i sport
    for i in 1 2; do
      sport=$(free_port)
      spawn "$dir/$name-shard$i.log" "$bin_server" --listen=127.0.0.1 --port="$sport" \
        --coordinator="$addr" --advertise="127.0.0.1:$sport"
      wait_for "$name: shard $i" "$dir/$name-shard$i.log" "registered with" 10
    done
  fi
  spawn "$dir/$name-cpp1.log" "$bin_worker" --server="$addr" --devices=cpu:1 --health_port=-1 --name=cpp1
  local py_pid=
  if [[ $kind == cpp ]]; then
    spawn "$dir/$name-cpp2.log" "$bin_worker" --server="$addr" --devices=cpu:1 --health_port=-1 --name=cpp2
  else
    spawn "$dir/$name-py.log" "$py" tests/python_worker.py --server="$addr" --name=py --jobs=1
    py_pid=$last_pid
  fi
  local out id state="" deadline
  out=$("$bin_tally" --server="$addr" submit "$(job_spec "$shards")" 2>&1) || fail "$name: submit: $out"
  id=${out%%$'\n'*}
  deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)); do
    "$bin_tally" --server="$addr" status "$id" --json > "$dir/$name-status.json" 2>/dev/null || true
    state=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["state"])' \
      "$dir/$name-status.json" 2>/dev/null || echo "?")
    [[ $state == SUCCEEDED || $state == FAILED || $state == CANCELLED ]] && break
    sleep 0.2
  done
  [[ $state == SUCCEEDED ]] || fail "$name: $id is $state, not SUCCEEDED: $(cat "$dir/$name-status.json")"
  local acc
  acc=$("$py" -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["metrics"]["test_accuracy"])' \
    "$dir/$name-status.json")
  [[ $("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["metrics"]["step"])' \
    "$dir/$name-status.json") == 320 ]] || fail "$name: $id did not run 320 steps"
  "$bin_tally" --server="$addr" fetch "$id" --output="$dir/$name.safetensors" > /dev/null ||
    fail "$name: fetch $id"
  if [[ -n $py_pid ]]; then
    # The Python worker evaluates the final weights itself and reports
    # (even when the C++ worker's report ended the job first); --jobs=1
    # makes it exit once the job is over.
    for _ in $(seq 100); do kill -0 "$py_pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$py_pid" 2>/dev/null && fail "$name: the Python worker did not exit after the job"
    wait "$py_pid" || fail "$name: the Python worker exited with $?"
    grep -q "assigned $id as rank [01] of 2 ($shards shard(s)" "$dir/$name-py.log" ||
      fail "$name: the Python worker was not on $id with $shards shard(s)"
    local own
    own=$(sed -n "s/.*$id finished at step 320: test accuracy \([0-9.]*\),.*/\1/p" "$dir/$name-py.log")
    [[ -n $own ]] || fail "$name: the Python worker did not finish $id"
    printf -v "own_$name" '%s' "$own"
    printf -v "rank_$name" '%s' "$(sed -n "s/.*assigned $id as rank \([01]\) of 2.*/\1/p" "$dir/$name-py.log")"
  fi
  grep -q "assigned $id as rank [01] of 2 ($shards parameter shard" "$dir/$name-cpp1.log" ||
    fail "$name: the C++ worker was not on $id with $shards shard(s)"
  stop_case
  printf -v "acc_$name" '%s' "$acc"
}

compare() {  # cpp_case mixed_case -> prints "ACC_DIFF WEIGHT_DIFF"; fails beyond the tolerances
  "$py" - "$dir/$1.safetensors" "$dir/$2.safetensors" "$3" "$4" "$5" "$ACC_TOL" "$WEIGHT_TOL" <<'PY'
import json, struct, sys
import numpy as np
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], "<f4")
            for k, v in head.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
cpp, mixed, own, acc_tol, weight_tol = (float(v) for v in sys.argv[3:8])
if sorted(a) != sorted(b):
    sys.exit(f"tensors differ: {sorted(a)} vs {sorted(b)}")
wdiff = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
adiff = max(abs(mixed - cpp), abs(own - cpp))
print(f"{adiff:g} {wdiff:.2g}")
if adiff > acc_tol:
    sys.exit(f"test accuracy: C++ pair {cpp}, mixed {mixed}, the Python worker's own {own}: "
             f"differ by {adiff} > {acc_tol}")
if not wdiff <= weight_tol:
    sys.exit(f"final weights differ by up to {wdiff} > {weight_tol}")
PY
}

# Set by run_case (acc_, own_, rank_ NAME).
acc_cpp1='' acc_mix1='' own_mix1='' rank_mix1='' acc_cpp2='' acc_mix2='' own_mix2='' rank_mix2=''
# ---- 2: one server ----
run_case cpp1 1 cpp
run_case mix1 1 mixed
diff1=$(compare cpp1 mix1 "$acc_cpp1" "$acc_mix1" "$own_mix1") ||
  fail "one shard: the mixed job differs from the C++ pair"
# ---- 3: two shard processes ----
run_case cpp2 2 cpp
run_case mix2 2 mixed
diff2=$(compare cpp2 mix2 "$acc_cpp2" "$acc_mix2" "$own_mix2") ||
  fail "two shards: the mixed job differs from the C++ pair"

echo "one shard: C++ pair $acc_cpp1, C++ + Python (rank $rank_mix1) $acc_mix1 (Python's own $own_mix1); |acc diff| ${diff1% *}, max |weight diff| ${diff1#* }"
echo "two shards: C++ pair $acc_cpp2, C++ + Python (rank $rank_mix2) $acc_mix2 (Python's own $own_mix2); |acc diff| ${diff2% *}, max |weight diff| ${diff2#* }"
echo "python_worker: ok (acc $acc_mix1 one shard, $acc_mix2 two shards; C++ pair $acc_cpp1, $acc_cpp2; $((SECONDS - began)) s)"
