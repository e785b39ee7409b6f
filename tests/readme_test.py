#!/usr/bin/python3
"""The documented commands run as written.

  readme     README.md's shell blocks (```sh), but the two set-up commands
             (deploy/local-cluster.sh, deploy/test.sh), in the page's order,
             each command checked for exit status 0: the cluster by hand
             (mTLS, tokens, a shard process, two workers, the CNN job), the
             PyTorch path to its strict load_state_dict, the DLRM on that
             cluster and the standalone run. Nothing is shortened: a job
             trains as long as its spec says.
  examples   the commands in the header comment of every examples/*/job.yaml
             (the lines indented under `#`), on a cluster at localhost:7070
             of a tally-server and two Python workers whose data roots hold
             the examples' exports: an export runs to its end; a submitted
             job must train 20 steps (or end SUCCEEDED before), and is then
             cancelled, so that the run stays short.

The commands run one at a time in one bash, as in a reader's terminal, in
a scratch directory laid out as the source tree (build/, deploy/ and
examples/ link to the build and the sources), so that what they write stays
there. What a command starts in the background (`&`) keeps running until a
later block starts a tally-server of its own (a fresh cluster) or the test
ends. After a background command the test waits as a reader would: for a
tally-server until its --port accepts connections, else a second.

    python3 tests/readme_test.py BUILD_DIR readme|examples
Exits 77 (skipped) without the built Python package, PyTorch, NumPy, PyYAML
or Fashion-MNIST; the text-lm example alone is skipped without the
`fortunes` corpus.
"""
import glob
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_DIR = os.path.abspath(sys.argv[1])
PORT = 7070  # the README's and the examples' (python3 -m tally's default)
STEPS = 20   # a cut example job's steps
FASHION_MNIST = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
FORTUNES = "/usr/share/games/fortunes/*.u8"
# Where the examples' exports write (their headers name these paths).
EXPORTS = ("/tmp/fashion-mnist-npy", "/tmp/fashion-mnist-png")


def skip_unless_ready():
    """Exits 77 where the commands cannot run here."""
    try:
        import grpc  # noqa: F401 - python3 -m tally's
        import numpy  # noqa: F401 - the examples' exports and arrays
        import torch  # noqa: F401 - the Python workers'
        import yaml  # noqa: F401 - the Python client reads YAML specs with it
    except ImportError as e:
        print(f"SKIP: {e}")
        sys.exit(77)
    if not glob.glob(os.path.join(BUILD_DIR, "python", "tally", "_native*.so")):
        print("SKIP: the Python package is not built (pybind11)")
        sys.exit(77)
    if not os.path.exists(FASHION_MNIST):
        print(f"SKIP: no {FASHION_MNIST} (dataset-fashion-mnist)")
        sys.exit(77)


skip_unless_ready()
from cluster_util import fail  # noqa: E402 - after the skips (it imports tally)
import tally  # noqa: E402 - from the build directory, as cluster_util put it
from tally import tally_pb2 as pb  # noqa: E402
from tally.client import TERMINAL  # noqa: E402


def port_open(port):
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def port_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def logical_lines(block):
    """A block's commands: a line continued by a trailing backslash or by
    an open quote goes on to the next."""
    out, cur = [], ""
    for line in block.splitlines():
        cur = f"{cur}\n{line}" if cur else line
        if cur.rstrip().endswith("\\"):
            continue
        try:
            shlex.split(cur, comments=True)
        except ValueError:  # a quote still open
            continue
        if cur.strip() and not cur.lstrip().startswith("#"):
            out.append(cur)
        cur = ""
    if cur.strip():
        fail(f"a command that does not end: {cur!r}")
    return out


def words(command):
    """The command's words as bash splits them (continuations joined)."""
    return shlex.split(command.replace("\\\n", " "), comments=True)


def background(command):
    return words(command)[-1:] == ["&"]


def server_port(command):
    """The --port of a tally-server the command starts; None otherwise."""
    w = words(command)
    if not w or not w[0].endswith("tally-server"):
        return None
    for arg in w:
        if arg.startswith("--port="):
            return int(arg.split("=", 1)[1])
    return PORT


