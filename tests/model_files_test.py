#!/usr/bin/python3
"""A model directory's files (python/tally/model_files.py) are the job's
alone: they never hide nor evict a module the process imported, and the
next job's modules of the same names are its own.

Loads the module from the source tree, so it needs no build (and no
cluster); the PyTorch cases run where python3-torch is installed.

  model_files_test.py
"""
import importlib
import json
import os
import sys
import types
import unittest

try:
    import torch
except ImportError:  # the cases that need it are skipped
    torch = None

# After json and torch: both are modules the process had loaded before it
# loaded a model, as they are on a worker.
# The source tree's package without its __init__ (which needs the build's
# tally_pb2 and grpcio): model_files imports tally.errors alone.
_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = types.ModuleType("tally")
_PACKAGE.__path__ = [os.path.join(os.path.dirname(_HERE), "python", "tally")]
sys.modules["tally"] = _PACKAGE
mf = importlib.import_module("tally.model_files")
errors = importlib.import_module("tally.errors")


def _job_modules():
    return [n for n in sys.modules if n.startswith(mf.PACKAGE_PREFIX)]


class Refused(unittest.TestCase):
    """A file named as a module the process had loaded is refused, naming
    the file, and the process's module is left as it was."""

    def _refused(self, name, files, want):
        before, finders = sys.modules[name], list(sys.meta_path)
        with self.assertRaises(mf.ModelError) as e:
            mf.ModelFiles(files)
        self.assertIn(want, str(e.exception))
        self.assertIn(f"'{name}'", str(e.exception))
        self.assertIs(sys.modules[name], before)
        self.assertEqual(sys.meta_path, finders)
        self.assertEqual(_job_modules(), [])

    def test_json_py(self):
        self.assertIn("json", mf.RESERVED)
        self._refused("json", {"json.py": "X = 1\n", "model.py": "import json\n"}, "json.py")

    def test_folder(self):
        self._refused("json", {"json/__init__.py": "", "model.py": ""}, "json/")

    @unittest.skipIf(torch is None, "no python3-torch")
    def test_torch_py_then_a_torch_model(self):
        self._refused("torch", {"torch.py": "cuda = None\n", "model.py": "import torch\n"},
                      "torch.py")
        self.assertTrue(callable(torch.cuda.is_available))
        # The next job imports PyTorch and builds a module with it.
        files = mf.ModelFiles({"model.py": "import torch\nfrom torch import nn\n"
                                           "def make_model():\n    return nn.Linear(2, 3)\n"})
        try:
            made = files.import_module("model").make_model()
        finally:
            files.close()
        self.assertIsInstance(made, torch.nn.Module)
        self.assertIs(importlib.import_module("torch"), torch)

    def test_outside(self):
        with self.assertRaises(mf.ModelError) as e:
            mf.ModelFiles({"../evil.py": ""})
        self.assertIn("../evil.py is not a .py file inside the model", str(e.exception))

    def test_the_error_is_the_packages(self):
        """model_files.ModelError is tally.errors' (one class, wherever it
        is imported from), a TallyError."""
        self.assertIs(mf.ModelError, errors.ModelError)
        with self.assertRaises(errors.TallyError):
            mf.ModelFiles({"notes.txt": ""})


