# Job helpers shared by the process tests (source it after defining
# `tally` (the client, pointed at the cluster) and `fail`).

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
