"""tally.Client: submit, watch, cancel and fetch jobs from Python, as the
`tally` CLI does. Submitting prepares the spec first (tally.prepare): a job
whose model is Python code (model.python) is submitted with the file's
text and the module's parameter layout, found by building the module once
here with the job's seed, and errors in the model are raised here, before
anything is sent.

  with tally.Client("localhost:7070") as c:
      job = c.submit("examples/resnet.yaml")      # the Job message
      job = c.wait(job.id)                        # until it ends
      c.fetch(job.id, "resnet.safetensors")
  model.load_state_dict(tally.load_state_dict("resnet.safetensors"))

Every error is a tally.TallyError (tally/errors.py): SubmitError and
ModelError before anything is sent, an RpcError (NotFound, Unavailable, ...)
for a call that failed; grpc's own exceptions never leave the Client.

The spec's preparation (tally.prepare, tally.datasets) and the weights'
loading (tally.state_dict) have modules of their own; their names are
importable from here too.
"""
from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

import grpc
from google.protobuf.message import DecodeError

from tally import tally_pb2 as pb
from tally.datasets import (  # noqa: F401 - re-exported
    ESCAPES, IMAGE_EXTENSIONS, NUMBER, SAFETENSORS_DTYPES, Shards, Vocabulary, count_tokens,
    list_image_folder, read_vocabulary)
from tally.errors import FailedPrecondition, RpcError, SubmitError, rpc_error
from tally.prepare import INPUT_SHAPES, MAX_MODEL_BYTES, prepare_spec  # noqa: F401
from tally.state_dict import DTYPES, load_state_dict  # noqa: F401

__all__ = [
    "Client", "SubmitError", "TERMINAL", "count_tokens", "list_image_folder",
    "load_state_dict", "prepare_spec", "read_vocabulary",
]

TERMINAL = (pb.SUCCEEDED, pb.FAILED, pb.CANCELLED)

_Response = TypeVar("_Response")


def _rpc_error(e: grpc.RpcError) -> RpcError:
    """A failed call as Tally's exception: its code and message, and the
    tally.v1.ErrorDetail (reason, step) the server put in the status
    trailer (grpc-status-details-bin: an RpcStatus, which is
    google.rpc.Status on the wire; proto/tally.proto)."""
    # An error raised by the channel is a grpc.Call too; one raised
    # elsewhere (an interceptor) may lack what a Call has.
    if not isinstance(e, grpc.Call):
        return rpc_error(grpc.StatusCode.UNKNOWN, str(e))
    code, details = e.code(), e.details() or ""
    reason: str | None = None
    step = 0
    for key, value in e.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        try:
            found = [pb.ErrorDetail.FromString(d.value)
                     for d in pb.RpcStatus.FromString(value).details
                     if d.type_url.endswith("/tally.v1.ErrorDetail")]
        except DecodeError:  # not Tally's: the code and message say it all
            continue
        for detail in found:
            step = detail.step
            if detail.reason == pb.ERROR_REASON_UNSPECIFIED:
                reason = None
            elif detail.reason in pb.ErrorReason.values():
                reason = pb.ErrorReason.Name(detail.reason)
            else:  # a reason newer than this client: its number
                reason = str(detail.reason)
    return rpc_error(code, details, reason, step)