class Shell:
    """One bash, as a reader's terminal, in the scratch directory: each
    command runs with stdin closed, its exit status written to a file of
    its own. Everything it starts is in its process group, killed by
    close()."""

    def __init__(self, scratch, log):
        self.scratch, self.n = scratch, 0
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)  # a fresh terminal: the commands set it
        # This test's Python first (Debian's, with python3-torch).
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        self.log = open(log, "a")
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile"], stdin=subprocess.PIPE,
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=scratch,
                                     env=env, text=True, start_new_session=True)

    def start(self, command):
        """Runs `command`; returns the file its exit status will be in."""
        self.n += 1
        # Named by the shell too: a fresh cluster's shell must not read
        # the statuses of the one before.
        status = os.path.join(self.scratch, f".status.{self.proc.pid}.{self.n}")
        self.log.write(f"\n$ {command}\n")
        self.log.flush()
        self.proc.stdin.write(f"{{\n{command}\n}} < /dev/null\necho $? > {status}\n")
        self.proc.stdin.flush()
        return status

    @staticmethod
    def result(status):
        """The exit status in `status`; None while the command runs."""
        try:
            with open(status) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        return int(text) if text.endswith("\n") else None

    def run(self, command, timeout):
        """Runs `command` to its end within `timeout` seconds.

        Returns: its exit status."""
        status = self.start(command)
        end = time.time() + timeout
        while (rc := self.result(status)) is None:
            if time.time() > end or self.proc.poll() is not None:
                fail(f"`{command}` did not end within {timeout} s")
            time.sleep(0.2)
        if background(command):
            self.settle(command)
        return rc

    def settle(self, command):
        """Waits after a background command as a reader would."""
        port = server_port(command)
        if port is None:
            time.sleep(1)
            return
        end = time.time() + 30
        while not port_open(port):
            if time.time() > end:
                fail(f"`{command}`: nothing listens on port {port} after 30 s")
            time.sleep(0.2)

    def close(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.log.close()


def scratch_tree(tmp):
    """A directory laid out as the source tree for the commands."""
    os.symlink(BUILD_DIR, os.path.join(tmp, "build"))
    for name in ("deploy", "examples"):
        os.symlink(os.path.join(ROOT, name), os.path.join(tmp, name))


def wait_port_free():
    end = time.time() + 30
    while not port_free(PORT):
        if time.time() > end:
            fail(f"port {PORT} is in use: the documented commands need it")
        time.sleep(0.5)


def readme_blocks():
    """README.md's ```sh blocks, but the two set-up commands."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    blocks = re.findall(r"^```sh\n(.*?)^```$", text, re.S | re.M)
    setup = ("deploy/local-cluster.sh", "deploy/test.sh")
    kept = [b for b in blocks if not any(s in b for s in setup)]
    if len(blocks) - len(kept) != 2 or not kept:
        fail(f"README.md: {len(blocks)} sh blocks, {len(blocks) - len(kept)} of them "
             f"the set-up commands (want 2 and more)")
    return kept


def readme(tmp, log):
    shell = None
    try:
        for block in readme_blocks():
            commands = logical_lines(block)
            if any(server_port(c) is not None and background(c) for c in commands):
                if shell is not None:
                    shell.close()  # a fresh cluster
                wait_port_free()
                shell = Shell(tmp, log)
            shell = shell or Shell(tmp, log)
            for c in commands:
                timeout = 1200 if "--wait" in c else 180
                rc = shell.run(c, timeout)
                if rc != 0:
                    fail(f"README.md: `{c}` exited {rc}")
                print(f"ok: {c.splitlines()[0]}", flush=True)
    finally:
        if shell is not None:
            shell.close()
    for out in ("resnet.safetensors", "cnn.safetensors", "cnn.json"):
        path = os.path.join(tmp, out)
        if not os.path.exists(path) or not os.path.getsize(path):
            fail(f"README.md's commands wrote no {out}")


def example_commands():
    """(example, its header's commands) for every examples/*/job.yaml."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*", "job.yaml"))):
        commands = []
        with open(path) as f:
            for line in f:
                if not line.startswith("#"):
                    break
                m = re.match(r"#   (\S.*)$", line.rstrip("\n"))
                if m:
                    commands.append(m.group(1))
        out.append((os.path.basename(os.path.dirname(path)), commands))
    if not any(c for _, c in out):
        fail("no examples/*/job.yaml gives a command")
    return out


def new_job(client, before):
    """The id of a job not in `before`; None while there is none."""
    new = [j.id for j in client.list_jobs(omit_spec=True) if j.id not in before]
    return new[0] if new else None


def submitted(shell, client, command):
    """Runs a submitting command; its job trains STEPS steps, or ends
    SUCCEEDED first, else it is cancelled.

    Returns: the job's last state."""
    before = {j.id for j in client.list_jobs(omit_spec=True)}
    status = shell.start(command)
    job_id, job, cancelled, end = None, None, False, time.time() + 600
    while True:
        rc = shell.result(status)
        job_id = job_id or new_job(client, before)
        if job_id is None and rc is not None:
            fail(f"`{command}` exited {rc} without submitting a job")
        if job_id is not None:
            job = client.status(job_id)
            if job.state in TERMINAL and rc is not None:
                break
            if not cancelled and job.state == pb.RUNNING and job.metrics.step >= STEPS:
                try:
                    client.cancel(job_id)
                    cancelled = True
                except tally.FailedPrecondition:
                    pass  # it ended meanwhile
        if time.time() > end:
            state = pb.JobState.Name(job.state) if job is not None else "not submitted"
            fail(f"`{command}`: its job did not train {STEPS} steps within 600 s ({state})")
        time.sleep(0.5)
    # submit --wait exits 1 for a job that did not succeed; without --wait, 0.
    waits = "--wait" in words(command)
    want = {pb.SUCCEEDED: 0, pb.CANCELLED: 1 if waits else 0}.get(job.state)
    if want is None or rc != want or (job.state == pb.CANCELLED and not cancelled):
        fail(f"`{command}` exited {rc}; its job {job_id} is {pb.JobState.Name(job.state)} "
             f"at step {job.metrics.step}: {job.message}")
    return job.state


def examples(tmp, log):
    fortunes = bool(glob.glob(FORTUNES))
    made = [d for d in EXPORTS if not os.path.exists(d)]
    wait_port_free()
    shell = Shell(tmp, log)
    try:
        shell.run(f"build/server/tally-server --port={PORT} &", 60)
        roots = ",".join(EXPORTS + ("/usr/share",))
        for i in (1, 2):
            shell.run(f"PYTHONPATH=build/python python3 -m tally.worker "
                      f"--server=localhost:{PORT} --devices=cpu:1 --name=python{i} "
                      f"--data_root={roots} &", 60)
        with tally.Client(f"localhost:{PORT}") as client:
            for name, commands in example_commands():
                if name == "text-lm" and not fortunes:
                    print(f"skipped: examples/{name} (no {FORTUNES}: the fortunes package)")
                    continue
                for c in commands:
                    if " submit " in c:
                        state = submitted(shell, client, c)
                        print(f"ok: examples/{name}: `{c}`: {pb.JobState.Name(state)}",
                              flush=True)
                        continue
                    rc = shell.run(c, 600)
                    if rc != 0:
                        fail(f"examples/{name}: `{c}` exited {rc}")
                    print(f"ok: examples/{name}: `{c}`", flush=True)
    finally:
        shell.close()
        for d in made:
            shutil.rmtree(d, ignore_errors=True)


def main():
    phase = sys.argv[2] if len(sys.argv) > 2 else ""
    if phase not in ("readme", "examples"):
        sys.exit("usage: readme_test.py BUILD_DIR readme|examples")
    tmp = tempfile.mkdtemp(prefix=f"tally-{phase}-")
    log = os.path.join(tmp, "commands.log")
    scratch_tree(tmp)
    try:
        (readme if phase == "readme" else examples)(tmp, log)
    except SystemExit as e:
        if e.code not in (0, None) and os.path.exists(log):
            with open(log, errors="replace") as f:
                print(f"--- the commands' output (last 6000 bytes)\n{f.read()[-6000:]}",
                      file=sys.stderr)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{phase}: every command ran as written")


if __name__ == "__main__":
    main()
