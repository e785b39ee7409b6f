#!/usr/bin/python3
"""tally.Client's errors are one tree (python/tally/errors.py): a failed
call raises the RpcError subclass its code calls for, with the server's
ErrorDetail (reason, step) read from the status trailer, and no grpc
exception leaves the Client; the Client is a context manager that closes
its channel.

Runs the source tree's package (with protoc's tally_pb2 beside it, in a
temporary copy) against fake channels and one address nothing listens on:
no build, no server.

  python_errors_test.py
Exits 77 (skipped) without grpcio or protoc.
"""
import atexit
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

try:
    import grpc
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TMP = tempfile.mkdtemp(prefix="tally-errors-")
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)
shutil.copytree(os.path.join(_ROOT, "python", "tally"), os.path.join(_TMP, "tally"),
                ignore=shutil.ignore_patterns("*.cc", "__pycache__"))
if subprocess.run(["protoc", f"--proto_path={_ROOT}/proto",
                   f"--python_out={_TMP}/tally", "tally.proto"]).returncode != 0:
    print("SKIP: protoc cannot generate the Python classes")
    sys.exit(77)
sys.path.insert(0, _TMP)
import tally  # noqa: E402 - the copy made above
from tally import errors, model_files, tally_pb2 as pb  # noqa: E402
from tally.client import _rpc_error  # noqa: E402


class FakeRpcError(grpc.RpcError, grpc.Call):
    """What a channel raises: a grpc.RpcError that is also a grpc.Call."""

    def __init__(self, code, details, trailer=()):
        super().__init__(details)
        self._code, self._details, self._trailer = code, details, tuple(trailer)

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailer

    def initial_metadata(self):
        return ()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False


def trailer(reason, step=0):
    """The status trailer a Tally server sends with a typed reason."""
    status = pb.RpcStatus(code=9, message="m")
    status.details.add(type_url="type.googleapis.com/tally.v1.ErrorDetail",
                       value=pb.ErrorDetail(reason=reason, step=step).SerializeToString())
    return [("grpc-status-details-bin", status.SerializeToString())]


class FakeChannel:
    """A channel whose methods answer from `answers` ({method: function of
    the request}); every call's keyword arguments are kept."""

    def __init__(self, answers):
        self.answers, self.calls, self.closed = answers, [], False

    def _method(self, path, request_serializer, response_deserializer):
        def call(request, **kwargs):
            self.calls.append((path, kwargs))
            return self.answers[path.rsplit("/", 1)[1]](request)
        return call

    unary_unary = unary_stream = _method

    def close(self):
        self.closed = True


def fake_client(answers):
    c = tally.Client("localhost:1", timeout=7.0)
    c.channel.close()
    c.channel = FakeChannel(answers)
    return c


def raises(error):
    def answer(request):
        raise error
    return answer


def stream(*items, then=None):
    def answer(request):
        def gen():
            yield from items
            if then is not None:
                raise then
        return gen()
    return answer


class Tree(unittest.TestCase):
    def test_classes(self):
        self.assertTrue(issubclass(tally.SubmitError, tally.TallyError))
        self.assertTrue(issubclass(tally.SubmitError, ValueError))  # as it was
        self.assertIs(model_files.ModelError, tally.ModelError)
        self.assertTrue(issubclass(tally.LayoutError, tally.ModelError))
        for cls in (tally.InvalidArgument, tally.NotFound, tally.FailedPrecondition,
                    tally.PermissionDenied, tally.ResourceExhausted, tally.Unavailable):
            self.assertTrue(issubclass(cls, tally.RpcError))
            self.assertTrue(issubclass(cls, tally.TallyError))
            self.assertFalse(issubclass(cls, grpc.RpcError))

    def test_engine_reexports(self):
        try:
            import torch  # noqa: F401 - tally.engine needs it
        except ImportError:
            self.skipTest("no python3-torch")
        from tally import engine
        self.assertIs(engine.ModelError, tally.ModelError)
        self.assertIs(engine.LayoutError, tally.LayoutError)

    def test_by_code(self):
        want = {"INVALID_ARGUMENT": tally.InvalidArgument, "OUT_OF_RANGE": tally.InvalidArgument,
                "NOT_FOUND": tally.NotFound, "FAILED_PRECONDITION": tally.FailedPrecondition,
                "PERMISSION_DENIED": tally.PermissionDenied,
                "UNAUTHENTICATED": tally.PermissionDenied,
                "RESOURCE_EXHAUSTED": tally.ResourceExhausted,
                "UNAVAILABLE": tally.Unavailable, "DEADLINE_EXCEEDED": tally.Unavailable,
                "INTERNAL": tally.RpcError, "ABORTED": tally.RpcError}
        for name, cls in want.items():
            e = errors.rpc_error(grpc.StatusCode[name], "why")
            self.assertIs(type(e), cls, name)
            self.assertEqual(e.code, grpc.StatusCode[name])

    def test_pickles(self):
        e = errors.rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "ended", "JOB_ENDED", 3)
        back = pickle.loads(pickle.dumps(e))
        self.assertIs(type(back), tally.FailedPrecondition)
        self.assertEqual((back.code, back.details, back.reason, back.step),
                         (e.code, "ended", "JOB_ENDED", 3))


