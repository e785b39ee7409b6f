"""Tally from Python: the client (submit, watch, fetch) and the Python
worker runtime (python3 -m tally.worker), over Tally's native core.

  tally.client           Client: the coordinator's JobService
  tally.prepare          prepare_spec: a spec made ready for the coordinator
  tally.datasets         a dataset's files read at submission, as workers do
  tally.state_dict       load_state_dict: fetched weights for PyTorch
  tally.__main__         python3 -m tally: the command line
  tally.worker           python3 -m tally.worker: the Python worker
  tally.engine           TorchEngine: a job's module over the worker's devices
  tally.model            the module built, its layout
  tally.tables           embedding tables whose rows live on the shards
  tally.engine_contract  what the native core and an engine promise each other
  tally.model_files      a model given as a directory, loaded for one job
  tally.errors           the exceptions below

Every exception the package raises on purpose is a TallyError (tally.errors):

  TallyError
    SubmitError (a ValueError too)   the spec cannot be submitted
    ModelError                       the model cannot be built or run
      LayoutError                    the module built here is not the job's
    RpcError                         a call failed: .code .reason .step .details
      InvalidArgument  NotFound  FailedPrecondition  PermissionDenied
      ResourceExhausted  Unavailable
"""
from tally.client import Client
from tally.errors import (FailedPrecondition, InvalidArgument, LayoutError, ModelError, NotFound,
                          PermissionDenied, ResourceExhausted, RpcError, SubmitError, TallyError,
                          Unavailable)
from tally.prepare import prepare_spec
from tally.state_dict import load_state_dict

__all__ = [
    "Client", "FailedPrecondition", "InvalidArgument", "LayoutError", "ModelError", "NotFound",
    "PermissionDenied", "ResourceExhausted", "RpcError", "SubmitError", "TallyError",
    "Unavailable", "load_state_dict", "prepare_spec",
]
