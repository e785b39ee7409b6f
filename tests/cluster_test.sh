#!/usr/bin/env bash
# Multi-process tests of a real cluster on localhost: tally-server, tally-worker
# daemons and the tally client as separate processes.
#   cluster_test.sh BUILD_DIR CASE     CASE: train | kill | restart | reconnect | resume | cli | ssp_pause | modes
set -euo pipefail
build=$1
case_name=$2
bin_server=$build/server/tally-server
bin_worker=$build/worker/tally-worker
bin_tally=$build/client/tally
. "$(dirname "${BASH_SOURCE[0]}")/process_helpers.sh"
port=$(free_port)
addr=127.0.0.1:$port
# mTLS and tokens (server_auth, worker_auth, tally) and the job helpers.
. "$(dirname "${BASH_SOURCE[0]}")/job_helpers.sh"

start_server() {  # [lease_ms [more flags]]
  "$bin_server" "${server_auth[@]}" --listen=127.0.0.1 --port="$port" --lease_timeout_ms="${1:-3000}" "${@:2}" > "$dir/server.log" 2>&1 &
  pids+=($!)
  # Ours must be the one answering: another test may have taken the port
  # while it was free (a restart), and then ours refuses to start.
  for _ in $(seq 100); do
    grep -q "listening on" "$dir/server.log" && tally health > /dev/null 2>&1 && return 0
    sleep 0.05
  done
  fail "server did not come up"
}
start_worker() {  # name
  "$bin_worker" --server="$addr" "${worker_auth[@]}" --devices=cpu:1 --name="$1" --health_port=-1 > "$dir/$1.log" 2>&1 &
  pids+=($!)
  eval "pid_$1=$!"
}

