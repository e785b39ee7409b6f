#!/usr/bin/python3
"""The cases of bench/server_bounds.sh: hostile requests against a running
tally-server, each case's peak resident memory (VmRSS, polled every 20 ms
on a thread of its own) over its RSS just before, and the statuses the
requests got, by gRPC code and typed reason (ErrorDetail).

  server_bounds.py free-port
  server_bounds.py offers|rows|tables|specs --server=HOST:PORT --pid=PID
      --out=FILE [--job=JOB.yaml]
  server_bounds.py table FILE

Each case appends its lines to FILE as JSON; `table` prints them. The
worker the cases need is a fake one: it registers as a Python worker
(RegisterWorkerRequest.python, protocol_version WORKER_PROTOCOL_CURRENT),
heartbeats, builds nothing and never pushes; it offers initial weights of
0.5 (OfferInitialWeights, float32 chunks of 1 MiB) when the coordinator
asks, so that a job of it starts and its pulls of rows wait for a version
that never comes.
"""
import argparse
import collections
import dataclasses
import json
import socket
import statistics
import struct
import sys
import threading
import time
from typing import Callable, Iterator, List, Optional, Tuple

import grpc

import tally
from tally import tally_pb2 as pb

MIB = 1 << 20
DEADLINE = 30.0                 # every call's, in seconds
CHUNK = 1 << 18                 # float32 values a chunk: 1 MiB
MAX_VALUES = 1 << 18            # row values a PullRows (SparseTables)
HALF = struct.pack("<f", 0.5) * CHUNK
OFFER_SHAPE = (4096, 4096)      # 16 Mi float32: 64 MiB of initial weights


def log(*args) -> None:
    print("server_bounds:", *args, file=sys.stderr, flush=True)


def free_port() -> int:
    """A port that is free, and the next one too (a coordinator's data
    plane listens on --port + 1)."""
    while True:
        with socket.socket() as s, socket.socket() as t:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
            try:
                t.bind(("127.0.0.1", p + 1))
                return p
            except OSError:
                pass


def channel(address: str) -> grpc.Channel:
    """A channel of its own (its own connection), with no send limit: the
    server's limits are what is measured."""
    return grpc.insecure_channel(address, options=[
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.max_send_message_length", -1),
        ("grpc.max_receive_message_length", 8 * MIB)])


def method(ch: grpc.Channel, name: str, resp, kind: str = "unary_unary"):
    """A Tally method; requests go as bytes (serialized here)."""
    return getattr(ch, kind)(f"/tally.v1.{name}", request_serializer=None,
                             response_deserializer=resp.FromString)


def status_of(e: grpc.RpcError) -> str:
    """CODE, or CODE+REASON when the status carries a Tally ErrorDetail."""
    reason = ""
    for key, value in e.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        for detail in pb.RpcStatus.FromString(value).details:
            if detail.type_url.endswith("/tally.v1.ErrorDetail"):
                r = pb.ErrorDetail.FromString(detail.value).reason
                if r != pb.ERROR_REASON_UNSPECIFIED:
                    reason = "+" + pb.ErrorReason.Name(r)
    return e.code().name + reason


class Statuses:
    """Statuses by kind, and the first message of each (for the log)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: collections.Counter = collections.Counter()
        self.first: dict = {}

    def add(self, kind: str, message: str = "") -> None:
        with self.lock:
            self.counts[kind] += 1
            self.first.setdefault(kind, message)

    def error(self, e: grpc.RpcError) -> None:
        self.add(status_of(e), e.details() or "")

    def __str__(self) -> str:
        return ", ".join(f"{k} x{n}" for k, n in self.counts.most_common())

    def only(self, allowed: Tuple[str, ...]) -> bool:
        return bool(self.counts) and all(k in allowed for k in self.counts)

    def show(self, case: str) -> None:
        for kind, message in self.first.items():
            log(f"{case}: {kind}: {message[:200]}")


class RssPoller:
    """A process's VmRSS every 20 ms while in the `with`: its peak against
    its RSS just before (the median of ten samples over 0.2 s)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    def rss(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for {self.pid}")

    def __enter__(self) -> "RssPoller":
        samples = []
        for _ in range(10):
            samples.append(self.rss())
            time.sleep(0.02)
        self.idle = statistics.median(samples)
        self.peak = self.idle
        self.thread.start()
        return self

    def poll(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, self.rss())
            except (OSError, RuntimeError):
                return  # the process is gone: the caller sees why
            self.stop.wait(0.02)

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.rss())

    def growth(self) -> float:
        return (self.peak - self.idle) / MIB

    def now(self) -> float:
        """RSS now over the idle, MiB."""
        return (self.rss() - self.idle) / MIB


