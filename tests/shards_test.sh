#!/usr/bin/env bash
# A job's parameters split over several tally-server shard processes, on
# localhost: the coordinator holds none (--noshard), three shards join it.
#   tests/shards_test.sh BUILD_DIR identical|overlap|lost|fresh|coordinator
#
# identical  The same deterministic job trained with 1, 2 and 3 shards
#            gives bit-identical weights (same membership, same sums), with
#            SGD + momentum and with Adam, whether a shard sums pushes as
#            they arrive or stages them; `tally shards` lists the ranges.
# lost       A shard is killed (SIGKILL) mid-job and started again on the
#            same port: the job pauses, resumes from its last checkpoint on
#            every shard alike, and finishes; no worker process restarts.
# fresh      The same, but a new shard process (another port) takes the
#            dead one's place.
# ranks      A job with fixed ranks (training.ranks: 4 on 2 workers) gives
#            the same weights, byte for byte, when a worker holding two
#            ranks is killed for good (the survivor computes its ranks),
#            and when a worker and a shard are killed at once (a spare
#            takes the ranks; the ranges come back from the checkpoint).
# replicas   A job with two copies of its range (the default for bsp,
#            training.replicas unset; three shard processes) gives the same weights, byte for byte,
#            when the primary's shard is killed (its backup takes over, no
#            step rolled back, and a new backup seeded on the third shard
#            takes over in turn when the new primary is killed) and when
#            the backup's is; `tally shards` shows the primary and the
#            backup. Both copies' shards killed at once: the job rolls back
#            to its checkpoint (none yet: its start) and says so, and ends
#            with the same weights.
# coordinator  The coordinator is killed mid-job and started again on its
#            state directory: the shards and workers register again by
#            themselves and the job finishes from its checkpoint.
set -euo pipefail
build=$(cd "$1" && pwd)
case_name=$2
cd "$(dirname "$0")/.."
bin_server=$build/server/tally-server
bin_worker=$build/worker/tally-worker
bin_tally=$build/client/tally
. "$(dirname "${BASH_SOURCE[0]}")/process_helpers.sh"
port=$(free_port)
addr=127.0.0.1:$port
# mTLS and tokens (server_auth, worker_auth, tally) and the job helpers.
. "$(dirname "${BASH_SOURCE[0]}")/job_helpers.sh"

