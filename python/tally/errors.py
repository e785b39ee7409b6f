"""Tally's exceptions, one tree, each class named by how a caller reacts:

  TallyError
    SubmitError (also a ValueError)   the spec cannot be submitted: fix the
                                      field or file the message names
    ModelError                        the model cannot be built or run
      LayoutError                     the module built here is not the job's
    RpcError                          a call to the coordinator failed:
                                      .code, .reason, .step, .details
      InvalidArgument                 the request is wrong; nothing changed
      NotFound                        no such job
      FailedPrecondition              not in the job's present state (it
                                      ended: reason JOB_ENDED; no weights
                                      yet: JOB_NOT_STARTED)
      PermissionDenied                no or an unknown token, or a role that
                                      may not do this
      ResourceExhausted               a limit was reached (queued jobs, a
                                      message's size): try later or smaller
      Unavailable                     the server did not answer in time or
                                      cannot be reached: retry

An RpcError's code is the gRPC status code; its reason the name of the
tally.v1.ErrorReason the server sent with it (proto/tally.proto), or None
where the code says all there is to say. Codes without a class of their
own (INTERNAL, UNKNOWN, ABORTED, ...) raise RpcError itself.

This module imports nothing of gRPC's, PyTorch's or the generated protobuf
module's, so that every part of the package (the worker's model loader
included) can raise and catch these.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import grpc

__all__ = [
    "TallyError", "SubmitError", "ModelError", "LayoutError", "RpcError", "InvalidArgument",
    "NotFound", "FailedPrecondition", "PermissionDenied", "ResourceExhausted", "Unavailable",
    "rpc_error",
]


class TallyError(Exception):
    """The root of every exception Tally's Python package raises on purpose."""


class SubmitError(TallyError, ValueError):
    """The job cannot be submitted; the message names the field or file. A
    ValueError too, for callers that catch that."""


class ModelError(TallyError):
    """The submitted model cannot be built or run; the message says why."""


class LayoutError(ModelError):
    """The module built here is not the job's (another PyTorch, another
    file): this worker cannot train the job, others may."""


class RpcError(TallyError):
    """A call to a Tally server failed.

    Attributes:
        code: the call's grpc.StatusCode.
        reason: the name of the tally.v1.ErrorReason the server sent with
            it (e.g. "JOB_ENDED"), or None.
        step: the step the reason refers to, where it says so; else 0.
        details: the server's message, for humans (it may change: decide by
            the class, the code and the reason).
    """

    def __init__(self, code: grpc.StatusCode, details: str, reason: str | None = None,
                 step: int = 0) -> None:
        super().__init__(f"{code.name}{'+' + reason if reason else ''}: {details}")
        self.code = code
        self.reason = reason
        self.step = step
        self.details = details

    def __reduce__(self) -> tuple[Any, ...]:
        # The constructor's arguments are not the message alone.
        return type(self), (self.code, self.details, self.reason, self.step)


class InvalidArgument(RpcError):
    """INVALID_ARGUMENT or OUT_OF_RANGE: the request is wrong (a spec's
    field, a page token); nothing changed, and retrying will not help."""


class NotFound(RpcError):
    """NOT_FOUND: the server knows no such job."""


class FailedPrecondition(RpcError):
    """FAILED_PRECONDITION: the call cannot succeed in the job's present
    state; the reason says which (JOB_ENDED, JOB_NOT_STARTED)."""


class PermissionDenied(RpcError):
    """PERMISSION_DENIED or UNAUTHENTICATED: the caller's token is missing or
    unknown, or its role may not call the method or see the job."""


class ResourceExhausted(RpcError):
    """RESOURCE_EXHAUSTED: a limit of the server's was reached (jobs queued,
    a message's size); the message names it."""


class Unavailable(RpcError):
    """UNAVAILABLE or DEADLINE_EXCEEDED: the server could not be reached or
    did not answer within the call's deadline. Retry the call."""


_BY_CODE: dict[str, type[RpcError]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "OUT_OF_RANGE": InvalidArgument,
    "NOT_FOUND": NotFound,
    "FAILED_PRECONDITION": FailedPrecondition,
    "PERMISSION_DENIED": PermissionDenied,
    "UNAUTHENTICATED": PermissionDenied,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
    "UNAVAILABLE": Unavailable,
    "DEADLINE_EXCEEDED": Unavailable,
}


def rpc_error(code: grpc.StatusCode, details: str, reason: str | None = None,
              step: int = 0) -> RpcError:
    """The RpcError of the class that `code` calls for.

    Args:
        code: the failed call's grpc.StatusCode.
        details: the server's message.
        reason: the ErrorReason's name, or None.
        step: the ErrorDetail's step.

    Returns:
        An instance of RpcError or of the subclass for the code.
    """
    return _BY_CODE.get(code.name, RpcError)(code, details, reason, step)