@dataclasses.dataclass
class Line:
    case: str
    bound: str
    peak_mib: float
    statuses: str
    documented: bool
    notes: str = ""


def record(out: str, line: Line, statuses: Statuses) -> None:
    statuses.show(line.case)
    log(f"{line.case}: peak +{line.peak_mib:.1f} MiB; {line.statuses}; {line.notes}")
    with open(out, "a") as f:
        f.write(json.dumps(dataclasses.asdict(line)) + "\n")


class FakeWorker:
    """A Python worker that only registers, heartbeats (every 0.2 s, on a
    thread of its own) and keeps what the heartbeats answer: the initial
    weights wanted of it, and its assignment. It never trains."""

    def __init__(self, server: str, name: str) -> None:
        self.ch = channel(server)
        register = method(self.ch, "WorkerService/RegisterWorker", pb.RegisterWorkerResponse)
        r = register(pb.RegisterWorkerRequest(
            name=name, devices="cpu:1", python="Python 3 (bench/server_bounds.py, never trains)",
            protocol_version=pb.WORKER_PROTOCOL_CURRENT).SerializeToString(),
            timeout=DEADLINE, wait_for_ready=True)
        self.id, self.incarnation = r.worker_id, r.incarnation
        self.period = min((r.lease_ms or 3000) / 4000.0, 0.2)
        self.cond = threading.Condition()
        self.wanted: Optional[pb.InitialWeightsWanted] = None
        self.assignment: Optional[pb.Assignment] = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.beat, daemon=True)
        self.thread.start()

    def beat(self) -> None:
        heartbeat = method(self.ch, "WorkerService/Heartbeat", pb.HeartbeatResponse)
        while not self.stopped.is_set():
            with self.cond:
                a = self.assignment
            req = pb.HeartbeatRequest(worker_id=self.id, incarnation=self.incarnation,
                                      job_id=a.job_id if a else "", held=a.key if a else "")
            try:
                resp = heartbeat(req.SerializeToString(), timeout=2.0)
            except grpc.RpcError as e:
                log(f"heartbeat: {status_of(e)}: {e.details()}")
            else:
                with self.cond:
                    self.wanted = resp.initial_weights if resp.HasField("initial_weights") else None
                    if resp.HasField("assignment"):
                        self.assignment = resp.assignment
                    elif not resp.unchanged:
                        self.assignment = None
                    self.cond.notify_all()
            self.stopped.wait(self.period)

    def wait_for(self, what: str, ready: Callable[["FakeWorker"], object]):
        """What `ready` returns once it is true (under the lock)."""
        with self.cond:
            got = self.cond.wait_for(lambda: ready(self), timeout=DEADLINE)
        if not got:
            raise SystemExit(f"server_bounds: the worker did not get {what} in {DEADLINE} s")
        return got

    def wants(self, job_id: str) -> Optional[pb.InitialWeightsWanted]:
        return self.wanted if self.wanted is not None and self.wanted.job_id == job_id else None

    def assigned(self, job_id: str) -> Optional[pb.Assignment]:
        a = self.assignment
        return a if a is not None and a.job_id == job_id else None

    def header(self, job_id: str) -> bytes:
        """An offer's first fields (its first message is these and chunk 0)."""
        return pb.InitialWeightsChunk(job_id=job_id, worker_id=self.id,
                                      incarnation=self.incarnation).SerializeToString()

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.ch.close()


def chunks_of(n: int) -> List[bytes]:
    """n values of 0.5 as InitialWeightsChunk messages of 1 MiB (no header)."""
    out = []
    for offset in range(0, n, CHUNK):
        count = min(CHUNK, n - offset)
        out.append(pb.InitialWeightsChunk(chunk=pb.TensorChunk(
            offset=offset, count=count, data=HALF[:4 * count])).SerializeToString())
    return out


