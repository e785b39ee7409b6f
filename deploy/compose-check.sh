#!/usr/bin/env bash
# docker-compose.yml, built and run for real, with podman as the engine:
#   1. the Debian base image (debian:12, debian:12-slim) made from Debian's
#      own archive (debootstrap --variant=minbase bookworm, podman import),
#      as no registry can be reached;
#   2. `podman system service` gives docker-compose a Docker API socket;
#   3. docker-compose builds the images and brings the cluster up (mTLS and
#      tokens from deploy/make-certs.sh in out/certs); podman runs health
#      checks only when asked (no systemd), so a ticker asks every second;
#   4. once the job runs, the server container is restarted: the job must
#      come back from the state volume at a later step, not from 0;
#   5. the submit service's job succeeds and its weights land in ./out;
#   6. docker-compose down -v;
#   7. deploy/k8s with `podman kube play`, as far as podman 4.3 runs it
#      (tests/k8s_podman.py says what is converted and what is left out):
#      the coordinator and worker Deployments and the coordinator's PVC come
#      up on a pod network, their probes pass, and the ConfigMap's example
#      job trains to the end; then everything goes.
# Needs root, podman (with runc and the CNI dnsname plugin, so containers
# find each other by service name), catatonit (pods), debootstrap and
# docker-compose; exits 77 (skipped) without them. Prints how long each
# phase took.
#   deploy/compose-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for t in podman debootstrap docker-compose runc catatonit /usr/lib/cni/dnsname; do
  command -v "$t" > /dev/null || { echo "SKIP: needs $t"; exit 77; }
done
[[ $(id -u) == 0 ]] || { echo "SKIP: needs root (rootful podman)"; exit 77; }

started=$SECONDS
phase_at=$SECONDS
phase() {  # name: prints the time the previous phase took
  echo "compose-check: $1 ($((SECONDS - phase_at)) s)"
  phase_at=$SECONDS
}
project=tallycheck
sock=/run/podman/tally-compose.sock
export DOCKER_HOST=unix://$sock
export COMPOSE_PROJECT_NAME=$project
pids=()
cleanup() {
  docker-compose down -v --remove-orphans > /dev/null 2>&1 || true
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  rm -f "${conf:-}"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  docker-compose ps >&2 || true
  docker-compose logs --tail=30 >&2 || true
  exit 1
}

# Podman's settings for this check alone (CONTAINERS_CONF, not the host's
# file): runc (crun refuses this cgroup layout) and limits no higher than
# the kernel lets a container set.
conf=$(mktemp)
cat > "$conf" <<'CONF'
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=8192:8192"]
[engine]
runtime = "runc"
CONF
export CONTAINERS_CONF=$conf

# 1. The base image, once.
if ! podman image exists localhost/debian:12; then
  rootfs=$(mktemp -d)
  if ! debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian \
         > /tmp/tally-debootstrap.log 2>&1; then
    rm -rf "$rootfs"
    echo "SKIP: debootstrap cannot fetch from Debian's archive (see /tmp/tally-debootstrap.log)"
    exit 77
  fi
  tar -C "$rootfs" -c . | podman import - localhost/debian:12 > /dev/null
  rm -rf "$rootfs"
fi
podman tag localhost/debian:12 localhost/debian:12-slim
phase "base image"

# 2. The Docker API.
mkdir -p "$(dirname "$sock")"
podman system service --time=0 "unix://$sock" > /dev/null 2>&1 &
pids+=($!)
for _ in $(seq 50); do [[ -S $sock ]] && break; sleep 0.1; done
[[ -S $sock ]] || fail "podman system service did not start"

# 3. Build and start (after whatever an earlier run left behind).
docker-compose down -v --remove-orphans > /dev/null 2>&1 || true
podman network rm -f "${project}_default" > /dev/null 2>&1 || true
[[ -f out/certs/tokens.txt ]] || deploy/make-certs.sh out/certs > /dev/null
rm -f out/fashion-mnist-mlp.safetensors
docker-compose build > out/compose-build.log 2>&1 || { tail -n 30 out/compose-build.log; fail "build"; }
phase "images built"
tick() {  # runs every container's health check, every second
  while true; do
    for c in $(podman ps --filter "label=com.docker.compose.project=$project" --format '{{.Names}}'); do
      podman healthcheck run "$c" > /dev/null 2>&1 || true
    done
    sleep 1
  done
}
tick &
pids+=($!)
docker-compose up -d > out/compose-up.log 2>&1 || { cat out/compose-up.log; fail "up"; }
phase "cluster up (every service healthy)"

# The client on the host reaches the server's published port.
tally() {
  build/client/tally --server=localhost:7070 --tls_ca=out/certs/ca.pem \
    --tls_cert=out/certs/node.pem --tls_key=out/certs/node.key \
    --token_file=out/certs/admin.token --timeout_s=10 "$@"
}
if [[ ! -x build/client/tally ]]; then
  tally() {  # no host build: the client inside the server's image
    podman run --rm --network host -v "$PWD/out/certs:/certs:ro" localhost/tally:latest \
      tally --server=localhost:7070 --tls_ca=/certs/ca.pem --tls_cert=/certs/node.pem \
      --tls_key=/certs/node.key --token_file=/certs/admin.token --timeout_s=10 "$@"
  }
