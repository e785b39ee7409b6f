"""python3 -m tally.worker: a worker daemon that trains Python models.

It is tally-worker's daemon (registration, leases, the job runner, the
parameter client with its streams and shared memory) with the submitter's
torch.nn.Module as its engine (tally.engine). It registers as a Python
worker, so the coordinator gives it Python-model jobs as well as models of
layers (those run on the native engine, as in tally-worker), and with the
worker protocol of the build (proto/tally.proto, WORKER_PROTOCOL_CURRENT),
which the daemon sends; a coordinator that needs a newer one stops it,
saying so.

  python3 -m tally.worker --server=HOST:7070 --devices=cpu:2 \
      [--name=NAME] [--tls_ca=... --tls_cert=... --tls_key=...] [--token_file=...]

Threads: PyTorch's intra-op pool is one per process. The worker sets it to
one thread and runs one replica per device on parallel_apply's threads, so
cpu:N uses N cores, as tally-worker's cpu:N does (set OMP_NUM_THREADS to
change the intra-op count; it is read once, at start-up).
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import types
from collections.abc import Sequence

__all__ = ["main", "parse_args", "set_threads"]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The worker's flags (--help lists them)."""
    p = argparse.ArgumentParser(prog="python3 -m tally.worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="localhost:7070", help="the coordinator, host:port")
    p.add_argument("--devices", default="cpu:1",
                   help="cpu:N (N replicas on the CPU) or cuda:0,1 / cuda:all")
    p.add_argument("--name", default=socket.gethostname(), help="for humans")
    p.add_argument("--tls_ca", default="")
    p.add_argument("--tls_cert", default="")
    p.add_argument("--tls_key", default="")
    p.add_argument("--token_file", default="", help="a token with the worker role (TLS only)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--data_root", default="",
                   help="directories a job's dataset may be read from, comma-separated "
                        "(default /srv/tally/data,/usr/share); a job naming a file "
                        "outside them fails at assignment")
    return p.parse_args(argv)


def set_threads() -> None:
    """PyTorch's thread pools as the worker runs them: the intra-op pool of
    OMP_NUM_THREADS threads (1 when unset), one inter-op thread."""
    import torch
    intra = int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    torch.set_num_threads(max(1, intra))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # set already in this process (it may be set once)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the worker until it is stopped (SIGTERM, SIGINT) or fails.

    Args:
        argv: the flags; None: the process's.

    Returns:
        The exit status: 0 stopped as asked, 1 the daemon failed (saying
        why on stderr), 2 bad flags.
    """
    args = parse_args(sys.argv[1:] if argv is None else argv)
    set_threads()
    from tally import _native, engine
    try:
        w = _native.Worker(server=args.server, devices=args.devices, name=args.name,
                           python_runtime=engine.runtime(), factory=engine.make_engine,
                           tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
                           token_file=args.token_file, verbose=not args.quiet,
                           data_root=[d for d in args.data_root.split(",") if d])
    except ValueError as e:
        print(f"tally.worker: {e}", file=sys.stderr)
        return 2
    stopping: list[int] = []

    def stop(signum: int, _frame: types.FrameType | None) -> None:
        stopping.append(signum)
        w.stop()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"tally.worker: {engine.runtime()}, devices {args.devices}, "
          f"coordinator {args.server}", file=sys.stderr, flush=True)
    w.start()
    while not w.wait(0.2):
        pass
    result = w.result()
    if result:
        print(f"tally.worker: {result}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