def offer_messages(header: bytes, chunks: List[bytes], pace: float = 0.0,
                   hold_at: int = 0, held: Optional[threading.Event] = None,
                   release: Optional[threading.Event] = None) -> Iterator[bytes]:
    """An offer's stream: the header with the first chunk, then the rest
    `pace` seconds apart; with hold_at, it stops before that chunk, says so
    (`held`) and waits for `release`, then ends without the rest."""
    yield header + chunks[0]
    for k in range(1, len(chunks)):
        if hold_at and k == hold_at:
            held.set()
            release.wait(DEADLINE)
            return
        if pace:
            time.sleep(pace)
        yield chunks[k]


def offer(server: str, header: bytes, chunks: List[bytes], statuses: Statuses,
          pace: float = 0.0) -> None:
    """One whole offer, on a connection of its own; its status counted."""
    ch = channel(server)
    try:
        call = method(ch, "WorkerService/OfferInitialWeights", pb.OfferInitialWeightsResponse,
                      "stream_unary")
        r = call(offer_messages(header, chunks, pace), timeout=DEADLINE)
        statuses.add("OK" if r.taken else "OK (not taken)")
    except grpc.RpcError as e:
        statuses.error(e)
    finally:
        ch.close()


def submit_text(server: str, spec: str) -> pb.Job:
    with channel(server) as ch:
        return method(ch, "JobService/SubmitJob", pb.SubmitJobResponse)(
            pb.SubmitJobRequest(spec=spec).SerializeToString(), timeout=DEADLINE,
            wait_for_ready=True).job


def cancel(server: str, job_id: str) -> None:
    with channel(server) as ch:
        method(ch, "JobService/CancelJob", pb.Job)(
            pb.CancelJobRequest(job_id=job_id).SerializeToString(), timeout=DEADLINE)


def python_job(name: str) -> str:
    """A Python model's spec whose flat vector is OFFER_SHAPE: the layout is
    written in the spec, so the coordinator never runs the code."""
    rows, cols = OFFER_SHAPE
    return (f"name: {name}\nmodel: {{python: {{file: m.py, code: 'import torch', params: "
            f"[{{name: fc.weight, shape: [{rows}, {cols}]}}]}}}}\n"
            "dataset: {name: synthetic, features: 4, classes: 2}\n"
            "training: {workers: 1}\noptimizer: {type: sgd, lr: 1.0}\n")


# ------------------------------------------------------------ offers ----

OFFER_BOUND = ("one offer of a job read at a time, the others OFFER_BUSY unread; "
               "offers read hold <= --max_offer_bytes (1 GiB)")


def offers(args) -> None:
    """Eight offers at once of one job's 64 MiB, one to be read; then one
    more after the install; then one held open while its job is
    cancelled."""
    worker = FakeWorker(args.server, "bounds-offers")
    job = submit_text(args.server, python_job("bounds-offers"))
    worker.wait_for(f"{job.id}'s initial weights asked", lambda w: w.wants(job.id))
    chunks = chunks_of(OFFER_SHAPE[0] * OFFER_SHAPE[1])
    header = worker.header(job.id)
    statuses = Statuses()
    gate = threading.Barrier(8)

    def one() -> None:
        gate.wait()
        offer(args.server, header, chunks, statuses, pace=0.005)
    with RssPoller(args.pid) as rss:
        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        answered = rss.growth()  # the peak until every offer was answered
        worker.wait_for(f"{job.id}'s assignment", lambda w: w.assigned(job.id))
        time.sleep(0.5)
    record(args.out, Line("offers: 8 at once of 64 MiB", OFFER_BOUND, rss.growth(),
                          str(statuses), statuses.only(("OK", "RESOURCE_EXHAUSTED+OFFER_BUSY"))
                          and statuses.counts["OK"] == 1,
                          f"peak +{answered:.1f} MiB until all were answered; then the job's "
                          f"weights installed: RSS +{rss.now():.1f} MiB 0.5 s later"), statuses)

    again = Statuses()
    with RssPoller(args.pid) as rss:
        offer(args.server, header, chunks, again)
    record(args.out, Line("offers: one more, installed", "ALREADY_EXISTS + WEIGHTS_GIVEN, "
                          "before anything is read", rss.growth(), str(again),
                          again.only(("ALREADY_EXISTS+WEIGHTS_GIVEN",))), again)
    cancel(args.server, job.id)
    worker.wait_for(f"no {job.id}", lambda w: not w.assigned(job.id))
    held_offer(args, worker)
    worker.close()