start_coordinator() {  # [more flags]
  "$bin_server" "${server_auth[@]}" --listen=127.0.0.1 --port="$port" --lease_timeout_ms=1000 --noshard "$@" > "$dir/coordinator.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q "listening on" "$dir/coordinator.log" && tally health > /dev/null 2>&1 && return 0
    sleep 0.05
  done
  fail "coordinator did not come up"
}
start_shard() {  # name port [more flags]
  "$bin_server" "${server_auth[@]}" --listen=127.0.0.1 --port="$2" --coordinator="$addr" --advertise="127.0.0.1:$2" --lease_timeout_ms=1000 "${@:3}" > "$dir/$1.log" 2>&1 &
  pids+=($!)
  eval "pid_$1=$!"
  for _ in $(seq 100); do grep -q "registered with" "$dir/$1.log" && return 0; sleep 0.05; done
  fail "shard $1 did not register"
}
start_worker() {  # name [more flags]
  "$bin_worker" --server="$addr" "${worker_auth[@]}" --devices=cpu:1 --name="$1" --health_port=-1 "${@:2}" > "$dir/$1.log" 2>&1 &
  pids+=($!)
  eval "pid_$1=$!"
}
ranks_spec() {  # -> a path: 4 ranks over 2 workers, 2 shards
  local f=$dir/job-ranks.yaml
  sed -e "s/^name: .*/name: ranks/" \
      -e "s/^training: .*/training: {epochs: 8, batch_size: 32, seed: 1, ranks: 4, workers: 2, shards: 2}/" \
    "$(job_spec 2 "{type: sgd, lr: 0.05, momentum: 0.9}" 8)" > "$f"
  echo "$f"
}
# training.replicas is left unset: a bsp job that can have two copies has
# them by default.
replicas_spec() {  # -> a path: 4 ranks over 2 workers, one range, 2 copies
  local f=$dir/job-replicas.yaml
  sed -e "s/^name: .*/name: replicas/" \
      -e "s/^training: .*/training: {epochs: 16, batch_size: 32, seed: 1, ranks: 4, workers: 2, shards: 1}/" \
    "$(job_spec 1 "{type: adam, lr: 0.002}" 16)" > "$f"
  echo "$f"
}
# The port of the live shard holding job $1's primary (or, with "backup
# copy" as $2, its backup) copy, from `tally shards` (a lost shard is
# listed with what it last held).
copy_port() {  # job "primary,|backup copy"
  tally shards | awk -v job="$1" -v what="$2" '
    /^[^ ]/ { address = $2; live = $3 == "live" }
    live && $1 == job && index($0, what) { n = split(address, a, ":"); print a[n] }'
}
# The name of the worker holding rank $2 of job $1.
rank_holder() {  # job rank
  tally status "$1" --json | python3 -c "
import json, sys
for p in json.load(sys.stdin)['metrics'].get('progress', []):
    if p.get('rank', 0) == $2: print(p.get('name', ''))"
}
job_spec() {  # shards optimizer epochs -> a path
  local f=$dir/job-$1-$2-$3.yaml
  cat > "$f" <<YAML
name: sharded-$1
model:
  layers:
    - linear: {in_features: 32, out_features: 256}
    - relu
    - linear: {in_features: 256, out_features: 64}
    - relu
    - linear: {in_features: 64, out_features: 4}
dataset: {name: synthetic, train_size: 8192, test_size: 1024, features: 32, classes: 4, seed: 1}
training: {epochs: $3, batch_size: 64, seed: 1, workers: 2, shards: $1}
optimizer: $2
YAML
  echo "$f"
}
# The tensors of a .safetensors file, without its metadata (job id, ...).
tensor_bytes_equal() {  # a b
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return header, raw[8 + n:]
ha, da = tensors(sys.argv[1])
hb, db = tensors(sys.argv[2])
sys.exit(0 if ha == hb and da == db else 1)
PY
}