class FromGrpc(unittest.TestCase):
    def test_reason_and_step(self):
        e = _rpc_error(FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "job-1 has ended",
                                    trailer(pb.JOB_ENDED, 12)))
        self.assertIsInstance(e, tally.FailedPrecondition)
        self.assertEqual((e.code, e.reason, e.step, e.details),
                         (grpc.StatusCode.FAILED_PRECONDITION, "JOB_ENDED", 12,
                          "job-1 has ended"))
        self.assertEqual(str(e), "FAILED_PRECONDITION+JOB_ENDED: job-1 has ended")

    def test_no_detail(self):
        e = _rpc_error(FakeRpcError(grpc.StatusCode.NOT_FOUND, "no job 'x'"))
        self.assertIsInstance(e, tally.NotFound)
        self.assertEqual((e.reason, e.step, str(e)), (None, 0, "NOT_FOUND: no job 'x'"))

    def test_unspecified_unknown_and_garbage(self):
        e = _rpc_error(FakeRpcError(grpc.StatusCode.ABORTED, "a",
                                    trailer(pb.ERROR_REASON_UNSPECIFIED, 2)))
        self.assertEqual((type(e), e.reason, e.step), (tally.RpcError, None, 2))
        e = _rpc_error(FakeRpcError(grpc.StatusCode.ABORTED, "a", trailer(999)))
        self.assertEqual(e.reason, "999")  # a reason newer than this client
        e = _rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "a",
                                    [("grpc-status-details-bin", b"\xff\xff")]))
        self.assertEqual((type(e), e.reason), (tally.Unavailable, None))

    def test_not_a_call(self):
        """A grpc.RpcError that is no Call (an interceptor's): UNKNOWN."""
        e = _rpc_error(grpc.RpcError("the interceptor's"))
        self.assertEqual((type(e), e.code, e.details),
                         (tally.RpcError, grpc.StatusCode.UNKNOWN, "the interceptor's"))


class Calls(unittest.TestCase):
    def test_unary(self):
        cause = FakeRpcError(grpc.StatusCode.NOT_FOUND, "no job 'j'")
        c = fake_client({"GetJob": raises(cause)})
        with self.assertRaises(tally.NotFound) as e:
            c.status("j")
        self.assertIs(e.exception.__cause__, cause)
        self.assertNotIsInstance(e.exception, grpc.RpcError)
        # The Client's deadline and metadata, unless the caller gives its own.
        self.assertEqual(c.channel.calls[-1][1], {"timeout": 7.0, "metadata": []})
        with self.assertRaises(tally.NotFound):
            c._call("GetJob", pb.GetJobRequest, pb.Job)(pb.GetJobRequest(job_id="j"),
                                                          timeout=1)
        self.assertEqual(c.channel.calls[-1][1], {"timeout": 1, "metadata": []})

    def test_cancel_ended(self):
        c = fake_client({"CancelJob": raises(FakeRpcError(
            grpc.StatusCode.FAILED_PRECONDITION, "ended", trailer(pb.JOB_ENDED)))})
        with self.assertRaises(tally.FailedPrecondition) as e:
            c.cancel("j")
        self.assertEqual(e.exception.reason, "JOB_ENDED")

    def test_watch_of_an_ended_job(self):
        done = pb.Job(id="j", state=pb.SUCCEEDED)
        c = fake_client({
            "WatchJob": stream(then=FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "ended",
                                                 trailer(pb.JOB_ENDED))),
            "GetJob": lambda request: done})
        self.assertEqual(list(c.watch("j")), [done])

    def test_watch_fails_part_way(self):
        running = pb.Job(id="j", state=pb.RUNNING)
        c = fake_client({"WatchJob": stream(running, then=FakeRpcError(
            grpc.StatusCode.UNAVAILABLE, "the coordinator went away"))})
        seen = []
        with self.assertRaises(tally.Unavailable):
            for job in c.watch("j"):
                seen.append(job)
        self.assertEqual(seen, [running])

    def test_fetch_not_started(self):
        c = fake_client({"FetchWeights": stream(then=FakeRpcError(
            grpc.StatusCode.FAILED_PRECONDITION, "no weights yet", trailer(pb.JOB_NOT_STARTED)))})
        with self.assertRaises(tally.FailedPrecondition) as e:
            c.fetch("j", os.path.join(_TMP, "w.safetensors"))
        self.assertEqual(e.exception.reason, "JOB_NOT_STARTED")
        # Nothing written: neither the file nor its .part.
        self.assertFalse(os.path.exists(os.path.join(_TMP, "w.safetensors")))
        self.assertFalse(os.path.exists(os.path.join(_TMP, "w.safetensors.part")))

    def test_nothing_listens(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # a port nothing listens on: the connection is refused
        with tally.Client(f"127.0.0.1:{port}", timeout=10) as c:
            with self.assertRaises(tally.Unavailable) as e:
                c.status("j")
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)


class Lifetime(unittest.TestCase):
    def test_context_manager_closes(self):
        with tally.Client("localhost:1") as c:
            fake = FakeChannel({})
            c.channel.close()
            c.channel = fake
        self.assertTrue(fake.closed)
        c.close()  # twice is harmless
        with self.assertRaises(ValueError):
            c.status("j")

    def test_credentials(self):
        with self.assertRaises(ValueError):
            tally.Client("localhost:1", token_file="/nonexistent")  # a token needs TLS
        with self.assertRaises(ValueError):
            tally.Client("localhost:1", tls_ca="/nonexistent")  # mTLS: all three


if __name__ == "__main__":
    unittest.main()
