"""Tally from Python: the client (submit, watch, fetch) and the Python
worker runtime (python3 -m tally.worker), over Tally's native core.

Every exception the package raises on purpose is a TallyError (tally.errors):

  TallyError
    SubmitError (a ValueError too)   the spec cannot be submitted
    ModelError                       the model cannot be built or run
      LayoutError                    the module built here is not the job's
    RpcError                         a call failed: .code .reason .step .details
      InvalidArgument  NotFound  FailedPrecondition  PermissionDenied
      ResourceExhausted  Unavailable
"""
from tally.client import Client, load_state_dict, prepare_spec
from tally.errors import (FailedPrecondition, InvalidArgument, LayoutError, ModelError, NotFound,
                          PermissionDenied, ResourceExhausted, RpcError, SubmitError, TallyError,
                          Unavailable)

__all__ = [
    "Client", "FailedPrecondition", "InvalidArgument", "LayoutError", "ModelError", "NotFound",
    "PermissionDenied", "ResourceExhausted", "RpcError", "SubmitError", "TallyError",
    "Unavailable", "load_state_dict", "prepare_spec",
]
