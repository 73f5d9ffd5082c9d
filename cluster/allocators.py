"""The allocators of the build's processes, chosen so that a worker's memory stays flat from work item to work item.

Two things made a build worker's memory creep up with every item it ran, so that its peak grew with the corpus
(measured on the 419 MB corpus's ``_work``, nine shard items run one after another in one process, 2026-11-28, 2-core
sandbox; docs/benchmarks.md has the whole build's figures):

- **Arrow's allocator.** pyarrow picks its default memory pool when it is imported, from ``ARROW_DEFAULT_MEMORY_POOL``
  (else mimalloc). mimalloc kept what the items freed: peak RSS 562-598 MB, the RSS after each item 284 -> 480 MB;
  jemalloc: 421-434 MB, 178 -> 257 MB. ``use_jemalloc()`` sets the variable (unless the user set it) for this process,
  if pyarrow is not imported yet, and for every process started from it (a local Ray's workers inherit it); the
  workers of a cluster get it from the node's environment (infra/: the image and the cluster YAMLs set it).
- **glibc's mmap threshold.** Work tables read through fsspec arrive as Python bytes, allocated by glibc's malloc in
  the reader threads. glibc raises its mmap threshold to the size of every large block freed (up to 32 MB), so after
  the first few reads those blocks come from the threads' arenas, which keep them: RSS after each item 178 -> 257 MB
  with jemalloc alone, 128 -> 148 MB (peak 363) with a fixed 1 MiB threshold. ``fixed_mmap_threshold()`` fixes it
  with ``mallopt`` in the running process (no environment needed: the build's Ray tasks call it in every worker,
  ``pipeline/ray_data/guard.py``, the plain loop in its process, ``LocalExecutor.begin``). Its cost: the plain loop
  on 105 MB spent 0-5% more CPU-seconds (mmap and page faults), and peaked at 462-470 MB instead of 536-550.

Standard library only: ``use_jemalloc`` must run before anything imports pyarrow.
"""
from __future__ import annotations

import ctypes
import os
import sys

POOL_VAR = "ARROW_DEFAULT_MEMORY_POOL"
MMAP_THRESHOLD = 1 << 20  # bytes: larger blocks are mmapped, and unmapped when freed
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
_fixed: list[int] = []  # the threshold this process set, once


def use_jemalloc() -> None:
    # pyarrow's macOS and Windows wheels have no jemalloc (Arrow would warn and keep its default): Linux only.
    if sys.platform.startswith("linux"):
        os.environ.setdefault(POOL_VAR, "jemalloc")


def fixed_mmap_threshold() -> int | None:
    """Fix glibc's mmap threshold in this process (once; later calls are free): the threshold set, or None where
    there is no glibc ``mallopt`` (macOS, musl answers 0)."""
    if not _fixed:
        _fixed.append(_set_threshold())
    return _fixed[0] or None


def mmap_threshold_fixed() -> int | None:
    """The threshold ``fixed_mmap_threshold`` set in this process, None if it has not run (or could not set one)."""
    return (_fixed or [0])[0] or None


def _set_threshold() -> int:
    if not sys.platform.startswith("linux"):
        return 0
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return 0
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return MMAP_THRESHOLD if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 else 0