class Client:
    """Tally's JobService from Python: submit, status, wait, watch, cancel,
    fetch, list_jobs, shards, history and health, as the `tally` CLI does
    them (python3 -m tally is that CLI over this class). A context manager: leaving the
    `with` block closes the channel (close()).

    Every call has a deadline (`timeout` seconds; watch's its own). A call
    that fails raises an RpcError of the class its code calls for (see
    tally.errors); grpc's own exceptions do not leave the Client.

    Thread-safe as gRPC channels are: calls from several threads share the
    one channel.
    """

    def __init__(self, server: str = "localhost:7070", tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None,
                 token_file: str | None = None, timeout: float = 30.0) -> None:
        """Opens a channel to the coordinator.

        Args:
            server: the coordinator, host:port.
            tls_ca: the CA certificate (PEM) that signed the server's; TLS
                when given, else plaintext.
            tls_cert: this client's certificate (PEM), for mutual TLS.
            tls_key: its private key (PEM).
            token_file: a file holding a bearer token (TLS only).
            timeout: each call's deadline, in seconds.

        Raises:
            ValueError: a token without TLS (it is never sent in
                plaintext), or tls_ca without tls_cert and tls_key.
            OSError: a certificate, key or token file cannot be read.
        """
        self.timeout = timeout
        if token_file and not tls_ca:
            raise ValueError("a token needs TLS (tls_ca, tls_cert, tls_key): a bearer "
                             "token is never sent in plaintext")
        self.metadata: list[tuple[str, str]] = []
        if token_file:
            with open(token_file) as f:
                self.metadata = [("authorization", "Bearer " + f.read().strip())]
        opts = [("grpc.max_receive_message_length", 8 << 20)]
        if tls_ca:
            if not (tls_cert and tls_key):
                raise ValueError("TLS needs all of tls_ca, tls_cert and tls_key (mTLS: every "
                                 "program presents its own certificate)")

            def read(p: str) -> bytes:
                with open(p, "rb") as f:
                    return f.read()
            creds = grpc.ssl_channel_credentials(read(tls_ca), read(tls_key), read(tls_cert))
            self.channel = grpc.secure_channel(server, creds, options=opts)
        else:
            self.channel = grpc.insecure_channel(server, options=opts)
        self._closed = False

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled. Twice is
        harmless; a call afterwards raises ValueError."""
        if not self._closed:
            self._closed = True
            self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @overload
    def _call(self, method: str, request_type: type[Any], response_type: type[_Response],
              kind: Literal["unary_unary"] = ...) -> Callable[..., _Response]: ...

    @overload
    def _call(self, method: str, request_type: type[Any], response_type: type[_Response],
              kind: Literal["unary_stream"]) -> Callable[..., Iterator[_Response]]: ...

    def _call(self, method: str, request_type: type[Any], response_type: type[Any],
              kind: str = "unary_unary") -> Callable[..., Any]:
        """The JobService method `method`, as a function of its request
        (and grpc's keyword arguments: timeout, metadata, wait_for_ready)
        that raises RpcError for a failed call. The timeout is the
        Client's and the metadata its token unless given.

        Raises:
            ValueError: the Client is closed.
        """
        if self._closed:
            raise ValueError("the Client is closed")
        rpc = getattr(self.channel, kind)(f"/tally.v1.JobService/{method}",
                                          request_serializer=request_type.SerializeToString,
                                          response_deserializer=response_type.FromString)

        def unary(request: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", self.timeout)
            kwargs.setdefault("metadata", self.metadata)
            try:
                return rpc(request, **kwargs)
            except grpc.RpcError as e:
                raise _rpc_error(e) from e

        def stream(request: Any, **kwargs: Any) -> Iterator[Any]:
            kwargs.setdefault("timeout", self.timeout)
            kwargs.setdefault("metadata", self.metadata)
            try:
                yield from rpc(request, **kwargs)
            except grpc.RpcError as e:
                raise _rpc_error(e) from e
        return stream if kind == "unary_stream" else unary

    def submit(self, path: str) -> pb.Job:
        """Submits a job spec, prepared as prepare_spec does.

        Args:
            path: the spec, YAML (JSON without PyYAML).

        Returns:
            The Job as queued.

        Raises:
            OSError: the spec or a file it names cannot be read.
            SubmitError: the spec or its data are refused here, before
                anything is sent.
            ModelError: a Python model cannot be built or run here.
            InvalidArgument: the coordinator refused a field (named).
            ResourceExhausted: too many jobs wait already.
            PermissionDenied: the token may not submit.
            Unavailable: the coordinator cannot be reached.
        """
        text = prepare_spec(path)
        rpc = self._call("SubmitJob", pb.SubmitJobRequest, pb.SubmitJobResponse)
        return rpc(pb.SubmitJobRequest(spec=text)).job

    def status(self, job_id: str) -> pb.Job:
        """The job as it is now.

        Args:
            job_id: the job.

        Returns:
            The Job message.

        Raises:
            NotFound: no such job.
            PermissionDenied: another submitter's job.
            Unavailable: the coordinator cannot be reached.
        """
        rpc = self._call("GetJob", pb.GetJobRequest, pb.Job)
        return rpc(pb.GetJobRequest(job_id=job_id))

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 0.5) -> pb.Job:
        """The job once it has ended, polled every `poll` seconds. A job
        that FAILED or was CANCELLED is returned as one that SUCCEEDED is:
        its state says which.

        Args:
            job_id: the job.
            timeout: seconds to wait at most; then the job as it is. None:
                until it ends.
            poll: seconds between two looks.

        Returns:
            The Job message, terminal unless `timeout` passed.

        Raises:
            NotFound, PermissionDenied, Unavailable: as status() does.
        """
        end = None if timeout is None else time.time() + timeout
        while True:
            job = self.status(job_id)
            if job.state in TERMINAL or (end is not None and time.time() > end):
                return job
            time.sleep(poll)

    def watch(self, job_id: str, timeout: float = 24 * 3600) -> Iterator[pb.Job]:
        """The job as it changes (WatchJob), from now until it has ended: a
        generator of Job messages whose last one is terminal. A job that
        ended already gives that one message.

        Args:
            job_id: the job.
            timeout: the stream's deadline, in seconds.

        Returns:
            A generator of Job messages, the last one terminal.

        Raises:
            NotFound: no such job.
            PermissionDenied: another submitter's job.
            Unavailable: the coordinator cannot be reached, or `timeout`
                passed (code DEADLINE_EXCEEDED).
        """
        rpc = self._call("WatchJob", pb.WatchJobRequest, pb.Job, "unary_stream")
        try:
            for job in rpc(pb.WatchJobRequest(job_id=job_id), timeout=timeout):
                yield job
                if job.state in TERMINAL:
                    return
        except FailedPrecondition:
            yield self.status(job_id)  # ended before the stream began

    def cancel(self, job_id: str) -> pb.Job:
        """Cancels a job.

        Args:
            job_id: the job.

        Returns:
            The job, CANCELLED.

        Raises:
            NotFound: no such job.
            FailedPrecondition: it has ended already (reason JOB_ENDED).
            PermissionDenied: the token may not cancel it.
            Unavailable: the coordinator cannot be reached.
        """
        rpc = self._call("CancelJob", pb.CancelJobRequest, pb.Job)
        return rpc(pb.CancelJobRequest(job_id=job_id))

    def fetch(self, job_id: str, path: str, timeout: float | None = None) -> int:
        """Writes the job's weights (safetensors) to `path`: streamed to
        `path`.part (a job's tables may be larger than this machine's
        memory), renamed into place once whole, so that `path` is never a
        partial file. A Python model's file without its buffers (which
        load_state_dict with strict=True refuses) is written with a warning
        saying why.

        Args:
            job_id: the job.
            path: the file to write.
            timeout: the stream's deadline, in seconds; None: 30 times the
                Client's (as `tally fetch` gives a file's stream; a job's
                tables may be gigabytes).

        Returns:
            The file's size in bytes.

        Raises:
            OSError: `path` cannot be written.
            NotFound: no such job.
            FailedPrecondition: it has no weights yet (JOB_NOT_STARTED).
            PermissionDenied: another submitter's job.
            Unavailable: the coordinator cannot be reached.
        """
        rpc = self._call("FetchWeights", pb.FetchWeightsRequest, pb.FileChunk, "unary_stream")
        n = 0
        note = ""
        part = path + ".part"
        try:
            with open(part, "wb") as f:
                for chunk in rpc(pb.FetchWeightsRequest(job_id=job_id),
                                 timeout=30 * self.timeout if timeout is None else timeout):
                    f.write(chunk.data)
                    n += len(chunk.data)
                    note = note or chunk.buffers_note
                f.flush()
                os.fsync(f.fileno())
            os.replace(part, path)
        except BaseException:
            if os.path.exists(part):
                os.remove(part)
            raise
        if note:
            warnings.warn(f"{path} has no buffers of the model: {note}", stacklevel=2)
        return n

    def list_jobs(self, omit_spec: bool = False, page_size: int = 500) -> Iterator[pb.Job]:
        """Every job the caller may see, a page at a time (ListJobs with
        its page tokens).

        Args:
            omit_spec: leave each Job's spec empty (smaller pages).
            page_size: jobs a page (the server takes at most 1000).

        Returns:
            A generator of Job messages.

        Raises:
            PermissionDenied: the token may not list jobs.
            Unavailable: the coordinator cannot be reached.
        """
        rpc = self._call("ListJobs", pb.ListJobsRequest, pb.ListJobsResponse)
        request = pb.ListJobsRequest(omit_spec=omit_spec, page_size=page_size)
        while True:
            page = rpc(request)
            yield from page.jobs
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    def shards(self) -> list[pb.ShardInfo]:
        """The parameter shards and the ranges of jobs each holds.

        Returns:
            One ShardInfo a shard.

        Raises:
            PermissionDenied: the token may not see the shards.
            Unavailable: the coordinator cannot be reached.
        """
        rpc = self._call("ListShards", pb.ListShardsRequest, pb.ListShardsResponse)
        return list(rpc(pb.ListShardsRequest()).shards)

    def history(self, job_id: str) -> pb.JobHistory:
        """The job's curve (at most 1000 points) and its last 200 events.

        Args:
            job_id: the job.

        Returns:
            The JobHistory message.

        Raises:
            NotFound: no such job.
            PermissionDenied: another submitter's job.
            Unavailable: the coordinator cannot be reached.
        """
        rpc = self._call("GetJobHistory", pb.GetJobRequest, pb.JobHistory)
        return rpc(pb.GetJobRequest(job_id=job_id))

    def health(self, service: str = "") -> str:
        """The grpc.health.v1 check of a service.

        Args:
            service: the service's full name; "": the server itself.

        Returns:
            The status's name: "SERVING", "NOT_SERVING", "UNKNOWN" or
            "SERVICE_UNKNOWN" (a number a newer server may send, as text).

        Raises:
            NotFound: no such service.
            Unavailable: the server cannot be reached.
            ValueError: the Client is closed.
        """
        if self._closed:
            raise ValueError("the Client is closed")
        # grpc.health.v1's two messages by hand (the package carries no
        # health_pb2): HealthCheckRequest{string service = 1} and
        # HealthCheckResponse{ServingStatus status = 1}.
        name = service.encode("utf-8")
        request = b"\x0a" + _varint(len(name)) + name if name else b""
        rpc = self.channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            reply = rpc(request, timeout=self.timeout, metadata=self.metadata)
        except grpc.RpcError as e:
            raise _rpc_error(e) from e
        status = _field_one_varint(reply)
        return _SERVING_STATUS.get(status, str(status))


def resolve_shard_address(coordinator: str, address: str) -> str:
    """Where a shard named in a shard map or by ListShards is reached, as
    ResolveShardAddress in proto/transport.cc does.

    Args:
        coordinator: the coordinator this client reaches, host:port.
        address: the shard's address as named.

    Returns:
        "host:port" as it is; ":port" on the coordinator's host (the
        coordinator's own shard, which listens apart from its control
        plane); empty, the coordinator itself.
    """
    if not address:
        return coordinator
    if not address.startswith(":"):
        return address
    colon = coordinator.rfind(":")
    return (coordinator[:colon] if colon >= 0 else coordinator) + address


_SERVING_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _varint(n: int) -> bytes:
    """`n` (not negative) as a protobuf varint."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at data[at:] and where it ends.

    Raises:
        DecodeError: it runs past the end.
    """
    value = shift = 0
    while True:
        if at >= len(data):
            raise DecodeError("a truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _field_one_varint(data: bytes) -> int:
    """Field 1 (a varint) of a serialized message; 0 where it is absent
    (proto3's default). Other fields are skipped by their wire type.

    Raises:
        DecodeError: the bytes are not a message.
    """
    value, at = 0, 0
    while at < len(data):
        tag, at = _read_varint(data, at)
        wire = tag & 7
        if wire == 0:
            v, at = _read_varint(data, at)
            if tag >> 3 == 1:
                value = v
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        elif wire == 2:
            size, at = _read_varint(data, at)
            at += size
        else:
            raise DecodeError(f"wire type {wire}")
    return value