fi
step_of() { tally status "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["metrics"]["step"])'; }
id=""
for _ in $(seq 300); do
  id=$(tally list 2> /dev/null | awk '/RUNNING/ {print $1; exit}') || true
  [[ -n $id ]] && (($(step_of "$id") >= 200)) && break
  sleep 1
done
[[ -n $id ]] || fail "no job running"
phase "job $id running"

# 4. Restart the server mid-job: the job resumes from the volume.
before=$(step_of "$id")
docker-compose restart server > /dev/null 2>&1 || fail "restart"
for _ in $(seq 120); do tally health > /dev/null 2>&1 && break; sleep 1; done
after=$(step_of "$id") || fail "the server did not come back"
state=$(tally status "$id" | awk 'NR == 1 {print $2}')
[[ $state == RUNNING || $state == SUCCEEDED ]] || fail "after the restart $id is $state"
# A stopped server writes every job's state first: nothing is redone.
((after >= before)) || fail "after the restart $id is back at step $after (was at $before)"
echo "compose-check: $id at step $before before the restart, $after after"
phase "server restarted, job resumed"

# 5. The submit service finishes and the weights are in ./out.
for _ in $(seq 600); do
  status=$(podman inspect --format '{{.State.Status}} {{.State.ExitCode}}' "${project}_submit_1" 2> /dev/null) || true
  [[ $status == exited* ]] && break
  sleep 1
done
[[ $status == "exited 0" ]] || fail "the submit service ended: $status"
[[ -s out/fashion-mnist-mlp.safetensors ]] || fail "no weights in out/"
acc=$(tally status "$id" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["metrics"]["test_accuracy"])')
phase "job done: test accuracy $acc, weights in out/fashion-mnist-mlp.safetensors"

# 6. Down, volumes included.
docker-compose down -v > /dev/null 2>&1 || fail "down"
phase "down"

# 7. The Kubernetes manifests under podman kube play.
kube=$(mktemp -d)  # holds a CA key and tokens: removed on the way out
trap 'kube_down; rm -rf "$kube"; cleanup' EXIT
kube_net=tallykube
kube_ip=10.90.0.10  # the coordinator pod's (hostAliases name it)
kube_pods=(tally-coordinator-pod-0 tally-worker-0-pod-0 tally-worker-1-pod-0)
kube_down() {  # also what an interrupted earlier run left
  podman pod rm -f "${kube_pods[@]}" > /dev/null 2>&1 || true
  podman volume rm -f tally-coordinator-state > /dev/null 2>&1 || true
  podman network rm -f "$kube_net" > /dev/null 2>&1 || true
}
kube_fail() {
  podman pod ps >&2 || true
  for c in $(podman ps -a --filter label=app.kubernetes.io/part-of=tally --format '{{.Names}}'); do
    echo "--- $c" >&2
    podman logs --tail 30 "$c" >&2 || true
  done
  echo "FAIL: $*" >&2
  exit 1
}
kube_down
deploy/make-certs.sh "$kube/certs" "$kube_ip" > /dev/null
python3 tests/k8s_podman.py deploy/k8s "$kube/certs" "$kube_ip" "$kube"
podman network create --subnet 10.90.0.0/24 "$kube_net" > /dev/null
podman kube play --network "$kube_net" --ip "$kube_ip" "$kube/coordinator.yaml" \
  > "$kube/play.log" 2>&1 || { cat "$kube/play.log"; kube_fail "kube play: coordinator"; }
podman kube play --network "$kube_net" "$kube/workers.yaml" \
  >> "$kube/play.log" 2>&1 || { cat "$kube/play.log"; kube_fail "kube play: workers"; }
kube_containers=$(podman ps --filter label=app.kubernetes.io/part-of=tally --format '{{.Names}}')
[[ $(wc -w <<< "$kube_containers") == 3 ]] || kube_fail "kube play: expected 3 containers, got: $kube_containers"
# The probes (podman runs them as health checks when ticked).
for _ in $(seq 60); do
  healthy=0
  for c in $kube_containers; do
    podman healthcheck run "$c" > /dev/null 2>&1 && healthy=$((healthy + 1))
  done
  ((healthy == 3)) && break
  sleep 1
done
((healthy == 3)) || kube_fail "kube play: $healthy of 3 containers pass their probes"
phase "kube play: coordinator and 2 workers up, probes pass"
kube_tally() {
  build/client/tally --server="$kube_ip:7070" --tls_ca="$kube/certs/ca.pem" \
    --tls_cert="$kube/certs/node.pem" --tls_key="$kube/certs/node.key" \
    --token_file="$kube/certs/alice.token" --timeout_s=10 "$@"
}
if [[ ! -x build/client/tally ]]; then
  kube_tally() {
    podman run --rm --network "$kube_net" -v "$kube/certs:/certs:ro" localhost/tally:latest \
      tally --server="$kube_ip:7070" --tls_ca=/certs/ca.pem --tls_cert=/certs/node.pem \
      --tls_key=/certs/node.key --token_file=/certs/alice.token --timeout_s=10 "$@"
  }
fi
# The ConfigMap's job, without its `shards: 2` (no StatefulSet of shards
# here: the coordinator holds the parameters).
python3 - deploy/k8s/configmap-job.yaml > "$kube/job.yaml" <<'PY'
import sys, yaml
cm = yaml.safe_load(open(sys.argv[1]))
(spec,) = cm["data"].values()
job = yaml.safe_load(spec)
job["training"].pop("shards", None)
print(yaml.safe_dump(job, sort_keys=False))
PY
out=$(kube_tally submit "$kube/job.yaml" --wait) || kube_fail "kube play: the example job did not succeed: $out"
echo "$out" | tail -n 2
phase "kube play: the example job trained"
kube_down
phase "kube play: down"
echo "compose-check: ok in $((SECONDS - started)) s"
