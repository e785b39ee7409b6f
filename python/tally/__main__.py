"""python3 -m tally: the `tally` command line from Python.

  python3 -m tally [--server=HOST:PORT] [TLS flags] COMMAND ...  (USAGE below)

The same commands, flags (--flag=value or --flag value), output and exit
codes as the C++ `tally` (client/main.cc): 0 success, 1 the request failed
(or the job did not succeed, for submit --wait and watch), 2 bad usage, 3
the server cannot be reached. What only Python can do: `submit` of a job
whose model is Python code (model.python) builds the module once here to
fill in its files and parameter layout (tally.prepare_spec), and checks an
arrays, csv, image_folder, text or criteo dataset's files where this machine
can read them.

`report` writes the dashboard's page, which is compiled into the C++ client
alone: it runs that client (build/client/tally beside this package's build
directory, else `tally` on PATH) with the same arguments, and exits 2 where
there is none.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tally import Client, RpcError
    from tally import tally_pb2 as pb

__all__ = ["main"]

USAGE = """\
usage: python3 -m tally [--server=HOST:PORT] [--tls_ca=F --tls_cert=F --tls_key=F]
             [--token_file=F] COMMAND
  submit FILE [--wait]     submit a job spec; prints the job id first
  list                     all jobs
  status JOB [--json]      one job
  watch JOB                live progress until the job ends
  cancel JOB
  fetch JOB PATH           trained weights as .safetensors (or
                           --output=PATH)
  report JOB F.html        curves, events and record in one HTML file
                           (or --output=F.html; runs the C++ tally)
  shards                   parameter shards and the ranges they hold
  health [--service=NAME]  grpc.health.v1 check
