"""python3 -m tally is the `tally` command line: on one cluster (a
tally-server and a C++ worker), the C++ client (build/client/tally) and the
Python one (PYTHONPATH=build/python python3 -m tally) give the same exit
codes and the same stdout, byte for byte, for list, status, status --json,
watch, shards, health, cancel (of a job waiting, of one ended, of none),
fetch of no job and bad usage; fetch writes the same file with both (the
PATH after the job, or --output), submit --wait ends with the same figures,
an unreachable server exits 3 with both, and the Python client's report
runs the C++ one.

    python3 tests/python_cli_test.py BUILD_DIR
Exits 77 (skipped) without grpcio or the built Python package.
"""
import os
import subprocess
import sys
import tempfile

BUILD_DIR = os.path.abspath(sys.argv[1])
try:
    import grpc  # noqa: F401 - the Python client needs it
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)
if not os.path.exists(os.path.join(BUILD_DIR, "python", "tally", "tally_pb2.py")):
    print("SKIP: the Python package is not built")
    sys.exit(77)

from cluster_util import BUILD, Cluster, fail, free_port  # noqa: E402

SPEC = """name: {name}
model:
  layers:
    - linear: {{in_features: 6, out_features: 3}}
dataset: {{name: synthetic, train_size: 256, test_size: 64, features: 6, classes: 3, seed: 1}}
training: {{epochs: 2, batch_size: 16, workers: {workers}, seed: 4}}
optimizer: {{type: sgd, lr: 0.1}}
"""


def cpp(server, *args):
    """The C++ client: (exit code, stdout, stderr)."""
    r = subprocess.run([f"{BUILD}/client/tally", f"--server={server}", *args],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def py(server, *args):
    """The Python client, --server in its other form."""
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
    r = subprocess.run([sys.executable, "-m", "tally", "--server", server, *args],
                       capture_output=True, text=True, timeout=60, env=env)
    return r.returncode, r.stdout, r.stderr


def same(server, *args, want=None):
    """Both clients run `args`: equal exit codes and stdout (the code
    `want` where given)."""
    a, b = cpp(server, *args), py(server, *args)
    if a[:2] != b[:2] or (want is not None and a[0] != want):
        fail(f"tally {' '.join(args)}:\nC++ exit {a[0]}:\n{a[1]}{a[2]}\n"
             f"Python exit {b[0]}:\n{b[1]}{b[2]}")
    print(f"same: {' '.join(args)} (exit {a[0]})")
    return a[1]


def spec(tmp, name, workers=1):
    path = os.path.join(tmp, f"{name}.yaml")
    with open(path, "w") as f:
        f.write(SPEC.format(name=name, workers=workers))
    return path


def submitted_alike(c, tmp):
    """submit --wait with each client: the same figures at the end; the
    job ids of both."""
    a = cpp(c.server, "submit", spec(tmp, "cli-a"), "--wait")
    b = py(c.server, "submit", spec(tmp, "cli-a"), "--wait")
    if a[0] != 0 or b[0] != 0:
        fail(f"submit --wait: C++ {a}, Python {b}")
    ida, idb = a[1].split("\n")[0], b[1].split("\n")[0]
    tail_a = a[1].rstrip("\n").split("\n")[-2:]
    tail_b = [s.replace(idb, ida) for s in b[1].rstrip("\n").split("\n")[-2:]]
    if tail_a != tail_b or len(ida) != len(idb):
        fail(f"submit --wait ends differently:\n{a[1]}\n{b[1]}")
    print(f"submit --wait: {tail_a[-1]}")
    return ida, idb


def cancelled_alike(c, tmp):
    """Two jobs that wait for two workers (there is one), one cancelled by
    each client: the same answer but for the id."""
    ids = [cpp(c.server, "submit", spec(tmp, "cli-wait", 2))[1].split("\n")[0]
           for _ in range(2)]
    a, b = cpp(c.server, "cancel", ids[0]), py(c.server, "cancel", ids[1])
    if a[0] != 0 or (a[0], a[1]) != (b[0], b[1].replace(ids[1], ids[0])):
        fail(f"cancel: C++ {a}, Python {b}")
    print(f"cancel: {a[1].strip()}")


def fetched_alike(c, tmp, job_id):
    a = cpp(c.server, "fetch", job_id, f"{tmp}/c.safetensors")
    b = py(c.server, "fetch", job_id, f"--output={tmp}/p.safetensors")
    if a[0] != 0 or (a[0], a[1]) != (b[0], b[1].replace("p.safetensors", "c.safetensors")):
        fail(f"fetch: C++ {a}, Python {b}")
    with open(f"{tmp}/c.safetensors", "rb") as f, open(f"{tmp}/p.safetensors", "rb") as g:
        if f.read() != g.read():
            fail("fetch wrote different files")
    if os.path.exists(f"{tmp}/p.safetensors.part"):
        fail("fetch left its .part file")
    print(f"fetch: {a[1].strip()}, the same bytes")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        c = Cluster(tmp)
        try:
            same(c.server, "list", want=0)  # no jobs
            c.start("worker", [f"{BUILD}/worker/tally-worker", f"--server={c.server}",
                               "--devices=cpu:1"])
            job_id, _ = submitted_alike(c, tmp)
            cancelled_alike(c, tmp)
            same(c.server, "list", want=0)
            same(c.server, "status", job_id, want=0)
            same(c.server, "status", job_id, "--json", want=0)
            same(c.server, "watch", job_id, want=0)
            same(c.server, "shards", want=0)
            same(c.server, "health", want=0)
            same(c.server, "health", "--service=no.such.Service", want=1)
            same(c.server, "cancel", job_id, want=1)  # it has ended
            same(c.server, "cancel", "no-such-job", want=1)
            same(c.server, "status", "no-such-job", want=1)
            same(c.server, "fetch", "no-such-job", f"{tmp}/none.safetensors", want=1)
            same(c.server, "fetch", job_id, want=2)  # no path
            same(c.server, "status", want=2)
            same(c.server, "frobnicate", want=2)
            fetched_alike(c, tmp, job_id)
            same(f"127.0.0.1:{free_port()}", "list", want=3)
            r = py(c.server, "report", job_id, f"{tmp}/report.html")
            if r[0] != 0 or job_id not in open(f"{tmp}/report.html").read():
                fail(f"report: {r}")
            print("PASS")
        finally:
            c.stop()


if __name__ == "__main__":
    main()