case $case_name in
  identical)
    start_coordinator
    # The first two shards sum pushes as they arrive (this model is below
    # the size where they would by default), the third stages them whole:
    # the 3-shard job's weights are still the 1-shard job's.
    start_shard s1 "$(free_port)" --streamed_sums_min_bytes=0
    start_shard s2 "$(free_port)" --streamed_sums_min_bytes=0
    start_shard s3 "$(free_port)" --streamed_sums=false
    start_worker w1
    start_worker w2
    for opt in "{type: sgd, lr: 0.05, momentum: 0.9}" "{type: adam, lr: 0.002}"; do
      name=$(echo "$opt" | cut -d' ' -f2 | tr -d ',')
      for k in 1 2 3; do
        id=$(submit "$(job_spec $k "$opt" 2)" --wait)
        [[ $(job_field "$id" "['state']") == SUCCEEDED ]] || fail "$id with $k shards did not succeed"
        tally fetch "$id" --output="$dir/$name-$k.safetensors" > /dev/null || fail "fetch $id"
      done
      tensor_bytes_equal "$dir/$name-1.safetensors" "$dir/$name-2.safetensors" ||
        fail "$name: 2 shards gave other weights than 1"
      tensor_bytes_equal "$dir/$name-1.safetensors" "$dir/$name-3.safetensors" ||
        fail "$name: 3 shards gave other weights than 1"
      acc=$(job_field "$id" "['metrics']['test_accuracy']")
      python3 -c "import sys; sys.exit(0 if $acc > 0.75 else 1)" || fail "$name: test accuracy $acc"
    done
    # A long job, to see its ranges while it trains.
    id=$(submit "$(job_spec 3 "{type: sgd, lr: 0.05, momentum: 0.9}" 200)")
    wait_step "$id" 10 30
    listing=$(tally shards)
    [[ $(grep -c "^shard-" <<< "$listing") == 3 ]] || fail "tally shards: $listing"
    [[ $(grep -c "$id " <<< "$listing") == 3 ]] || fail "the job is not on three shards: $listing"
    tally cancel "$id" > /dev/null
    echo "identical: SGD and Adam weights bit-identical over 1, 2 and 3 shards"
    ;;
  overlap)
    # Pushes that overlap the backward pass (each layer's gradient sent as
    # it is produced, in buckets of 1000 elements here, so a push is many
    # messages in no fixed order), pulls that overlap the forward pass and
    # Exchange streams give the same weights, bit for bit, as whole pushes
    # and pulls on a call each; over two shards (SGD, Adam) and one (SGD,
    # where pulls overlap).
    start_coordinator
    # Summing pushes as they arrive (this small model would be staged by
    # default), so a higher rank's push waits on the wire for the lower's.
    start_shard s1 "$(free_port)" --streamed_sums_min_bytes=0
    start_shard s2 "$(free_port)" --streamed_sums_min_bytes=0
    for mode in whole overlapped; do
      # whole: a PushGradients and a PullWeights call per step, nothing
      # overlapped; overlapped: one Exchange stream per shard, pushes beside
      # backward, and (on one shard) pulls beside forward.
      flags=(--overlap_push=false --overlap_pull=false --exchange_stream=false)
      [[ $mode == overlapped ]] && flags=(--overlap_push=true --overlap_pull=true --exchange_stream=true)
      start_worker "${mode}1" "${flags[@]}" --push_chunk_elements=1000
      start_worker "${mode}2" "${flags[@]}" --push_chunk_elements=1000
      for job in "2 {type: sgd, lr: 0.05, momentum: 0.9}" "2 {type: adam, lr: 0.002}" \
                 "1 {type: sgd, lr: 0.05, momentum: 0.9}"; do
        k=${job%% *} opt=${job#* }
        name=$(echo "$opt" | cut -d' ' -f2 | tr -d ',')-$k
        id=$(submit "$(job_spec "$k" "$opt" 2)" --wait)
        [[ $(job_field "$id" "['state']") == SUCCEEDED ]] || fail "$id ($mode) did not succeed"
        tally fetch "$id" --output="$dir/$name-$mode.safetensors" > /dev/null || fail "fetch $id"
      done
      eval "kill -9 \$pid_${mode}1 \$pid_${mode}2"
      sleep 1.5  # their leases (1 s) expire: the next jobs go to the next pair
    done
    grep -q "pushes overlap the backward pass" "$dir/overlapped1.log" ||
      fail "the overlapping workers did not overlap their pushes"
    ! grep -q "pushes overlap the backward pass" "$dir/whole1.log" ||
      fail "--overlap_push=false still overlapped"
    for name in sgd-2 adam-2 sgd-1; do
      tensor_bytes_equal "$dir/$name-whole.safetensors" "$dir/$name-overlapped.safetensors" ||
        fail "$name: overlapped pushes and pulls gave other weights than whole ones"
    done
    echo "overlap: SGD and Adam weights bit-identical with and without streams and overlap (1 and 2 shards)"
    ;;
  lost|fresh)
    start_coordinator --state_dir="$dir/state" --checkpoint_interval_s=0.2
    port1=$(free_port)
    port2=$(free_port)
    start_shard s1 "$port1"
    start_shard s2 "$port2"
    start_worker w1
    start_worker w2
    id=$(submit "$(job_spec 2 "{type: sgd, lr: 0.05, momentum: 0.9}" 30)")
    wait_step "$id" 300 60
    sleep 0.5  # a checkpoint past step 300
    kill -9 "$pid_s2"
    step_at_kill=$(job_field "$id" "['metrics']['step']")
    if [[ $case_name == lost ]]; then
      sleep 2  # the lease runs out; the job waits for a second shard
      start_shard s2b "$port2"
    else
      start_shard s3 "$(free_port)"
    fi
    wait_state "$id" SUCCEEDED 180
    # The resume is in the job's events; the message of the ended job no
    # longer says it (it said what the job waited for, while it waited).
    message=$(job_field "$id" "['message']")
    [[ $message != *resum* ]] || fail "the ended job's message still says '$message'"
    tally report "$id" --output="$dir/report.html" > /dev/null || fail "report"
    event=$(grep -o "a parameter shard was lost; the job starts again from the checkpoint of step [0-9]*" "$dir/report.html" | head -n 1)
    [[ -n $event ]] || fail "no resume in the events"
    grep -q "placed again on 2 parameter shards" "$dir/report.html" || fail "no placement event"
    resumed=${event##* }
    # The checkpoint past step 300 (the coordinator's view of the step lags
    # the shards' a little, so the kill may come after a later one).
    (( resumed >= 300 )) || fail "resumed at $resumed, killed at about $step_at_kill"
    acc=$(job_field "$id" "['metrics']['test_accuracy']")
    python3 -c "import sys; sys.exit(0 if $acc > 0.75 else 1)" || fail "test accuracy $acc"
    # No worker restarted: the same two processes trained to the end.
    kill -0 "$pid_w1" && kill -0 "$pid_w2" || fail "a worker process died"
    (( $(grep -c "registered with" "$dir/w1.log") == 1 )) || fail "w1 registered again"
    grep -q "finished at step" "$dir/w1.log" || fail "w1 did not train to the end"
    grep -q "finished at step" "$dir/w2.log" || fail "w2 did not train to the end"
    echo "$case_name: killed at step $step_at_kill, resumed at $resumed on every shard, test accuracy $acc"
    ;;
  ranks)
    start_coordinator --state_dir="$dir/state" --checkpoint_interval_s=0.2
    port2=$(free_port)
    start_shard s1 "$(free_port)"
    start_shard s2 "$port2"
    start_worker w1
    start_worker w2
    # Fault-free.
    id=$(submit "$(ranks_spec)" --wait)
    [[ $(job_field "$id" "['state']") == SUCCEEDED ]] || fail "$id (fault-free) did not succeed"
    tally fetch "$id" --output="$dir/free.safetensors" > /dev/null || fail "fetch $id"
    grep -q "assigned $id as ranks [0-9], [0-9] of 4" "$dir/w1.log" || fail "w1 did not hold two ranks"
    # A worker holding two ranks dies for good: the other computes all four.
    id=$(submit "$(ranks_spec)")
    wait_step "$id" 60 60
    victim=$(rank_holder "$id" 3)
    [[ $victim == w1 || $victim == w2 ]] || fail "no worker holds rank 3: '$victim'"
    eval "kill -9 \$pid_$victim"
    wait_state "$id" SUCCEEDED 120
    survivor=w1; [[ $victim == w1 ]] && survivor=w2
    grep -q "$id: rank 3 of 4 from step [1-9]" "$dir/$survivor.log" || fail "$survivor did not take rank 3"
    tally fetch "$id" --output="$dir/worker-kill.safetensors" > /dev/null || fail "fetch $id"
    tensor_bytes_equal "$dir/free.safetensors" "$dir/worker-kill.safetensors" ||
      fail "a worker's death changed the weights"
    # A worker and a shard at once, with a spare: the spare takes the dead
    # worker's ranks, the ranges come back from the last checkpoint.
    start_worker "${victim}b"
    start_worker spare
    sleep 0.5
    id=$(submit "$(ranks_spec)")
    wait_step "$id" 60 60
    victim=$(rank_holder "$id" 0)
    sleep 0.3  # a checkpoint past step 60
    eval "kill -9 \$pid_$victim \$pid_s2"
    sleep 1.5  # the shard is lost (its connection closed); its port frees
    start_shard s2b "$port2"
    wait_state "$id" SUCCEEDED 120
    tally fetch "$id" --output="$dir/both.safetensors" > /dev/null || fail "fetch $id"
    tensor_bytes_equal "$dir/free.safetensors" "$dir/both.safetensors" ||
      fail "a worker's and a shard's deaths changed the weights"
    tally report "$id" --output="$dir/report.html" > /dev/null || fail "report"
    grep -q "starts again from the checkpoint of step" "$dir/report.html" || fail "no resume in the events"
    taker=$(grep -l "$id: rank 0 of 4 from step [1-9]" "$dir"/w*.log "$dir/spare.log" | grep -v "/$victim.log" || true)
    [[ -n $taker ]] || fail "no other worker took rank 0"
    echo "ranks: weights byte-identical to the fault-free run after a worker kill (its ranks computed by the survivor) and after a worker and a shard killed at once"
    ;;
  replicas)
    # A checkpoint every 60 s: a roll-back would show in the events.
    start_coordinator --state_dir="$dir/state" --checkpoint_interval_s=60
    for s in 1 2 3; do
      eval "port_s$s=\$(free_port)"
      eval "start_shard s$s \$port_s$s"
    done
    start_worker w1
    start_worker w2
    id=$(submit "$(replicas_spec)" --wait)
    [[ $(job_field "$id" "['state']") == SUCCEEDED ]] || fail "$id (fault-free) did not succeed"
    tally fetch "$id" --output="$dir/free.safetensors" > /dev/null || fail "fetch $id"
    for copy in primary backup both; do
      id=$(submit "$(replicas_spec)")
      wait_step "$id" 60 60
      tally shards > "$dir/shards-$copy.txt"
      grep -q "primary, backup on 127.0.0.1:" "$dir/shards-$copy.txt" || fail "tally shards shows no primary"
      grep -q "backup copy" "$dir/shards-$copy.txt" || fail "tally shards shows no backup"
      what="primary,"; [[ $copy == backup ]] && what="backup copy"
      port=$(copy_port "$id" "$what")
      victim=""
      for s in 1 2 3; do
        if eval "[[ \$port_s$s == $port ]]"; then victim=s$s; fi
      done
      [[ -n $victim ]] || fail "no shard holds the $copy of $id (port '$port')"
      if [[ $copy == both ]]; then
        # Both copies at once: the job rolls back, and says so.
        port=$(copy_port "$id" "backup copy")
        for s in 1 2 3; do
          if eval "[[ \$port_s$s == $port ]]"; then second=s$s; fi
        done
        [[ -n $second && $second != "$victim" ]] || fail "no shard holds the backup of $id (port '$port')"
        step_at_kill=$(job_field "$id" "['metrics']['step']")
        eval "kill -9 \$pid_$victim \$pid_$second"
        wait_state "$id" SUCCEEDED 120
        tally fetch "$id" --output="$dir/both-kill.safetensors" > /dev/null || fail "fetch $id"
        tensor_bytes_equal "$dir/free.safetensors" "$dir/both-kill.safetensors" ||
          fail "the loss of both copies changed the weights"
        tally report "$id" --output="$dir/report-both.html" > /dev/null || fail "report"
        grep -q "a parameter shard was lost; the job starts again from" "$dir/report-both.html" ||
          fail "the loss of both copies reported no roll-back"
        echo "replicas: both copies' shards killed at about step $step_at_kill: rolled back as reported, weights byte-identical"
        continue
      fi
      step_at_kill=$(job_field "$id" "['metrics']['step']")
      eval "kill -9 \$pid_$victim"
      if [[ $copy == primary ]]; then
        # The spare shard gets a new backup, seeded from the new primary
        # while the job trains (no hold); once it has caught up, the new
        # primary is killed too, and the seeded copy takes over.
        killed=$port port=""
        for _ in $(seq 200); do
          port=$(copy_port "$id" "primary,")
          [[ -n $port && $port != "$killed" && -n $(copy_port "$id" "backup copy") ]] && break
          port=""
          sleep 0.05
        done
        [[ -n $port ]] || fail "no new backup was seeded"
        second=""
        for s in 1 2 3; do
          if eval "[[ \$port_s$s == $port ]]"; then second=s$s; fi
        done
        [[ -n $second ]] || fail "no shard holds the new primary (port '$port')"
        # Seeded with no hold: it catches up while the job trains, and
        # counts as a copy once its primary says it is in step.
        for _ in $(seq 200); do
          tally report "$id" --output="$dir/report-seed.html" > /dev/null || fail "report"
          grep -q "caught up with its primary" "$dir/report-seed.html" && break
          sleep 0.05
        done
        grep -q "caught up with its primary" "$dir/report-seed.html" || fail "the new backup never caught up"
        wait_step "$id" $(( $(job_field "$id" "['metrics']['step']") + 20 )) 60
        eval "kill -9 \$pid_$second" || fail "the new primary's shard $second is not running"
      fi
      wait_state "$id" SUCCEEDED 120
      tally fetch "$id" --output="$dir/$copy-kill.safetensors" > /dev/null || fail "fetch $id"
      tensor_bytes_equal "$dir/free.safetensors" "$dir/$copy-kill.safetensors" ||
        fail "the loss of the $copy changed the weights"
      tally report "$id" --output="$dir/report-$copy.html" > /dev/null || fail "report"
      ! grep -q "starts again from" "$dir/report-$copy.html" || fail "the $copy's loss rolled the job back"
      grep -q "is seeded from its primary" "$dir/report-$copy.html" || fail "no new backup in the events"
      if [[ $copy == primary ]]; then
        (( $(grep -o "1 backup range took over; nothing was rolled back" "$dir/report-$copy.html" | wc -l) == 2 )) ||
          fail "not two takeovers in the events"
      else
        grep -q "1 range lost its backup; nothing was rolled back" "$dir/report-$copy.html" ||
          fail "no lost backup in the events"
      fi
      then=""
      [[ $copy == primary ]] && then=", then the new primary's (a backup seeded meanwhile took over)"
      echo "replicas: the $copy's shard killed at about step $step_at_kill$then: weights byte-identical, nothing rolled back"
      sleep 1.5  # the ports free
      # Three shards again.
      for s in $victim ${second:-}; do
        eval "start_shard ${s}b \$port_$s"
        eval "pid_$s=\$pid_${s}b"
      done
      second=""
    done
    ;;
  coordinator)
    start_coordinator --state_dir="$dir/state" --checkpoint_interval_s=0.2
    start_shard s1 "$(free_port)"
    start_shard s2 "$(free_port)"
    start_worker w1
    start_worker w2
    id=$(submit "$(job_spec 2 "{type: sgd, lr: 0.05, momentum: 0.9}" 30)")
    wait_step "$id" 300 60
    sleep 0.5  # a checkpoint past step 300
    kill -9 "${pids[0]}"
    sleep 1
    start_coordinator --state_dir="$dir/state" --checkpoint_interval_s=0.2
    grep -q "1 restored" "$dir/coordinator.log" || fail "the job was not restored"
    step=$(job_field "$id" "['metrics']['step']")
    (( step >= 300 )) || fail "restored at step $step"
    wait_state "$id" SUCCEEDED 180
    (( $(grep -c "registered with" "$dir/s1.log") == 2 )) || fail "s1 did not register again"
    kill -0 "$pid_w1" && kill -0 "$pid_w2" || fail "a worker process died"
    acc=$(job_field "$id" "['metrics']['test_accuracy']")
    python3 -c "import sys; sys.exit(0 if $acc > 0.75 else 1)" || fail "test accuracy $acc"
    echo "coordinator: restarted at step $step; shards and workers came back; test accuracy $acc"
    ;;
  *)
    echo "unknown case $case_name" >&2
    exit 2
    ;;
esac
