"""A Python model given as a directory (model.python.files), loaded for one
job alone.

A worker is one long-lived process that runs job after job, and a job's
files are code its submitter named as they liked (net.py, layers.py, and
sometimes torch.py). So the files never become top-level modules of the
process: they are written under a directory of their own and imported as
the submodules of a package whose name is the job's alone
(_tally_job_<pid>_<n>), found by a finder that knows that package and
nothing else. Inside the files, an import whose first name is one of the
files' own top-level modules (`import layers`, `from parts.blocks import
Block`) means the job's file, as it does where the files were written;
every other import is Python's own. So:

  - a job's files cannot hide or evict a module the process has imported,
    for the worker or for any other job: `import torch` anywhere outside
    the job's files is PyTorch, always;
  - the next job's modules of the same names are its own: close() takes
    the job's package, its finder and its directory away.

A file whose top-level name is one of the standard library's modules or
of the packages a worker runs on (torch, numpy, tally, ...: RESERVED) is
refused, naming the file. Inside the job's code it would stand for that
module (as a script's directory does), which is never what such a file is
for, and it would mean something else on a machine where the name is free;
a clear refusal at submission is better than a model that half works. The
set is fixed, not what a process happens to have imported, so the client
and every worker refuse the same files, whatever jobs they ran before.

Not thread-safe for one instance; instances of different jobs are
independent (each has its own package and finder).
"""
from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import itertools
import os
import shutil
import sys
import tempfile
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tally.errors import ModelError

__all__ = ["ModelError", "ModelFiles", "PACKAGE_PREFIX", "RESERVED", "module_names"]

PACKAGE_PREFIX = "_tally_job_"

_serial = itertools.count(1)
_real_import = builtins.__import__


# The names a model's file may not take: the standard library's, and the
# packages a worker runs on and their own dependencies.
RESERVED = frozenset(sys.stdlib_module_names) | frozenset({
    "torch", "torchvision", "torchaudio", "numpy", "tally", "grpc", "google",
    "typing_extensions", "sympy", "networkx", "jinja2", "fsspec", "filelock",
    "yaml", "PIL", "pybind11"})


def module_names(paths: Iterable[str]) -> dict[str, str]:
    """The module and package names the files define, each with the file or
    folder that defines it.

    Args:
        paths: the files' paths, relative, "/"-separated, each ending .py.

    Returns:
        {name: file or folder}: {"parts.blocks": "parts/blocks.py",
        "parts": "parts/", ...}.
    """
    names: dict[str, str] = {}
    for path in paths:
        parts = path[:-len(".py")].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            here = path if i == len(parts) else "/".join(parts[:i]) + "/"
            names.setdefault(name, here)
    return names


class _Loader(importlib.abc.Loader):
    """Runs one of the job's files (or none, for the job's package and a
    folder without __init__.py) with the job's builtins, whose __import__
    maps the job's own names into its package."""

    def __init__(self, path: str | None, job_builtins: dict[str, Any]) -> None:
        self._path = path
        self._builtins = job_builtins

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # Python's default module

    def exec_module(self, module: types.ModuleType) -> None:
        # Functions defined in the module keep these builtins, so an import
        # inside forward() resolves as one at the top of the file does.
        module.__dict__["__builtins__"] = self._builtins
        if self._path is None:
            return
        source = self.get_source(module.__name__)
        exec(compile(source, self._path, "exec", dont_inherit=True), module.__dict__)

    def get_source(self, fullname: str) -> str:
        """For tracebacks (linecache) while the file is there."""
        if self._path is None:
            return ""
        with open(self._path, encoding="utf-8") as f:
            return f.read()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the modules of one job's package in its directory, and
    nothing else: a name outside the package is left to Python's finders."""

    def __init__(self, package: str, root: str, job_builtins: dict[str, Any]) -> None:
        self._package = package
        self._root = root
        self._builtins = job_builtins

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname == self._package:
            # The package itself runs no file (a top-level __init__.py is
            # not the model's: where it was written it was never imported).
            return self._spec(fullname, None, self._root)
        if not fullname.startswith(self._package + "."):
            return None
        base = os.path.join(self._root, *fullname[len(self._package) + 1:].split("."))
        if os.path.isdir(base):
            init = os.path.join(base, "__init__.py")
            return self._spec(fullname, init if os.path.isfile(init) else None, base)
        if os.path.isfile(base + ".py"):
            return self._spec(fullname, base + ".py", None)
        return None

    def _spec(self, fullname: str, path: str | None,
              folder: str | None) -> importlib.machinery.ModuleSpec:
        spec = importlib.machinery.ModuleSpec(fullname, _Loader(path, self._builtins),
                                              origin=path, is_package=folder is not None)
        if folder is not None:
            spec.submodule_search_locations = [folder]
        spec.has_location = path is not None
        return spec


