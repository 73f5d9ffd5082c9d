"""The lent GPU machine as it comes (../shared/device/README.md): torch with CUDA, Triton, transformers, tokenizers,
pyarrow, but none of the stacks the device bundle carries (Ray, MLflow, s3fs and boto, moto, zstandard, seqeval).

- `NOT_ON_THE_GPU_MACHINE`: those import names;
- `installed(name)`: whether this interpreter can import `name` (without importing it);
- `needs(name)`: import `name`, or skip the calling test/fixture where it is not installed (on CI, where the test
  extra installs all of them, an ImportError inside an installed package still fails);
- `bare_env(folder)`: environment variables under which every Python process started with them behaves as if
  those stacks were not installed (a `sitecustomize` on PYTHONPATH hides them from every import finder, so
  `importlib.util.find_spec` says None and `import` raises ModuleNotFoundError, as on that machine). The checks of
  the lent machine's path run under it here (tests/benchmarks/test_gpu_bare.py).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

NOT_ON_THE_GPU_MACHINE = ("aiobotocore", "boto3", "botocore", "mlflow", "moto", "ray", "s3fs", "seqeval",
                          "zstandard")

_SITECUSTOMIZE = f'''"""Hides {", ".join(NOT_ON_THE_GPU_MACHINE)} from this process (tests/_bare.py)."""
import sys

HIDDEN = {set(NOT_ON_THE_GPU_MACHINE)!r}


class _Hiding:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find is not None else None

    def __getattr__(self, attr):
        return getattr(self.finder, attr)


sys.meta_path[:] = [_Hiding(f) for f in sys.meta_path]
'''


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def needs(name: str) -> ModuleType:
    """`import name`, or a skip naming it where it is not installed (the lent GPU machine without the bundle)."""
    if not installed(name):
        pytest.skip(f"needs {name}, not installed here (the lent GPU machine without the device bundle)")
    return importlib.import_module(name)


def bare_env(folder: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with a sitecustomize in `folder` first on PYTHONPATH."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    return env