def held_offer(args, worker: FakeWorker) -> None:
    """An offer of a new job: 4 chunks sent, then held open; the job
    cancelled: the stream ends then, JOB_ENDED, its memory freed."""
    job = submit_text(args.server, python_job("bounds-held"))
    worker.wait_for(f"{job.id}'s initial weights asked", lambda w: w.wants(job.id))
    chunks = chunks_of(OFFER_SHAPE[0] * OFFER_SHAPE[1])
    statuses = Statuses()
    held, release = threading.Event(), threading.Event()
    ch = channel(args.server)
    call = method(ch, "WorkerService/OfferInitialWeights", pb.OfferInitialWeightsResponse,
                  "stream_unary")
    with RssPoller(args.pid) as rss:
        future = call.future(offer_messages(worker.header(job.id), chunks, hold_at=4,
                                            held=held, release=release), timeout=DEADLINE)
        try:
            while not held.wait(0.05) and not future.done():
                pass  # the call has a deadline
            time.sleep(0.5)
            cancelled = time.monotonic()
            cancel(args.server, job.id)
            e = future.exception(timeout=DEADLINE)
            ended_ms = (time.monotonic() - cancelled) * 1000
        finally:
            release.set()
        if e is None:
            statuses.add("OK")
        else:
            statuses.error(e)
        time.sleep(1.0)
        after = rss.now()
    ch.close()
    record(args.out, Line("offers: held open, job cancelled", "FAILED_PRECONDITION + JOB_ENDED "
                          "when the job ends, its memory freed", rss.growth(), str(statuses),
                          statuses.only(("FAILED_PRECONDITION+JOB_ENDED",)),
                          f"4 MiB sent; ended {ended_ms:.0f} ms after the cancel; "
                          f"RSS +{after:.1f} MiB 1 s later"), statuses)


# ------------------------------------------------------- sparse jobs ----

@dataclasses.dataclass
class SparseJob:
    worker: FakeWorker
    job_id: str
    assignment: pb.Assignment
    spec: dict
    data: str                   # the data plane of the job's one shard


def flat_size(spec: dict) -> int:
    n = 0
    for p in spec["model"]["python"]["params"]:
        size = 1
        for d in p["shape"]:
            size *= int(d)
        n += size
    return n


def sparse_job(args) -> SparseJob:
    """The job at --job (a Python model with tables, workers: 1) submitted
    with tally.Client (which builds its module here, with PyTorch, for its
    layout), taken by a fake worker that offers its initial weights and
    then does nothing: the job stays at version 0."""
    worker = FakeWorker(args.server, "bounds-rows")
    job = tally.Client(args.server, timeout=DEADLINE).submit(args.job)
    wanted = worker.wait_for(f"{job.id}'s initial weights asked", lambda w: w.wants(job.id))
    spec = json.loads(wanted.spec)  # the client sent it as JSON
    statuses = Statuses()
    offer(args.server, worker.header(job.id), chunks_of(flat_size(spec)), statuses)
    if statuses.counts["OK"] != 1:
        statuses.show("initial weights")
        raise SystemExit(f"server_bounds: the initial weights of {job.id}: {statuses}")
    a = worker.wait_for(f"{job.id}'s assignment", lambda w: w.assigned(job.id))
    if len(a.shard_map.shards) != 1:
        raise SystemExit(f"server_bounds: {job.id} has {len(a.shard_map.shards)} shards, not 1")
    address = a.shard_map.shards[0].address  # ":PORT": the coordinator's host
    host = args.server.rsplit(":", 1)[0]
    data = args.server if not address else host + address if address[0] == ":" else address
    time.sleep(0.5)  # the range installed and settled
    return SparseJob(worker, job.id, a, spec, data)


def pull_rows(job: SparseJob, min_version: int) -> pb.PullRowsRequest:
    return pb.PullRowsRequest(job_id=job.job_id, worker_id=job.worker.id,
                              incarnation=job.worker.incarnation, min_version=min_version,
                              max_wait_ms=5000, map_version=job.assignment.shard_map.version)


