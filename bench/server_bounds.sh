#!/usr/bin/env bash
# What the servers' bounds of docs/security.md ("Limits") hold against
# hostile requests, measured on real processes on loopback: for each case,
# the documented bound, the server's peak resident memory over its RSS
# just before the case (VmRSS polled every 20 ms on a thread of its own
# during it), and the statuses the requests got, counted by gRPC code and
# typed reason (ErrorDetail), with "as documented" when they are only the
# documented ones. Each group of cases runs against a fresh tally-server
# (coordinator and its own shard, plaintext, on a free port P, its data
# plane on P + 1):
#   offers   a Python model's job of 16 Mi float32 (64 MiB; its layout
#            written in the spec, so no PyTorch), a fake Python worker
#            (RegisterWorker with a runtime and WORKER_PROTOCOL_CURRENT;
#            heartbeats; offers 0.5s when asked): 8 OfferInitialWeights of
#            the whole 64 MiB at once from 8 connections, 1 MiB chunks 5 ms
#            apart (one read, 7 OFFER_BUSY), then one more after the
#            install (WEIGHTS_GIVEN), then an offer of a second job held
#            open after 4 chunks while that job is cancelled (JOB_ENDED)
#   rows     examples/dlrm (26 tables of 20,000 x 16, Adagrad) with
#            workers: 1, submitted with tally.Client (which builds the
#            module here, with PyTorch, for its layout), taken by the fake
#            worker, which offers its dense weights and never pushes: the
#            job stays at version 0. 30 PullRows at once of 3.5 M row
#            numbers (rows 0..127, a byte each: 3.3 MiB, under the 4 MiB
#            message limit) for version 1, 30 connections: refused before
#            the wait; then 768 valid pulls (16,384 rows, 2^18 values) for
#            version 1 over 8 connections: they wait (5 s, max_wait_ms)
#            until the worker's 64 MiB of waiting pulls is full, the rest
#            PULLS_WAITING
#   tables   the same job on a server with --max_table_bytes=64 MiB:
#            pulls of version 0 (answered at once) of rows never made,
#            2^18 values each, table after table, until RESOURCE_EXHAUSTED;
#            then halved down to one row; rows made against the bound
#   specs    two SubmitJob requests of 200 MiB at once to the control
#            port (as tests/control_listener_test.py): RESOURCE_EXHAUSTED
# The fake worker stands in for a real one because a real one would push
# (the step would close and the pulls would be answered) and would build
# the 64 MiB model itself; its ids are the ones its registration got.
# About a minute on two cores; every call has a 30 s deadline.
#   bench/server_bounds.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
python_bench  # B, PY, PYTHONPATH, tmp, pids; the trap stops them
[[ -x $B/server/tally-server ]] || { echo "build first: deploy/build.sh --with-torch" >&2; exit 1; }
export OMP_NUM_THREADS=1
helper=bench/server_bounds.py
rows=$tmp/rows
: > "$rows"

cp examples/dlrm/model.py "$tmp/model.py"
sed -e "s/workers: 2}/workers: 1}/" examples/dlrm/job.yaml > "$tmp/job.yaml"
grep -q "workers: 1}" "$tmp/job.yaml" ||
  { echo "examples/dlrm/job.yaml changed: fix bench/server_bounds.sh" >&2; exit 1; }

# A tally-server on a free port with FLAGS, logging to NAME.log: sets
# port and spid once it says it listens.
start_server() {  # NAME FLAGS...
  local name=$1
  shift
  port=$($PY $helper free-port)
  $B/server/tally-server --port="$port" "$@" > "$tmp/$name.log" 2>&1 &
  spid=$!
  pids+=("$spid")
  for _ in $(seq 200); do
    grep -q "listening on" "$tmp/$name.log" && return 0
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.05
  done
  echo "tally-server ($name) did not start:" >&2
  tail -20 "$tmp/$name.log" >&2
  exit 1
}
stop_server() {
  local p keep=()
  kill "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  for p in "${pids[@]}"; do [[ $p == "$spid" ]] || keep+=("$p"); done
  pids=("${keep[@]}")
}

# A case against a fresh server: its lines go to $rows.
run_case() {  # CASE SERVER_FLAGS...
  local case=$1
  shift
  echo "== $case" >&2
  start_server "$case" "$@"
  if ! $PY $helper "$case" --server="127.0.0.1:$port" --pid="$spid" --out="$rows" \
       --job="$tmp/job.yaml"; then
    echo "the $case case failed; the server's log ends:" >&2
    tail -20 "$tmp/$case.log" >&2
    exit 1
  fi
  kill -0 "$spid" 2>/dev/null ||
    { echo "the server of the $case case exited" >&2; tail -20 "$tmp/$case.log" >&2; exit 1; }
  stop_server
}

run_case offers
run_case rows
run_case tables --max_table_bytes=$((64 << 20))
run_case specs
$PY $helper table "$rows"
