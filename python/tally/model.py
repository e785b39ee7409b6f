"""The submitter's model on this machine: its build function run under
the job's seed (a single file's code, or a directory's module through
tally.model_files), and its parameters, buffers and tied weights as a job
lists them. Both the client (at submission) and the Python worker (for
each job) build the module this way, so that they agree on its layout.
"""
from __future__ import annotations

import traceback
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tally.engine_contract import Buffer, Param
from tally.errors import LayoutError, ModelError
from tally.model_files import ModelFiles

__all__ = [
    "DTYPES", "Buffer", "Param", "check_layout", "cut_traceback", "layout_of", "load_module",
    "state_of",
]


def cut_traceback(text: str, limit: int = 2000) -> str:
    """The end of `text` (a traceback's last frames and its exception,
    which say what went wrong).

    Args:
        text: a traceback, or any message.
        limit: the characters kept at most.

    Returns:
        `text`, or "..." and its last `limit` characters.
    """
    return text if len(text) <= limit else "..." + text[-limit:]


def _import(code: str | None, file: str, build: str,
            files: ModelFiles | None) -> Callable[[], Any]:
    """The build function: `build` in the file's code, or for a
    directory (its ModelFiles), `module.function` (the module's path,
    dotted)."""
    if files is not None:
        module_name, _, fn_name = build.rpartition(".")
        if not module_name:
            raise ModelError(f"model.python.build: name the function as module.function "
                             f"(for {file}/net.py: net.make_model), not '{build}'")
        where = f"{file}/{module_name.replace('.', '/')}.py"
        try:
            mod = files.import_module(module_name)
        except BaseException:  # noqa: B902 - the user's code may raise anything
            raise ModelError(f"{where} does not import:\n" + cut_traceback(traceback.format_exc()))
    else:
        assert code is not None, "a single file comes with its code"
        fn_name, where = build, file or "model.py"
        mod = types.ModuleType("tally_model")
        mod.__file__ = where
        try:
            exec(compile(code, mod.__file__, "exec"), mod.__dict__)
        except BaseException:  # noqa: B902
            raise ModelError(f"{where} does not import:\n" + cut_traceback(traceback.format_exc()))
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ModelError(f"{where} has no function '{fn_name}' (model.python.build)")
    return fn


def load_module(code: str | None, file: str, build: str, seed: int,
                files: ModelFiles | None = None) -> torch.nn.Module:
    """Runs the submitted file (or imports the submitted directory's
    module from `files`) and calls its build function under the job's seed.

    Args:
        code: the file's text (model.python.code); None for a directory.
        file: the file's or directory's name, for messages and tracebacks.
        build: the build function's name (model.python.build): a name in
            the file, or `module.function` in a directory.
        seed: torch.manual_seed's, before the build function runs.
        files: the directory's files, open; None for a single file.

    Returns:
        The module the build function returns.

    Raises:
        ModelError: the code does not import, has no such function, the
            function raises or returns something other than a torch.nn.Module.
    """
    fn = _import(code, file, build, files)
    torch.manual_seed(seed)
    try:
        module = fn()
    except BaseException:  # noqa: B902
        raise ModelError(f"{build}() raised:\n" + cut_traceback(traceback.format_exc()))
    if not isinstance(module, torch.nn.Module):
        raise ModelError(f"{build}() returned {type(module).__name__}, not a torch.nn.Module")
    return module


DTYPES: dict[torch.dtype, str] = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL"}


def layout_of(module: torch.nn.Module) -> list[Param]:
    """The parameters as a job lists them.

    Args:
        module: the module.

    Returns:
        (name, shape) of each parameter, in named_parameters() order.
    """
    return [(n, list(p.shape)) for n, p in module.named_parameters()]


def state_of(module: torch.nn.Module) -> tuple[list[Buffer], dict[str, str]]:
    """The rest of the module's state_dict.

    Args:
        module: the module.

    Returns:
        Its persistent buffers as (name, dtype, shape) in order, and the
        names that are another parameter's (tied weights) as {alias:
        parameter name}.

    Raises:
        ModelError: a buffer of a dtype Tally cannot keep.
    """
    names = {id(p): n for n, p in module.named_parameters()}
    buffers: list[Buffer] = []
    aliases: dict[str, str] = {}
    for key, t in module.state_dict(keep_vars=True).items():
        if isinstance(t, torch.nn.Parameter):
            if names.get(id(t), key) != key:
                aliases[key] = names[id(t)]
            continue
        if t.dtype not in DTYPES:
            raise ModelError(f"buffer {key} is {t.dtype}, which Tally cannot keep")
        buffers.append((key, DTYPES[t.dtype], list(t.shape)))
    return buffers, aliases


def check_layout(module: torch.nn.Module, expected: Sequence[tuple[str, Sequence[int]]]) -> None:
    """Checks the module's parameters against the job's.

    Args:
        module: the module built here.
        expected: the job's parameters, (name, shape) in order.

    Raises:
        ModelError: the module has no parameters.
        LayoutError: a parameter's name or shape, or their number, differs.
    """
    got = layout_of(module)
    if not got:
        raise ModelError("the module has no parameters to train")
    want = [(n, list(s)) for n, s in expected]
    if got == want:
        return
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            raise LayoutError(f"the module's parameter {i} is {g[0]} {g[1]}, the job's "
                              f"{w[0]} {w[1]}: the worker built another model")
    raise LayoutError(f"the module has {len(got)} parameters, the job {len(want)}")
