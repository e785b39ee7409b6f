# What the process tests share (source it after setting `build`,
# `bin_tally`, `addr` and defining `fail`): every process speaks mTLS and
# the server checks tokens (deploy/make-certs.sh made them: ctest's certs
# fixture), so this gives the flags (`tls`, `server_auth`, `worker_auth`),
# the client `tally` (as the admin), and the job helpers below.
certs=$build/test-certs
tls=(--tls_ca="$certs/ca.pem" --tls_cert="$certs/node.pem" --tls_key="$certs/node.key")
[[ -f $certs/tokens.txt ]] || fail "no $certs/tokens.txt: run deploy/make-certs.sh $certs"
server_auth=("${tls[@]}" --tokens="$certs/tokens.txt" --token_file="$certs/admin.token")
worker_auth=("${tls[@]}" --token_file="$certs/worker.token")
tally() { "$bin_tally" --server="$addr" "${tls[@]}" --token_file="$certs/admin.token" "$@"; }

submit() {  # spec [--wait] -> prints the job id
  local out
  out=$(tally submit "$@") || fail "submit $*: $out"
  echo "${out%%$'\n'*}"
}
job_field() {  # job field
  tally status "$1" --json |
    python3 -c "import json,sys; j=json.load(sys.stdin); print(eval('j' + sys.argv[1]))" "$2" 2>/dev/null || echo 0
}
wait_state() {  # job state timeout_s
  local deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    [[ $(job_field "$1" "['state']") == "$2" ]] && return 0
    sleep 0.2
  done
  fail "$1 did not reach $2 within $3 s (state $(job_field "$1" "['state']"))"
}
wait_step() {  # job min_step timeout_s
  local deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    (( $(job_field "$1" "['metrics']['step']") >= $2 )) && return 0
    sleep 0.1
  done
  fail "$1 did not reach step $2"
}
job_workers() {  # job -> "worker_id name" per worker on it now
  tally status "$1" --json |
    python3 -c "import json,sys; [print(p['worker_id'], p.get('name', '')) for p in json.load(sys.stdin)['metrics'].get('progress', [])]"
}
