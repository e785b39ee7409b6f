# What the process tests share (source it first): a scratch directory
# (`dir`, removed at exit), the processes started (`pids`, killed at exit),
# `fail` (says why, shows the tail of every log in `dir`, exits 1) and
# `free_port` (a free loopback port whose next port is free too, for a
# coordinator's data plane, so parallel tests do not collide).
dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$dir"/*.log; do
    [[ -f $f ]] && { echo "--- $f" >&2; tail -n 25 "$f" >&2; }
  done
  exit 1
}
free_port() {
  python3 -c '
import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]
    t = socket.socket()
    try:
        t.bind(("127.0.0.1", p + 1)); print(p); break
    except OSError:
        pass
'
}