case $case_name in
  train)
    start_server
    start_worker w1
    start_worker w2
    out=$(tally submit examples/synthetic-2workers.yaml --wait) || fail "job did not succeed: $out"
    id=${out%%$'\n'*}
    [[ $id == job-1 ]] || fail "first line should be the job id, got '$id'"
    acc=$(job_field "$id" "['metrics']['test_accuracy']")
    python3 -c "import sys; sys.exit(0 if $acc > 0.80 else 1)" || fail "test accuracy $acc <= 0.80"
    [[ $(job_field "$id" "['metrics']['step']") == 320 ]] || fail "expected 320 steps"
    tally fetch "$id" --output="$dir/w.safetensors" > /dev/null || fail "fetch"
    [[ -s $dir/w.safetensors ]] || fail "empty weights"
    # The path may follow the job, as the README shows it: the same file.
    tally fetch "$id" "$dir/w2.safetensors" > /dev/null || fail "fetch JOB PATH"
    cmp -s "$dir/w.safetensors" "$dir/w2.safetensors" || fail "fetch JOB PATH wrote another file"
    # The same job with bfloat16 on the wire trains as well.
    sed 's/workers: 2}/workers: 2, wire_dtype: bfloat16}/' examples/synthetic-2workers.yaml > "$dir/bf16.yaml"
    grep -q "wire_dtype: bfloat16" "$dir/bf16.yaml" || fail "could not make the bfloat16 spec"
    out=$(tally submit "$dir/bf16.yaml" --wait) || fail "bfloat16 job did not succeed: $out"
    bid=${out%%$'\n'*}
    bacc=$(job_field "$bid" "['metrics']['test_accuracy']")
    python3 -c "import sys; sys.exit(0 if $bacc > 0.80 else 1)" || fail "bfloat16 test accuracy $bacc <= 0.80"
    echo "train: test accuracy $acc (float32), $bacc (bfloat16 on the wire)"
    ;;
  kill)
    # One of two workers dies mid-job (SIGKILL): its lease expires, the open
    # step closes without it, and the job still finishes. The server sums
    # pushes as they arrive (this model is below the default size for it):
    # a worker killed in the middle of its push drops the step's sum, and
    # the other pushes that step again (PUSH_AGAIN).
    start_server 1000 --streamed_sums_min_bytes=0
    start_worker w1
    start_worker w2
    id=$(submit tests/long-synthetic.yaml)
    wait_step "$id" 100 60
    kill -9 "$pid_w2"
    killed_at=$SECONDS
    step_at_kill=$(job_field "$id" "['metrics']['step']")
    # Within a lease (1 s) plus a tick the job moves on with one worker.
    wait_step "$id" $((step_at_kill + 20)) 10
    (( SECONDS - killed_at <= 5 )) || fail "steps stalled after the kill"
    wait_state "$id" SUCCEEDED 120
    echo "kill: finished after losing a worker at step $step_at_kill"
    ;;
  ssp_pause)
    # Stale-synchronous training with one of two workers paused (SIGSTOP):
    # the other runs exactly `staleness` steps ahead of it, then waits;
    # `tally status` names the paused worker as the slowest and the one the
    # job waits on; resumed, both finish. A long lease keeps the paused
    # worker a member.
    start_server 60000
    start_worker w1
    start_worker w2
    sed 's/workers: 2}/workers: 2, consistency: {mode: ssp, staleness: 3}}/' tests/long-synthetic.yaml > "$dir/ssp.yaml"
    grep -q "staleness: 3" "$dir/ssp.yaml" || fail "could not make the ssp spec"
    id=$(submit "$dir/ssp.yaml")
    wait_step "$id" 50 60
    kill -STOP "$pid_w2"
    sleep 4  # w1 runs ahead and waits; the step stalls past 3 s
    clocks() {  # -> "w1_clock w2_clock w1_waiting slowest_name waiting_on"
      tally status "$id" --json | python3 -c '
import json, sys
m = json.load(sys.stdin)["metrics"]
p = {w["name"]: w for w in m.get("progress", [])}
slowest = [n for n, w in p.items() if w.get("slowest")]
print(int(p["w1"]["clock"]), int(p["w2"]["clock"]), p["w1"].get("waiting", False),
      ",".join(slowest), ",".join(m.get("waiting_on", [])).replace(" ", ""))'
    }
    # w1's pull waits on the server, which answers it after 5 s and gets it
    # again: look a few times.
    for _ in $(seq 10); do
      read -r c1 c2 waiting1 slowest waiting_on <<< "$(clocks)"
      [[ $waiting1 == True ]] && break
      sleep 0.3
    done
    (( c1 - c2 == 3 )) || fail "ssp(3): w1 at clock $c1, paused w2 at $c2: expected exactly 3 ahead"
    [[ $waiting1 == True ]] || fail "w1 should be waiting for weights"
    [[ $slowest == w2 ]] || fail "the slowest worker should be w2, got '$slowest'"
    [[ $waiting_on == *"(w2)"* && $waiting_on != *"(w1)"* ]] || fail "the stalled step should wait on w2 only, got '$waiting_on'"
    sleep 1
    read -r d1 d2 _ _ _ <<< "$(clocks)"
    (( d1 == c1 && d2 == c2 )) || fail "clocks moved while w2 was paused: $c1/$c2 -> $d1/$d2"
    table=$(tally status "$id")
    grep -E "\(w2\).*<- slowest" <<< "$table" > /dev/null || fail "tally status does not mark w2 as the slowest: $table"
    grep -q "waited .* on .*(w2)" <<< "$table" || fail "tally status does not say the step waits on w2: $table"
    kill -CONT "$pid_w2"
    wait_state "$id" SUCCEEDED 180
    grep -q "finished at step" "$dir/w1.log" || fail "w1 did not finish"
    grep -q "finished at step" "$dir/w2.log" || fail "w2 did not finish"
    echo "ssp_pause: w1 waited 3 steps ahead of the paused w2 (clocks $c1, $c2); both finished"
    ;;
  modes)
    # Every consistency mode trains the example to the same accuracy bar;
    # async runs steps_per_epoch * epochs * workers versions.
    start_server
    start_worker w1
    start_worker w2
    for mode in "mode: ssp, staleness: 2" "mode: async" "mode: async, lr_scaling: staleness, max_staleness: 8" "backup_workers: 1"; do
      sed "s/workers: 2}/workers: 2, consistency: {$mode}}/" examples/synthetic-2workers.yaml > "$dir/mode.yaml"
      grep -q "consistency" "$dir/mode.yaml" || fail "could not make the spec for $mode"
      out=$(tally submit "$dir/mode.yaml" --wait) || fail "$mode: job did not succeed: $out"
      mid=${out%%$'\n'*}
      acc=$(job_field "$mid" "['metrics']['test_accuracy']")
      python3 -c "import sys; sys.exit(0 if $acc > 0.80 else 1)" || fail "$mode: test accuracy $acc <= 0.80"
      steps=$(job_field "$mid" "['metrics']['step']")
      want=320
      [[ $mode == *async* ]] && want=640
      [[ $steps == "$want" ]] || fail "$mode: expected $want versions, got $steps"
      echo "modes: {$mode}: test accuracy $acc, $steps versions"
    done
    ;;
  restart)
    # A worker killed mid-job and started again re-registers (a new
    # incarnation) and rejoins the same job at a later step.
    start_server 1000
    start_worker w1
    start_worker w2
    id=$(submit tests/long-synthetic.yaml)
    wait_step "$id" 100 60
    kill -9 "$pid_w2"
    sleep 1.5
    start_worker w2b
    for _ in $(seq 100); do grep -q "assigned $id" "$dir/w2b.log" && break; sleep 0.1; done
    grep -q "assigned $id" "$dir/w2b.log" || fail "the restarted worker was not reassigned"
    for _ in $(seq 100); do [[ $(job_field "$id" "['metrics']['workers']") == 2 ]] && break; sleep 0.1; done
    [[ $(job_field "$id" "['metrics']['workers']") == 2 ]] || fail "the job did not get its second worker back"
    wait_state "$id" SUCCEEDED 120
    grep -q "finished at step" "$dir/w2b.log" || fail "the restarted worker did not train to the end"
    echo "restart: the new worker rejoined and finished"
    ;;
  reconnect)
    # The server goes away and comes back (empty): the workers notice, back
    # off, register again by themselves, and run the next job.
    start_server
    start_worker w1
    start_worker w2
    for _ in $(seq 100); do grep -q registered "$dir/w2.log" && break; sleep 0.1; done
    kill -9 "${pids[0]}"
    sleep 1.5
    start_server
    for _ in $(seq 150); do
      (( $(grep -c registered "$dir/w1.log") >= 2 && $(grep -c registered "$dir/w2.log") >= 2 )) && break
      sleep 0.1
    done
    out=$(timeout 120 "$bin_tally" --server="$addr" "${tls[@]}" --token_file="$certs/admin.token" submit examples/synthetic-2workers.yaml --wait) || fail "job after the restart: $out"
    echo "reconnect: workers re-registered and trained"
    ;;
  resume)
    # The server is killed (SIGKILL) mid-job and started again on the same
    # --state_dir: the job is back, RUNNING from its last checkpoint (not
    # from step 0), the workers register again by themselves and finish it.
    state=$dir/state
    start_server 1000 --state_dir="$state" --checkpoint_interval_s=0.2
    start_worker w1
    start_worker w2
    id=$(submit tests/long-synthetic.yaml)
    done_id=$(submit examples/synthetic-2workers.yaml)  # queued behind it
    wait_step "$id" 200 60
    sleep 0.5  # a checkpoint after step 200
    ids_before=$(job_workers "$id")
    [[ $(wc -l <<< "$ids_before") == 2 ]] || fail "two workers before the kill: '$ids_before'"
    kill -9 "${pids[0]}"
    [[ -s $state/$id.ckpt && -s $state/$done_id.ckpt ]] || fail "no checkpoint files in $state"
    start_server 1000 --state_dir="$state" --checkpoint_interval_s=0.2
    grep -q "2 restored" "$dir/server.log" || fail "the jobs were not restored: $(cat "$dir/server.log")"
    step=$(job_field "$id" "['metrics']['step']")
    (( step >= 200 )) || fail "resumed at step $step, not from the checkpoint"
    [[ $(job_field "$done_id" "['state']") == PENDING ]] || fail "the queued job is not PENDING"
    # Each live worker is listed once, under an id the old coordinator
    # never gave; the events say what happened; the message is current.
    # The workers register again by themselves, each after its own
    # backoff (gRPC's reconnect backoff can keep one away for many
    # seconds, and the job goes on with the first alone meanwhile).
    for _ in $(seq 150); do
      ids_after=$(job_workers "$id")
      [[ $(wc -l <<< "$ids_after") == 2 ]] && break
      sleep 0.2
    done
    [[ -n $ids_after ]] || fail "no worker on the job after the restart"
    names=$(cut -d' ' -f2 <<< "$ids_after" | sort)
    [[ $(uniq <<< "$names") == "$names" ]] || fail "a worker is listed twice: '$ids_after'"
    (( $(wc -l <<< "$ids_after") <= 2 )) || fail "more workers than slots: '$ids_after'"
    for old_id in $(cut -d' ' -f1 <<< "$ids_before"); do
      grep -q "^$old_id " <<< "$ids_after" && fail "worker id $old_id was given again: '$ids_after'"
    done
    msg=$(job_field "$id" "['message']")
    [[ $msg != *resum* ]] || fail "the message still says '$msg' while the job trains"
    tally report "$id" --output="$dir/report.html" > /dev/null || fail "report"
    grep -q "the coordinator restarted; the job resumes from the checkpoint of step" "$dir/report.html" || fail "no restart event"
    grep -q "placed again on 1 parameter shard" "$dir/report.html" || fail "no placement event"
    wait_state "$id" SUCCEEDED 120
    msg=$(job_field "$id" "['message']")
    [[ $msg != *resum* ]] || fail "the ended job's message says '$msg'"
    acc=$(job_field "$id" "['metrics']['test_accuracy']")
    python3 -c "import sys; sys.exit(0 if $acc > 0.80 else 1)" || fail "test accuracy $acc <= 0.80"
    wait_state "$done_id" SUCCEEDED 120
    # Job ids go on after the restored ones.
    new_id=$(submit examples/synthetic-2workers.yaml)
    [[ $new_id == job-3 ]] || fail "a new job after the restart got '$new_id'"
    echo "resume: the server came back at step $step; test accuracy $acc"
    ;;
  cli)
    # Unreachable server: exit code 3 and a clear message.
    set +e
    msg=$(tally --timeout_s=2 list 2>&1); code=$?
    set -e
    [[ $code == 3 && $msg == *"cannot reach tally-server"* ]] || fail "unreachable: code $code, '$msg'"
    start_server
    set +e
    msg=$(tally status job-77 2>&1); code=$?
    [[ $code == 1 && $msg == *"no job 'job-77'"* ]] || fail "unknown job: code $code, '$msg'"
    printf 'model: {preset: mlp}\ndataset: {name: fashion-mnist}\ntraining: {batch_size: -1}\n' > "$dir/bad.yaml"
    msg=$(tally submit "$dir/bad.yaml" 2>&1); code=$?
    [[ $code == 1 && $msg == *"training.batch_size"* ]] || fail "bad spec: code $code, '$msg'"
    msg=$(tally submit 2>&1); code=$?
    [[ $code == 2 ]] || fail "usage: code $code"
    msg=$(tally cancel job-77 2>&1); code=$?
    [[ $code == 1 ]] || fail "cancel unknown: code $code"
    # fetch JOB PATH (as the docs write it) reaches the server; without a
    # path, or with two, it is a usage error.
    msg=$(tally fetch job-77 "$dir/x.safetensors" 2>&1); code=$?
    [[ $code == 1 && $msg == *"no job 'job-77'"* ]] || fail "fetch JOB PATH: code $code, '$msg'"
    [[ ! -e $dir/x.safetensors && ! -e $dir/x.safetensors.part ]] || fail "a failed fetch left a file"
    msg=$(tally fetch job-77 2>&1); code=$?
    [[ $code == 2 && $msg == *"tally fetch JOB PATH"* ]] || fail "fetch without a path: code $code, '$msg'"
    msg=$(tally fetch job-77 "$dir/a.safetensors" --output="$dir/b.safetensors" 2>&1); code=$?
    [[ $code == 2 && $msg == *"two paths"* ]] || fail "fetch with two paths: code $code, '$msg'"
    set -e
    id=$(submit examples/synthetic-2workers.yaml)
    [[ $(job_field "$id" "['state']") == PENDING ]] || fail "no workers: should be PENDING"
    tally cancel "$id" > /dev/null
    [[ $(job_field "$id" "['state']") == CANCELLED ]] || fail "not cancelled"
    tally list | grep -q "$id" || fail "list"
    # Security from the command line: a plaintext client cannot connect, a
    # client without a token or with a viewer's is refused, and nothing
    # changes; a plaintext server beyond loopback does not start.
    set +e
    msg=$("$bin_tally" --server="$addr" --timeout_s=2 list 2>&1); code=$?
    [[ $code == 3 ]] || fail "plaintext client: code $code, '$msg'"
    msg=$("$bin_tally" --server="$addr" "${tls[@]}" list 2>&1); code=$?
    [[ $code == 1 && $msg == *"no bearer token"* ]] || fail "no token: code $code, '$msg'"
    id2=$(submit examples/synthetic-2workers.yaml)
    msg=$("$bin_tally" --server="$addr" "${tls[@]}" --token_file="$certs/viewer.token" cancel "$id2" 2>&1); code=$?
    [[ $code == 1 && $msg == *"role viewer"* ]] || fail "viewer cancel: code $code, '$msg'"
    [[ $(job_field "$id2" "['state']") == PENDING ]] || fail "the viewer's cancel changed the job"
    msg=$(timeout 10 "$bin_server" --listen=0.0.0.0 --port=0 2>&1); code=$?
    [[ $code == 1 && $msg == *"without TLS"* ]] || fail "plaintext on 0.0.0.0: code $code, '$msg'"
    set -e
    echo "cli: ok"
    ;;
  *) echo "unknown case $case_name" >&2; exit 2 ;;
esac
