"""Tally from Python: the client (submit, watch, fetch) and the Python
worker runtime (python3 -m tally.worker), over Tally's native core."""
from tally.client import Client, SubmitError, load_state_dict, prepare_spec  # noqa: F401