class Private(unittest.TestCase):
    def test_files_import_each_other_by_their_names(self):
        files = mf.ModelFiles({
            "model.py": "import layers\nfrom parts.blocks import W\nimport json\n"
                        "VALUE = layers.V + W\nJSON = json\n"
                        "def later():\n    import layers\n    return layers.V\n",
            "layers.py": "V = 1\n",
            "parts/__init__.py": "",
            "parts/blocks.py": "from . import inner\nW = inner.X\n",
            "parts/inner.py": "X = 10\n"})
        try:
            model = files.import_module("model")
            self.assertEqual(model.VALUE, 11)
            self.assertEqual(model.later(), 1)  # an import inside a function
            self.assertIs(model.JSON, json)  # every other name is Python's own
            for name in ("model", "layers", "parts", "parts.blocks"):
                self.assertNotIn(name, sys.modules)
            self.assertTrue(model.__name__.startswith(files.package + "."))
        finally:
            files.close()
        self.assertEqual(_job_modules(), [])
        self.assertFalse(os.path.exists(files.root))

    def test_a_free_name_is_the_jobs_inside_it_only(self):
        """A file named as no module Tally reserves (layers.py) stands for
        the job's file in the job's code only, and the standard library's
        names are refused whether this process imported them or not."""
        files = mf.ModelFiles({"layers.py": "MINE = True\n",
                               "model.py": "import layers\nMINE = layers.MINE\n"},
                              reserved=mf.RESERVED)
        try:
            self.assertTrue(files.import_module("model").MINE)
            self.assertNotIn("layers", sys.modules)
            with self.assertRaises(ImportError):
                importlib.import_module("layers")
        finally:
            files.close()
        self.assertIn("wave", mf.RESERVED)  # stdlib, loaded or not
        with self.assertRaises(mf.ModelError):
            mf.ModelFiles({"wave.py": "", "model.py": ""})

    def _unchecked(self, name):
        """Even a file named as a loaded module, were it let through (no
        names refused), is the job's alone: the process's module stays."""
        before = sys.modules[name]
        files = mf.ModelFiles({f"{name}.py": "MINE = True\n",
                               "model.py": f"import {name}\nMINE = {name}.MINE\n"},
                              reserved=frozenset())
        try:
            self.assertTrue(files.import_module("model").MINE)
            self.assertIs(sys.modules[name], before)
            self.assertIs(importlib.import_module(name), before)
        finally:
            files.close()
        self.assertIs(sys.modules[name], before)

    def test_unchecked_json(self):
        self._unchecked("json")

    @unittest.skipIf(torch is None, "no python3-torch")
    def test_unchecked_torch(self):
        self._unchecked("torch")
        self.assertTrue(callable(torch.cuda.is_available))
        self.assertIsInstance(torch.nn.Linear(2, 2), torch.nn.Module)

    def test_missing_module(self):
        files = mf.ModelFiles({"net.py": ""})
        try:
            with self.assertRaises(ModuleNotFoundError) as e:
                files.import_module("model")
            self.assertIn("No module named 'model' among the model's files", str(e.exception))
        finally:
            files.close()


class LaterJobs(unittest.TestCase):
    MODEL = "import helper\ndef make_model():\n    return helper.WHO\n"

    def _who(self, files):
        job = mf.ModelFiles(files)
        try:
            return job.import_module("model").make_model()
        finally:
            job.close()

    def test_each_job_its_own_model_py(self):
        self.assertEqual(self._who({"model.py": self.MODEL, "helper.py": "WHO = 'a'\n"}), "a")
        self.assertEqual(self._who({"model.py": self.MODEL, "helper.py": "WHO = 'b'\n"}), "b")
        self.assertEqual(self._who({"model.py": "def make_model():\n    return 'c'\n"}), "c")
        # A job that lacks helper.py does not find the previous job's.
        with self.assertRaises(ModuleNotFoundError):
            self._who({"model.py": self.MODEL})
        self.assertEqual(_job_modules(), [])

    def test_two_jobs_at_once(self):
        a = mf.ModelFiles({"model.py": self.MODEL, "helper.py": "WHO = 'a'\n"})
        b = mf.ModelFiles({"model.py": self.MODEL, "helper.py": "WHO = 'b'\n"})
        try:
            self.assertNotEqual(a.package, b.package)
            self.assertEqual(a.import_module("model").make_model(), "a")
            self.assertEqual(b.import_module("model").make_model(), "b")
        finally:
            a.close()
            b.close()
        a.close()  # twice is harmless
        self.assertEqual(_job_modules(), [])


if __name__ == "__main__":
    unittest.main()