def at_once(address: str, request: bytes, calls: int, connections: int,
            statuses: Statuses) -> float:
    """`calls` PullRows of `request` at once over `connections` connections;
    the seconds until the last answer."""
    chans = [channel(address) for _ in range(connections)]
    began = time.monotonic()
    futures = []
    for i in range(calls):
        call = method(chans[i % connections], "ParameterService/PullRows", pb.PullRowsResponse)
        futures.append(call.future(request, timeout=DEADLINE))
    for f in futures:
        e = f.exception()
        if e is None:
            statuses.add("OK")
        else:
            statuses.error(e)
    took = time.monotonic() - began
    for c in chans:
        c.close()
    return took


# -------------------------------------------------------------- rows ----

ROWS_BOUND = ("2^18 row values a PullRows, checked before the wait (INVALID_ARGUMENT); "
              "data-plane gRPC quota 256 MiB")
WAITING_BOUND = "pulls waiting: 64 MiB of requests a worker, 256 MiB a shard (PULLS_WAITING)"


def rows(args) -> None:
    """30 PullRows of 3.5 M row numbers at once (each under the 4 MiB
    message limit: rows 0..127, one byte each), for a version that never
    comes; then 768 valid pulls of 2^18 values (16384 distinct rows, held
    as about 128 KiB each once parsed) that wait, over 8 connections (96
    each, under the servers' 128 streams a connection), past the worker's
    64 MiB of waiting pulls."""
    job = sparse_job(args)
    req = pull_rows(job, 1)
    req.tables.add(table=0, rows=(list(range(128)) * (3_500_000 // 128 + 1))[:3_500_000])
    huge = req.SerializeToString()
    statuses = Statuses()
    with RssPoller(args.pid) as rss:
        took = at_once(job.data, huge, 30, 30, statuses)
    record(args.out, Line("row pulls: 30 x 3.5 M ids at once", ROWS_BOUND, rss.growth(),
                          str(statuses), statuses.only(("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED",
                                                        "RESOURCE_EXHAUSTED+PULLS_WAITING")),
                          f"{len(huge) / MIB:.2f} MiB a request; all answered in {took:.2f} s"),
           statuses)
    time.sleep(2.5)  # the shard gives freed memory back every 2 s

    dim = max(int(t["dim"]) for t in job.spec["model"]["embeddings"])
    req = pull_rows(job, 1)
    req.tables.add(table=0, rows=list(range(MAX_VALUES // dim)))
    valid = req.SerializeToString()
    statuses = Statuses()
    with RssPoller(args.pid) as rss:
        took = at_once(job.data, valid, 768, 8, statuses)
    record(args.out, Line(f"row pulls: 768 x {MAX_VALUES // dim} rows waiting", WAITING_BOUND,
                          rss.growth(), str(statuses),
                          statuses.only(("DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED+PULLS_WAITING"))
                          and statuses.counts["RESOURCE_EXHAUSTED+PULLS_WAITING"] > 0,
                          f"{len(valid) / 1024:.0f} KiB a request on the wire; each waits "
                          f"5 s (max_wait_ms); all answered in {took:.1f} s"), statuses)
    job.worker.close()


# ------------------------------------------------------------ tables ----

def table_rows(spec: dict) -> List[Tuple[int, int, int]]:
    """(rows, dim, bytes a row on the shard) of each table: values,
    optimizer slots, 40 bytes of index (SparseTables::RowBytes)."""
    slots = {"sgd": 0, "adagrad": 1}
    default = spec.get("optimizer", {}).get("type", "sgd")
    out = []
    for t in spec["model"]["embeddings"]:
        dim = int(t["dim"])
        kind = (t.get("optimizer") or {}).get("type", default)
        out.append((int(t["num_embeddings"]), dim, dim * 4 * (1 + slots.get(kind, 2)) + 40))
    return out


def tables(args) -> None:
    """Pulls (version 0: answered at once) of rows never made yet, 2^18
    values each, table after table, until the shard refuses
    (RESOURCE_EXHAUSTED: --max_table_bytes); then halving the pull until one
    row is refused, so that the rows made fill the bound."""
    job = sparse_job(args)
    shapes = table_rows(job.spec)
    spots = [(t, r) for t, (n, _, _) in enumerate(shapes) for r in range(n)]
    per = MAX_VALUES // max(d for _, d, _ in shapes)
    statuses = Statuses()
    made = counted = at = 0
    ch = channel(job.data)
    pull = method(ch, "ParameterService/PullRows", pb.PullRowsResponse)
    with RssPoller(args.pid) as rss:
        while per > 0 and at < len(spots):
            req = pull_rows(job, 0)
            for t, r in spots[at:at + per]:
                if not req.tables or req.tables[-1].table != t:
                    req.tables.add(table=t)
                req.tables[-1].rows.append(r)
            try:
                pull(req.SerializeToString(), timeout=DEADLINE)
            except grpc.RpcError as e:
                statuses.error(e)
                if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    break
                per //= 2
                continue
            statuses.add("OK")
            made += min(per, len(spots) - at)
            counted += sum(shapes[t][2] for t, _ in spots[at:at + per])
            at += per
        time.sleep(0.5)
    ch.close()
    client = tally.Client(args.server, timeout=DEADLINE)
    for _ in range(30):  # the shard's figures reach the job with its heartbeats
        held = sum(t.rows for t in client.status(job.job_id).metrics.tables)
        if held >= made:
            break
        time.sleep(0.1)
    record(args.out, Line("tables: new rows until refused", "--max_table_bytes=64 MiB "
                          "(values, slots, 40 B of index a row), RESOURCE_EXHAUSTED",
                          rss.growth(), str(statuses),
                          statuses.only(("OK", "RESOURCE_EXHAUSTED"))
                          and statuses.counts["RESOURCE_EXHAUSTED"] > 0,
                          f"{made} rows made of {len(spots)}, counted {counted / MIB:.1f} MiB; "
                          f"the job reports {held} rows"), statuses)
    job.worker.close()


# ------------------------------------------------------------- specs ----

TINY = ("name: tiny\nmodel: {layers: [{linear: {in_features: 4, out_features: 2}}]}\n"
        "dataset: {name: synthetic, features: 4, classes: 2}\n"
        "training: {workers: 1}\noptimizer: {type: sgd, lr: 1.0}\n")
HUGE = 200 << 20


def specs(args) -> None:
    """Two SubmitJob requests of 200 MiB at once to the control plane (as
    tests/control_listener_test.py sends them), after a small one that
    warms the server; then a small one again."""
    submit_text(args.server, TINY)
    n, varint = HUGE, bytearray()  # SubmitJobRequest.spec, by hand
    while True:
        varint.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            break
    huge = b"\x0a" + bytes(varint) + b"#" * HUGE
    statuses = Statuses()
    ch = channel(args.server)
    submit = method(ch, "JobService/SubmitJob", pb.SubmitJobResponse)

    def flood() -> None:
        try:
            submit(huge, timeout=DEADLINE)
            statuses.add("OK")
        except grpc.RpcError as e:
            statuses.error(e)
    with RssPoller(args.pid) as rss:
        threads = [threading.Thread(target=flood) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(0.2)
    ch.close()
    after = submit_text(args.server, TINY)
    record(args.out, Line("specs: 2 x 200 MiB SubmitJob at once", "control-plane quota "
                          "32 MiB; about 3x it (100 MiB) to count on; measured 54-96 MB",
                          rss.growth(), str(statuses), statuses.only(("RESOURCE_EXHAUSTED",)),
                          f"then a small job submitted: {after.id}"), statuses)


# ------------------------------------------------------------- table ----

def table(path: str) -> None:
    with open(path) as f:
        lines = [Line(**json.loads(x)) for x in f if x.strip()]
    head = ["case", "documented bound (docs/security.md)", "peak RSS +MiB", "statuses",
            "as documented", "notes"]
    rows_ = [[x.case, x.bound, f"{x.peak_mib:.1f}", x.statuses,
              "yes" if x.documented else "NO", x.notes] for x in lines]
    widths = [max(len(r[i]) for r in [head] + rows_) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths]] + rows_:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["free-port", "offers", "rows", "tables", "specs", "table"])
    p.add_argument("file", nargs="?")
    p.add_argument("--server")
    p.add_argument("--pid", type=int)
    p.add_argument("--out")
    p.add_argument("--job")
    args = p.parse_args()
    if args.what == "free-port":
        print(free_port())
    elif args.what == "table":
        table(args.file)
    else:
        {"offers": offers, "rows": rows, "tables": tables, "specs": specs}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