"""

# The flags and their defaults, as client/main.cc and proto/transport_flags.cc
# define them.
STRING_FLAGS = {"server": "localhost:7070", "output": "", "service": "", "tls_ca": "",
                "tls_cert": "", "tls_key": "", "token_file": ""}
BOOL_FLAGS = {"wait": False, "json": False}
INT_FLAGS = {"timeout_s": 10}
TRUE = ("true", "t", "yes", "y", "1")
FALSE = ("false", "f", "no", "n", "0")


class UsageError(Exception):
    """A command line that cannot be run; the message says why."""


def _bool_flag(name: str, value: str | None) -> bool:
    if value is None:
        return True
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise UsageError(f"illegal value '{value}' for flag --{name}")


def _set_flag(flags: dict[str, Any], name: str, value: str | None,
              rest: list[str]) -> None:
    """One flag into `flags`; a string or int flag without `=value` takes
    the next argument from `rest` (Abseil's forms)."""
    if name in BOOL_FLAGS:
        flags[name] = _bool_flag(name, value)
    elif name.startswith("no") and name[2:] in BOOL_FLAGS and value is None:
        flags[name[2:]] = False
    elif name in STRING_FLAGS or name in INT_FLAGS:
        if value is None:
            if not rest:
                raise UsageError(f"missing the value for the flag --{name}")
            value = rest.pop(0)
        if name in INT_FLAGS:
            try:
                flags[name] = int(value)
            except ValueError:
                raise UsageError(f"illegal value '{value}' for flag --{name}") from None
        else:
            flags[name] = value
    else:
        raise UsageError(f"unknown flag --{name}")


def parse(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The flags (every one, defaults filled in) and the positional
    arguments, flags anywhere among them as Abseil takes them: --name=value,
    --name value, --bool, --nobool, one dash or two, `--` ending the flags.

    Raises:
        UsageError: an unknown flag, a missing or illegal value.
    """
    flags: dict[str, Any] = {**STRING_FLAGS, **BOOL_FLAGS, **INT_FLAGS, "help": False}
    args: list[str] = []
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            args += rest
            break
        if not arg.startswith("-") or arg == "-":
            args.append(arg)
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        if name in ("help", "helpfull", "h"):
            flags["help"] = True
            continue
        _set_flag(flags, name, value if eq else None, rest)
    return flags, args


# Text as the C++ client prints it (printf's formats, byte widths).

def _pad(text: str, width: int) -> str:
    """%-{width}s of printf: padded to `width` bytes of UTF-8."""
    return text + " " * max(0, width - len(text.encode("utf-8")))


def _f(x: float, digits: int) -> str:
    """%.{digits}f of glibc's printf (a negative NaN is "-nan")."""
    if math.isnan(x):
        return "-nan" if math.copysign(1.0, x) < 0 else "nan"
    return f"{x:.{digits}f}"


def state_name(state: int) -> str:
    """JobState_Name: "" for a number this client does not know."""
    from tally import tally_pb2 as pb
    return pb.JobState.Name(state) if state in pb.JobState.values() else ""


def ended(job: pb.Job) -> bool:
    from tally.client import TERMINAL
    return job.state in TERMINAL


def classifies(job: pb.Job) -> bool:
    """Whether the job's figures include an accuracy: a classifier's
    (a server that does not say is taken to be one)."""
    return job.loss in ("", "cross_entropy", "binary_cross_entropy")


def line(job: pb.Job) -> str:
    """The job in one line (list, status, submit)."""
    from tally import tally_pb2 as pb
    m = job.metrics
    s = (f"{_pad(job.id, 8)} {_pad(state_name(job.state), 10)} {_pad(job.name or '-', 24)} "
         f"step {m.step}/{m.total_steps}")
    if m.step > 0:
        s += f"  loss {_f(m.loss, 4)}"
        if classifies(job):
            s += f"  acc {_f(m.accuracy, 3)}"
    if job.state == pb.SUCCEEDED:
        if m.no_test_split:  # nothing evaluated: no figures, not zeros
            s += "  no test split"
        elif classifies(job):
            s += f"  test accuracy {_f(m.test_accuracy, 4)}"
        else:
            s += f"  test loss {_f(m.test_loss, 4)}"
        if m.test_auc > 0:
            s += f"  test AUC {_f(m.test_auc, 4)}"
    if job.message:
        s += f"  ({job.message})"
    return s


def membership_table(job: pb.Job) -> str:
    """A job that grows: its membership over time, a line a world."""
    if job.workers_max <= job.workers_wanted and len(job.membership) <= 1:
        return ""
    s = f"  workers {job.workers_wanted} to {job.workers_max}; membership:\n"
    for p in job.membership:
        s += (f"    {p.world} worker{'' if p.world == 1 else 's'} from step {p.first_step} "
              f"(epoch {p.first_epoch}): global batch {p.global_batch}, "
              f"{p.steps_per_epoch} steps an epoch\n")
    return s


def worker_table(job: pb.Job) -> str:
    """The job's workers, one line each, the slowest marked."""
    m = job.metrics
    if not m.progress:
        return ""
    s = "  %-4s %-28s %8s %5s %10s %10s %10s %10s\n" % (
        "rank", "worker", "clock", "lag", "compute", "wait", "push", "loader")
    for p in m.progress:
        who = f"{p.worker_id} ({p.name})" if p.name else p.worker_id
        times = " ".join(f"{_f(t * 1e3, 3):>8}ms" for t in (
            p.compute_seconds, p.wait_seconds, p.push_seconds, p.loader_seconds))
        s += (f"  {p.rank:<4d} {_pad(who, 28)} {'-' if p.clock < 0 else p.clock:>8} "
              f"{p.lag:5d} {times}{'  <- slowest' if p.slowest else ''}\n")
    # An ended job waits on nobody.
    if m.waiting_on and not ended(job):
        s += (f"  step {m.step} has waited {_f(m.stalled_seconds, 0)} s on "
              f"{', '.join(m.waiting_on)}\n")
    return s


def progress(job: pb.Job) -> str:
    """One line of watch."""
    m = job.metrics
    frac = m.step / m.total_steps if m.total_steps > 0 else 0.0
    bar = ("#" * int(frac * 24))[:24].ljust(24, ".")
    s = (f"{job.id} {state_name(job.state)} [{bar}] step {m.step}/{m.total_steps}  "
         f"epoch {m.epoch}  loss {_f(m.loss, 4)}")
    if classifies(job):
        s += f"  acc {_f(m.accuracy, 3)}"
    s += f"  {_f(m.samples_per_sec, 0)} samples/s  workers {m.workers}"
    if m.waiting_on and not ended(job):
        s += f"  waiting {_f(m.stalled_seconds, 0)} s on {', '.join(m.waiting_on)}"
    return s


# protobuf's JSON as the C++ client prints it (MessageToJsonString with
# add_whitespace, always_print_primitive_fields, preserve_proto_field_names):
# fields in declaration order, one space of indent a level, doubles as
# SimpleDtoa writes them, 64-bit integers quoted, strings escaped as
# protobuf's json_escaping does.

_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"',
            "\\": "\\\\", "<": "\\u003c", ">": "\\u003e"}
_ESCAPED_RANGES = ((0x00, 0x1F), (0x7F, 0x9F), (0xAD, 0xAD), (0x600, 0x603), (0x6DD, 0x6DD),
                   (0x70F, 0x70F), (0x17B4, 0x17B5), (0x200B, 0x200F), (0x2028, 0x202E),
                   (0x2060, 0x2064), (0x206A, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB),
                   (0xE0001, 0xE0001), (0xE0020, 0xE007F))


def _json_string(text: str) -> str:
    out = []
    for c in text:
        n = ord(c)
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif any(lo <= n <= hi for lo, hi in _ESCAPED_RANGES):
            if n > 0xFFFF:  # a surrogate pair
                n -= 0x10000
                out.append(f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}")
            else:
                out.append(f"\\u{n:04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _json_real(x: float, single: bool) -> str:
    """SimpleDtoa (SimpleFtoa for a float field): the shorter %g that reads
    back as the same value; "NaN" and the infinities quoted."""
    if math.isnan(x):
        return '"NaN"'
    if math.isinf(x):
        return '"Infinity"' if x > 0 else '"-Infinity"'
    import struct
    short, full = (6, 9) if single else (15, 17)
    text = f"{x:.{short}g}"
    back = float(text)
    if single:
        back = struct.unpack("<f", struct.pack("<f", back))[0]
    return text if back == x else f"{x:.{full}g}"


def _json_scalar(field: Any, value: Any, depth: int) -> str:
    from google.protobuf.descriptor import FieldDescriptor as F
    t = field.type
    if t == F.TYPE_MESSAGE:
        return json_message(value, depth)
    if t in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return _json_real(value, t == F.TYPE_FLOAT)
    if t in (F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64):
        return f'"{value}"'
    if t == F.TYPE_BOOL:
        return "true" if value else "false"
    if t == F.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return _json_string(known.name) if known else str(value)
    if t == F.TYPE_STRING:
        return _json_string(value)
    if t == F.TYPE_BYTES:
        import base64
        return '"' + base64.b64encode(value).decode() + '"'
    return str(value)


def _json_field(field: Any, value: Any, depth: int) -> str:
    from google.protobuf.descriptor import FieldDescriptor as F
    pad = " " * (depth + 1)
    if field.label != F.LABEL_REPEATED:
        return _json_scalar(field, value, depth)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key_f, value_f = field.message_type.fields
        items = [f"{pad}{_json_string(str(k).lower() if isinstance(k, bool) else str(k))}: "
                 f"{_json_scalar(value_f, value[k], depth + 1)}" for k in value]
        return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}" if items else "{}"
    items = [pad + _json_scalar(field, v, depth + 1) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * depth + "]" if items else "[]"


def json_message(message: Any, depth: int = 0) -> str:
    """`message` as the C++ client's status --json prints it, less the
    newline that ends it."""
    from google.protobuf.descriptor import FieldDescriptor as F
    pad = " " * (depth + 1)
    items = []
    for field in message.DESCRIPTOR.fields:
        repeated = field.label == F.LABEL_REPEATED
        presence = not repeated and (field.message_type is not None
                                     or field.containing_oneof is not None)
        if presence and not message.HasField(field.name):
            continue
        value = _json_field(field, getattr(message, field.name), depth + 1)
        items.append(f"{pad}{_json_string(field.name)}: {value}")
    if not items:
        return "{}"
    return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"


# The commands: each returns the exit code.

def report_error(e: RpcError, server: str) -> int:
    """A failed call said on stderr: 3 where the server cannot be reached,
    else 1."""
    if e.code.name == "UNAVAILABLE" or (e.code.name == "DEADLINE_EXCEEDED"
                                        and "onnect" in e.details):
        print(f"tally: cannot reach tally-server at {server}: {e.details}", file=sys.stderr)
        return 3
    print(f"tally: {e.details}", file=sys.stderr)
    return 1


def watch(c: Client, job_id: str) -> int:
    """Streams the job until it ends; 0 iff it SUCCEEDED."""
    from tally import tally_pb2 as pb
    tty = sys.stdout.isatty()
    last = pb.Job()
    any_seen = False
    for job in c.watch(job_id):  # a day's deadline, not --timeout_s
        any_seen, last = True, job
        print(f"\r{progress(job)}\033[K" if tty else progress(job), end="" if tty else "\n",
              flush=True)
    if tty and any_seen:
        print()
    print(line(last))
    if last.state != pb.SUCCEEDED:
        return 1
    m = last.metrics
    if m.no_test_split:
        print("no test split: the job has no test figures")
    elif classifies(last):
        print(f"final test accuracy: {_f(m.test_accuracy, 4)}")
    else:
        print(f"final test loss: {_f(m.test_loss, 4)}")
    if m.test_auc > 0:
        print(f"final test AUC: {_f(m.test_auc, 4)}")
    return 0


def submit(c: Client, path: str, wait: bool) -> int:
    """Submits the spec, prepared here (a Python model built, files read)."""
    from tally import ModelError, SubmitError
    try:
        job = c.submit(path)
    except OSError as e:
        print(f"tally: {e.filename or path}: cannot open: {e.strerror}", file=sys.stderr)
        return 1
    except (SubmitError, ModelError) as e:
        print(f"tally: {path}: {e}", file=sys.stderr)
        return 1
    print(job.id, flush=True)
    if wait:
        return watch(c, job.id)
    print(line(job))
    return 0


def output_path(cmd: str, args: list[str], flag: str, what: str) -> str:
    """Where fetch and report write: the PATH after the job, or --output
    (not two different ones). "" once it has said what is wrong."""
    positional = args[3] if len(args) > 3 else ""
    if flag and positional and flag != positional:
        print(f"tally {cmd}: two paths, {positional} and --output={flag}", file=sys.stderr)
        return ""
    out = positional or flag
    if not out:
        print(f"tally {cmd} needs a path: tally {cmd} JOB {what} (or --output={what})",
              file=sys.stderr)
    return out


def fetch(c: Client, job_id: str, out: str, timeout_s: int) -> int:
    """The job's weights into `out`, written whole or not at all."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            n = c.fetch(job_id, out, timeout=timeout_s * 30)
        except OSError as e:
            print(f"tally: writing {out}: {e.strerror}", file=sys.stderr)
            return 1
    print(f"wrote {out} ({n} bytes)", flush=True)
    # A Python model's file without its buffers fails a strict load.
    for w in said:
        print(f"tally: warning: {w.message}", file=sys.stderr)
    # A job with tables whose file has none says why in its metadata.
    with open(out, "rb") as f:
        head = f.read(65536).decode("utf-8", "replace")
    key = '"tables":"'
    at = head.find(key)
    if at >= 0:
        start = at + len(key)
        end = head.find('"', start)
        print(f"the file has no embedding tables: {head[start:end if end >= 0 else None]}")
    return 0


def cpp_client() -> str | None:
    """The C++ `tally` beside this package's build directory
    (build/python/tally -> build/client/tally), else on PATH."""
    here = os.path.dirname(os.path.abspath(__file__))
    beside = os.path.normpath(os.path.join(here, os.pardir, os.pardir, "client", "tally"))
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("tally")


def report(argv: Sequence[str]) -> int:
    """`report` by the C++ client, which has the dashboard's page compiled
    in, with the same arguments."""
    binary = cpp_client()
    if binary is None:
        print("tally report: needs the C++ client (build/client/tally, or `tally` on PATH), "
              "which carries the dashboard's page", file=sys.stderr)
        return 2
    sys.stdout.flush()
    return subprocess.run([binary, *argv]).returncode


def shards(c: Client, server: str) -> int:
    from tally.client import resolve_shard_address
    found = c.shards()
    if not found:
        print("no shards")
    for sh in found:
        print(f"{_pad(sh.shard_id, 16)} {_pad(resolve_shard_address(server, sh.address), 24)} "
              f"{'live' if sh.live else 'LOST':<5} {_f(sh.bytes / 1e6, 1):>10} MB held")
        for r in sh.ranges:
            print(f"                 {_pad(r.job_id, 8)} [{r.offset}, {r.offset + r.count})  "
                  f"{r.count} elements, at step {r.version}")
    return 0


def list_jobs(c: Client) -> int:
    shown = 0
    for job in c.list_jobs(omit_spec=True):
        print(line(job))
        shown += 1
    if not shown:
        print("no jobs")
    return 0


def status_or_cancel(c: Client, cmd: str, job_id: str, as_json: bool) -> int:
    """`status` and `cancel` answer with the job."""
    job = c.status(job_id) if cmd == "status" else c.cancel(job_id)
    if as_json:
        print(json_message(job))  # the C++ printer ends with a newline
    else:
        print(f"{line(job)}\n{membership_table(job)}{worker_table(job)}", end="")
    return 0


ARITY = {"submit": (3,), "watch": (3,), "fetch": (3, 4), "report": (3, 4), "health": (2,),
         "shards": (2,), "list": (2,), "status": (3,), "cancel": (3,)}


def run(c: Client, flags: dict[str, Any], args: list[str]) -> int:
    """The command `args[1]` over the Client; RpcError left to the caller."""
    cmd = args[1]
    if cmd == "submit":
        return submit(c, args[2], flags["wait"])
    if cmd == "watch":
        return watch(c, args[2])
    if cmd == "fetch":
        out = output_path(cmd, args, flags["output"], "PATH")
        return fetch(c, args[2], out, flags["timeout_s"]) if out else 2
    if cmd == "health":
        state = c.health(flags["service"])
        print(state)
        return 0 if state == "SERVING" else 1
    if cmd == "shards":
        return shards(c, flags["server"])
    if cmd == "list":
        return list_jobs(c)
    return status_or_cancel(c, cmd, args[2], flags["json"])


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command.

    Args:
        argv: the arguments after the program's name; None: the process's.

    Returns:
        The exit code: 0 success, 1 the request failed (or, for submit
        --wait and watch, the job did not succeed), 2 bad usage, 3 the
        server cannot be reached.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        flags, positional = parse(argv)
    except UsageError as e:
        print(f"tally: {e}\n{USAGE}", end="", file=sys.stderr)
        return 2
    if flags["help"]:
        print(USAGE, end="")
        return 0
    args = ["tally", *positional]  # args[1] the command, as in client/main.cc
    if len(args) < 2:
        print(USAGE, end="", file=sys.stderr)
        return 2
    cmd = args[1]
    if cmd not in ARITY:
        print(f"tally: unknown command '{cmd}'\n{USAGE}", end="", file=sys.stderr)
        return 2
    if len(args) not in ARITY[cmd]:
        print(f"tally {cmd}: wrong number of arguments\n{USAGE}", end="", file=sys.stderr)
        return 2
    if cmd == "report":
        return report(argv)
    from tally import Client, RpcError
    try:
        c = Client(flags["server"], flags["tls_ca"] or None, flags["tls_cert"] or None,
                   flags["tls_key"] or None, flags["token_file"] or None,
                   timeout=flags["timeout_s"])
    except (ValueError, OSError) as e:
        print(f"tally: {e}", file=sys.stderr)
        return 2
    with c:
        try:
            return run(c, flags, args)
        except RpcError as e:
            return report_error(e, flags["server"])


if __name__ == "__main__":
    sys.exit(main())
