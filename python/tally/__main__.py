"""python3 -m tally submit JOB.yaml [--server=HOST:7070] [--wait] [TLS flags]

Submits a job as `tally submit` does; a job whose model is Python code
(model.python) needs this client, which builds the module once to find its
parameter layout. Prints the job's id; with --wait, waits for its end and
prints its state and test figures.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command.

    Args:
        argv: the arguments; None: the process's.

    Returns:
        The exit status: 0 submitted (with --wait: the job SUCCEEDED), 1
        the job did not succeed, 2 the job was not submitted.
    """
    p = argparse.ArgumentParser(prog="python3 -m tally", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["submit"])
    p.add_argument("spec")
    p.add_argument("--server", default="localhost:7070")
    p.add_argument("--wait", action="store_true")
    p.add_argument("--tls_ca")
    p.add_argument("--tls_cert")
    p.add_argument("--tls_key")
    p.add_argument("--token_file")
    args = p.parse_args(argv)
    from tally import Client, ModelError, RpcError, SubmitError, tally_pb2 as pb
    with Client(args.server, args.tls_ca, args.tls_cert, args.tls_key, args.token_file) as c:
        try:
            job = c.submit(args.spec)
        except (SubmitError, ModelError, OSError) as e:
            print(f"{args.spec}: {e}", file=sys.stderr)
            return 2
        except RpcError as e:
            print(f"{args.spec}: {e.code.name}: {e.details}", file=sys.stderr)
            return 2
        print(job.id, flush=True)
        if not args.wait:
            return 0
        for job in c.watch(job.id):
            m = job.metrics
            print(f"{job.id} {pb.JobState.Name(job.state)} step {m.step}/{m.total_steps} "
                  f"loss {m.loss:.4f} {m.samples_per_sec:.0f} samples/s", flush=True)
    m = job.metrics
    if m.no_test_split:  # nothing was evaluated: no figures, not zeros
        figures = "no test split"
    else:
        figures = f"test loss {m.test_loss:.4f}"
        if job.loss in ("", "cross_entropy", "binary_cross_entropy"):
            figures += f", accuracy {m.test_accuracy:.4f}"
        if m.test_auc > 0:
            figures += f", AUC {m.test_auc:.4f}"
    print(f"{job.id} {pb.JobState.Name(job.state)} after {m.step} steps: {figures} "
          f"{job.message}")
    return 0 if job.state == pb.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
