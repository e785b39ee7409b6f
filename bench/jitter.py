"""Pauses processes at random, each on its own: SIGSTOP for PAUSE_MS, then
SIGCONT for an exponentially distributed time of mean RUN_MS, until the
processes are gone or the driver is killed (it resumes them on the way out).

    python3 bench/jitter.py PAUSE_MS RUN_MS PID [PID ...]
"""
import os
import random
import signal
import sys
import threading
import time

pause = float(sys.argv[1]) / 1000.0
run = float(sys.argv[2]) / 1000.0
pids = [int(p) for p in sys.argv[3:]]
stop = threading.Event()


def drive(pid, seed):
    rng = random.Random(seed)
    try:
        while not stop.is_set():
            time.sleep(rng.expovariate(1.0 / run))
            if stop.is_set():
                break
            os.kill(pid, signal.SIGSTOP)
            time.sleep(pause)
            os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def finish(*_):
    stop.set()


signal.signal(signal.SIGTERM, finish)
signal.signal(signal.SIGINT, finish)
threads = [threading.Thread(target=drive, args=(p, i)) for i, p in enumerate(pids)]
for t in threads:
    t.start()
while any(t.is_alive() for t in threads):
    time.sleep(0.1)