class ModelFiles:
    """One job's files ({relative path: text}), importable by the job's own
    code under their own names and by nobody else's. import_module() gives
    one of them; close() takes them all away."""

    def __init__(self, files: Mapping[str, str],
                 reserved: frozenset[str] = RESERVED) -> None:
        """Writes the files under a directory of their own and installs the
        job's finder.

        Args:
            files: {relative path: text}, each path a .py file inside the model.
            reserved: the top-level names no file may take (RESERVED).

        Raises:
            ModelError: a path outside the model or not a .py file, or a
                file or folder that takes a reserved name.
            OSError: the files cannot be written.
        """
        for path in files:
            if os.path.isabs(path) or ".." in path.split("/") or not path.endswith(".py"):
                raise ModelError(f"model.python.files: {path} is not a .py file inside the model")
        self._names = module_names(files)
        taken = sorted(n for n in self._names if "." not in n and n in reserved)
        if taken:
            raise ModelError(
                "model.python.files: " +
                ", ".join(f"{self._names[n]} takes the name of the module '{n}'" for n in taken) +
                " (the standard library's or a package Tally runs on): in the model's code "
                "the file would stand for that module; rename it")
        self._tops = frozenset(n for n in self._names if "." not in n)
        self.package = f"{PACKAGE_PREFIX}{os.getpid()}_{next(_serial)}"
        self.root = tempfile.mkdtemp(prefix="tally-model-")
        self._finder: _Finder | None = None
        try:
            self._write(files)
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        job_builtins = dict(builtins.__dict__)
        job_builtins["__import__"] = self._import
        self._finder = _Finder(self.package, self.root, job_builtins)
        sys.meta_path.insert(0, self._finder)

    def _write(self, files: Mapping[str, str]) -> None:
        for path, text in files.items():
            where = os.path.join(self.root, path)
            os.makedirs(os.path.dirname(where), exist_ok=True)
            with open(where, "w", encoding="utf-8") as f:
                f.write(text)

    def _import(self, name: str, globals: dict[str, Any] | None = None,
                locals: Mapping[str, Any] | None = None, fromlist: Sequence[str] = (),
                level: int = 0) -> types.ModuleType:
        """__import__ for the job's code: its own top-level names within its
        package, everything else (and relative imports) as Python does."""
        top = name.partition(".")[0]
        if level != 0 or top not in self._tops:
            return _real_import(name, globals, locals, fromlist, level)
        module = _real_import(f"{self.package}.{name}", globals, locals, fromlist, 0)
        # `import a.b` binds `a`: the job's a, not the job's package.
        return module if fromlist else sys.modules[f"{self.package}.{top}"]

    def import_module(self, name: str) -> types.ModuleType:
        """The job's module `name`, imported (its code run) once.

        Args:
            name: the module's name, dotted, as the files' paths are
                ("parts.blocks" for parts/blocks.py).

        Returns:
            The module.

        Raises:
            ModuleNotFoundError: no file defines `name`.
            BaseException: whatever the job's code raises while it runs.
        """
        if name not in self._names:
            raise ModuleNotFoundError(f"No module named '{name}' among the model's files")
        return importlib.import_module(f"{self.package}.{name}")

    def modules(self) -> list[str]:
        """The job's modules imported so far, by their names in the process."""
        inside = self.package + "."
        return [n for n in list(sys.modules) if n == self.package or n.startswith(inside)]

    def close(self) -> None:
        """Takes the finder, the modules and the directory away (twice is
        harmless)."""
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None
        for name in self.modules():
            sys.modules.pop(name, None)
        shutil.rmtree(self.root, ignore_errors=True)
