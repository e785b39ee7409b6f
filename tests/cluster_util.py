"""What the Python integration tests share: a cluster of real processes
(a tally-server, shard processes, Python and C++ workers) on loopback, each
logging to a file of its own under the test's directory.

  from cluster_util import BUILD, Cluster, fail, free_port

BUILD is the build directory the test was given (its first argument).
"""
import os
import socket
import subprocess
import tempfile
import sys

BUILD = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.join(BUILD, "python"))
import tally  # noqa: E402 - from the build directory
from tally import tally_pb2 as pb  # noqa: E402


def fail(msg):
    raise SystemExit(f"FAIL: {msg}")


def free_port():
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        t = socket.socket()
        try:
            t.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            pass
        finally:
            s.close()
            t.close()


class Cluster:
    def __init__(self, tmp, shards=0, server_args=(), shard_args=()):
        self.tmp, self.procs = tmp, []
        port = free_port()
        self.server = f"127.0.0.1:{port}"
        self.start("server", [f"{BUILD}/server/tally-server", f"--port={port}",
                              "--lease_timeout_ms=2000", *server_args]
                   + (["--noshard"] if shards else []))
        self.shards = []
        for i in range(shards):
            sp = free_port()
            self.shards.append(self.start(
                f"shard{i}", [f"{BUILD}/server/tally-server", f"--port={sp}",
                              f"--coordinator={self.server}",
                              f"--advertise=127.0.0.1:{sp}", *shard_args]))
        self.client = tally.Client(self.server)
        # wait_for_ready: a call made while the channel backs off after a
        # refused connection (the server not listening yet) waits for it
        # instead of failing at once.
        try:
            self.client._call("ListJobs", pb.ListJobsRequest, pb.ListJobsResponse)(
                pb.ListJobsRequest(), timeout=30, wait_for_ready=True)
        except Exception as e:  # noqa: BLE001 - not up in 30 s
            fail(f"the server did not start ({e}): " + self.log("server"))

    def start(self, name, cmd, env=None):
        log = open(f"{self.tmp}/{name}.log", "w")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                           env=env))
        return self.procs[-1]

    def log(self, name):
        with open(f"{self.tmp}/{name}.log") as f:
            return f.read()[-3000:]

    def python_worker(self, name, record=None, devices="cpu:1"):
        env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
        if record:
            env["TALLY_RECORD"] = record
        # The tests' datasets are written under the system's temporary
        # directory; the example corpora and Fashion-MNIST under /usr/share.
        return self.start(name, [sys.executable, "-m", "tally.worker",
                                 f"--server={self.server}", f"--devices={devices}",
                                 f"--name={name}",
                                 f"--data_root={tempfile.gettempdir()},/usr/share"], env)

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()
