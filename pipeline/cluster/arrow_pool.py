"""Arrow's allocator in the build's processes: jemalloc where the platform's pyarrow has it (Linux wheels).

pyarrow picks its default memory pool once, when it is imported, from ``ARROW_DEFAULT_MEMORY_POOL`` (else mimalloc).
With mimalloc a worker's memory crept up from shard item to shard item (each reads its slices in reader threads
whose heaps mimalloc keeps), so its peak grew with the number of items it ran, that is with the corpus; with jemalloc
it stays flat. Measured on the 419 MB corpus's _work, nine shard items run one after another in one process
(2026-11-28, 2-core sandbox): peak RSS 562-598 MB with mimalloc, the RSS after each item drifting 284 -> 480 MB;
421-428 MB with jemalloc, drifting 189 -> 238 MB. docs/benchmarks.md has the build's figures.

``use_jemalloc()`` sets the variable (unless the user set it) for this process, if pyarrow is not imported yet,
and for every process started from it: a local Ray's workers inherit it. The workers of a cluster get it from the
node's environment (infra/: the image and the cluster YAMLs set it). Standard library only: it must run before
anything imports pyarrow.
"""
from __future__ import annotations

import os
import sys

POOL_VAR = "ARROW_DEFAULT_MEMORY_POOL"


def use_jemalloc() -> None:
    # pyarrow's macOS and Windows wheels have no jemalloc (Arrow would warn and keep its default): Linux only.
    if sys.platform.startswith("linux"):
        os.environ.setdefault(POOL_VAR, "jemalloc")
