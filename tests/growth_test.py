#!/usr/bin/python3
"""A job that grows (training.workers: {min: 1, max: 3}) on two shard
processes: it starts on one tally-worker; two more start while it runs and
join at the start of a later epoch, the same one for both. From that step
on every step sums three workers' batches (the global batch triples), the
job SUCCEEDS, every step closed with the same members on both shards (each
range's record of the steps it closed, by membership), every epoch summed
exactly the training set's samples, and `tally status` shows the
membership over time. Then the same job in ssp (staleness 2) and in async
on the three workers, now free: each starts on one and the other two join
at epoch 2 (ssp: every step with the same members on both shards; async,
which closes no steps: the versions of one worker's epoch then three's).
  growth_test.py BUILD
"""
import json
import subprocess
import tempfile
import time

from cluster_util import BUILD, Cluster, fail, pb

TRAIN, BATCH, EPOCHS = 49152, 32, 5
SPEC = f"""
name: grow
model:
  layers:
    - linear: {{in_features: 32, out_features: 8}}
dataset: {{name: synthetic, features: 32, classes: 8, train_size: {TRAIN}, test_size: 256}}
training:
  epochs: {EPOCHS}
  batch_size: {BATCH}
  seed: 5
  shards: 2
  workers: {{min: 1, max: 3}}
  consistency: CONSISTENCY
optimizer: {{type: sgd, lr: 0.05, momentum: 0.9}}
"""


def worker(c, name):
    return c.start(name, [f"{BUILD}/worker/tally-worker", f"--server={c.server}",
                          "--devices=cpu:1", f"--name={name}", "--health_port=-1"])


def wait_step(c, job_id, step, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        job = c.client.status(job_id)
        if job.metrics.step >= step:
            return job
        if job.state not in (pb.PENDING, pb.RUNNING):
            fail(f"{job_id} ended before step {step}: {job}")
        time.sleep(0.05)
    fail(f"{job_id} did not reach step {step} in {timeout} s")


def closed_spans(c, job_id):
    shards = c.client._call("ListShards", pb.ListShardsRequest, pb.ListShardsResponse)(
        pb.ListShardsRequest(), timeout=10).shards
    return [list(r.closed) for s in shards for r in s.ranges if r.job_id == job_id]


def check_membership(job, versions_per_step=1):
    periods = list(job.membership)
    if len(periods) != 2 or periods[0].world != 1 or periods[1].world != 3:
        fail(f"membership {periods}: want 1 worker, then 3")
    if job.workers_max != 3 or periods[1].global_batch != 3 * BATCH:
        fail(f"workers_max {job.workers_max}, global batch {periods[1].global_batch}")
    e = periods[1].first_epoch
    if not 1 <= e < EPOCHS or periods[1].first_step != e * (TRAIN // BATCH):
        fail(f"the world grows at epoch {e}, step {periods[1].first_step}")
    total = e * (TRAIN // BATCH) + (EPOCHS - e) * (TRAIN // (3 * BATCH)) * versions_per_step
    if job.metrics.total_steps != total or job.metrics.step != total:
        fail(f"steps {job.metrics.step}/{job.metrics.total_steps}, want {total}")
    return periods[1].first_step, total


def run_watching(c, job_id):
    """Waits for the job's end; the last record of both ranges seen while it
    ran (the shards drop the job's ranges once it has ended)."""
    last = None
    end = time.time() + 240
    while time.time() < end:
        job = c.client.status(job_id)
        if job.state not in (pb.PENDING, pb.RUNNING):
            return job, last
        ranges = closed_spans(c, job_id)
        if len(ranges) == 2:
            last = ranges
        time.sleep(0.05)
    fail(f"{job_id} did not end in 240 s")


def check_spans(ranges, grow_at):
    if ranges is None:
        fail("never saw both ranges of the job")
    a, b = ([(s.first_step, s.end_step, s.members, s.members_hash, s.samples)
             for s in r] for r in ranges)
    # The two were read a moment apart: the one further on may have closed
    # a few more steps with the same members.
    if len(a) != len(b) or a[:-1] != b[:-1] or a[-1][:4] != b[-1][:4] and a[-1][2:4] != b[-1][2:4]:
        fail(f"the shards closed steps with different members:\n{a}\n{b}")
    if a[0][0] != 0 or min(a[-1][1], b[-1][1]) <= grow_at:
        fail(f"the record covers [{a[0][0]}, {a[-1][1]}): not past step {grow_at}")
    for first, end, members, _, samples in a + b:
        want = 1 if end <= grow_at else 3
        if (first < grow_at < end) or members != want or samples != want * BATCH * (end - first):
            fail(f"steps [{first}, {end}): {members} members, {samples} samples; "
                 f"the job grew at {grow_at}")
    # Every epoch sums the training set: [0, grow_at) is whole epochs of
    # one worker (and each later step three workers' batches).
    if sum(s[4] for s in a if s[1] <= grow_at) != grow_at // (TRAIN // BATCH) * TRAIN:
        fail(f"the epochs before step {grow_at} did not sum {TRAIN} samples each")


def submit(c, tmp, consistency):
    with open(f"{tmp}/grow.yaml", "w") as f:
        f.write(SPEC.replace("CONSISTENCY", consistency))
    return c.client.submit(f"{tmp}/grow.yaml").id


def run(c, job_id, mode):
    """The job to its end; checks what every mode promises."""
    job, ranges = run_watching(c, job_id)
    if job.state != pb.SUCCEEDED:
        fail(f"{mode} {job_id} {pb.JobState.Name(job.state)}: {job.message}\n"
             + c.log("w1") + c.log("server"))
    grow_at, total = check_membership(job, 3 if mode == "async" else 1)
    if mode != "async":
        check_spans(ranges, grow_at)
    print(f"{mode}: grew from 1 to 3 workers at step {grow_at}; {total} versions; "
          f"test accuracy {job.metrics.test_accuracy:.3f}")
    return grow_at


def main():
    with tempfile.TemporaryDirectory() as tmp:
        c = Cluster(tmp, shards=2)
        try:
            worker(c, "w0")
            job_id = submit(c, tmp, "{mode: bsp}")
            wait_step(c, job_id, 20)
            worker(c, "w1")
            worker(c, "w2")
            grow_at = run(c, job_id, "bsp")
            out = subprocess.run([f"{BUILD}/client/tally", f"--server={c.server}",
                                  "status", job_id], capture_output=True, text=True,
                                 check=True).stdout
            # Epochs counted from 0, as Job.membership counts them.
            epoch = c.client.status(job_id).membership[1].first_epoch
            if f"3 workers from step {grow_at} (epoch {epoch})" not in out:
                fail(f"tally status does not show the membership:\n{out}")
            run(c, submit(c, tmp, "{mode: ssp, staleness: 2}"), "ssp")
            run(c, submit(c, tmp, "{mode: async}"), "async")
            print("PASS")
        finally:
            c.stop()


if __name__ == "__main__":
    main()
