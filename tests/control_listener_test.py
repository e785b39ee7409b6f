#!/usr/bin/python3
"""The control plane's memory is bounded before its message limit applies.

gRPC 1.51 reads a message whole before it checks the size limit, and its
memory quota is per server. tally-server listens for the control plane apart
from the data plane, under a small quota (proto/transport.h): two 200 MB
SubmitJob requests at once are both refused, the server's peak RSS (VmHWM,
read from /proc, measured once) grows by far less than the 400 MB sent, and
the server goes on serving a job on both planes.

  control_listener_test.py BUILD_DIR
"""
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

import grpc

SPEC = b"""name: tiny
model: {layers: [{linear: {in_features: 4, out_features: 2}}]}
dataset: {name: synthetic, features: 4, classes: 2}
training: {workers: 1}
optimizer: {type: sgd, lr: 1.0}
"""
HUGE = 200 << 20
GROWTH_LIMIT = 100 << 20


def submit_request(spec):
    """A SubmitJobRequest by hand: field 1 (spec), length-delimited."""
    n, varint = len(spec), bytearray()
    while True:
        varint.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            break
    return b"\x0a" + bytes(varint) + spec


def peak_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def main():
    build = sys.argv[1]
    log = tempfile.NamedTemporaryFile(prefix="tally-control-", suffix=".log", delete=False)
    server = subprocess.Popen([f"{build}/server/tally-server", "--port=0"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        return run(server, log.name)
    finally:
        server.kill()
        server.wait()
        os.unlink(log.name)


def wait_listening(path):
    for _ in range(200):
        with open(path) as f:
            text = f.read()
        m = re.search(r"listening on [0-9.]+:(\d+) .*data plane on port (\d+)", text)
        if m:
            return int(m.group(1)), int(m.group(2))
        time.sleep(0.05)
    raise RuntimeError(f"tally-server did not start: {text}")


def run(server, log):
    control, data = wait_listening(log)
    assert control != data, (control, data)
    ch = grpc.insecure_channel(f"127.0.0.1:{control}",
                               options=[("grpc.max_send_message_length", -1)])
    submit = ch.unary_unary("/tally.v1.JobService/SubmitJob")
    submit(submit_request(SPEC), timeout=10)  # warm: the server's own buffers
    before = peak_rss(server.pid)

    huge = submit_request(b"#" * HUGE)
    codes = []

    def flood():
        try:
            submit(huge, timeout=60)
            codes.append("OK")
        except grpc.RpcError as e:
            codes.append(e.code().name)
    threads = [threading.Thread(target=flood) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    growth = peak_rss(server.pid) - before
    print(f"two {HUGE >> 20} MB SubmitJob: {codes}; server peak RSS +{growth / 2**20:.1f} MiB")
    if codes != ["RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"]:
        raise SystemExit(f"FAIL: two oversized SubmitJob requests were answered {codes}, "
                         "not RESOURCE_EXHAUSTED")
    if growth >= GROWTH_LIMIT:
        raise SystemExit(f"FAIL: the server's peak RSS grew {growth >> 20} MiB "
                         f"(limit {GROWTH_LIMIT >> 20}) for {2 * HUGE >> 20} MB refused")
    if server.poll() is not None:
        raise SystemExit("FAIL: the server exited")

    # It serves on: a new channel submits a job, and the data plane answers.
    ch = grpc.insecure_channel(f"127.0.0.1:{control}")
    reply = ch.unary_unary("/tally.v1.JobService/SubmitJob")(submit_request(SPEC), timeout=10)
    if b"job-" not in reply:
        raise SystemExit(f"FAIL: no job id in {reply!r}")
    health = grpc.insecure_channel(f"127.0.0.1:{data}").unary_unary(
        "/grpc.health.v1.Health/Check")
    if health(b"", timeout=10) != b"\x08\x01":  # status: SERVING
        raise SystemExit("FAIL: the data plane does not say SERVING")
    # The control listener does not carry the data plane's services.
    try:
        ch.unary_unary("/tally.v1.ParameterService/PullWeights")(b"", timeout=10)
        raise SystemExit("FAIL: the control listener served PullWeights")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise SystemExit(f"FAIL: PullWeights on the control listener: {e.code()}")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
