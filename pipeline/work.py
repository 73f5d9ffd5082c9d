"""The build's working folder (``<output>/_work``) as the steps see it: where each stage's files go, the
intermediate Arrow tables, and the per-process caches that keep a worker's tokenizer and pool loaded across items.

Intermediate files are Arrow IPC files (no encoding, no compression; a record batch is read back by index, like a
Parquet row group), deleted with _work once the manifest is committed: the units' tokenized documents (``docs/``),
read by the pool, the instances pass and again by the shard items that make their rows, and each unit's row counts
(``counts/``). No instance is ever written here. Final shards are zstd Parquet.
"""
from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Any

import pyarrow as pa

from corpus.create_instances import InstanceConfig
from corpus.readers import ReadOptions
from storage.fs import filesystem_for, join, open_atomic

WORK_SUFFIX = ".arrow"


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What the steps need (never the whole job config): where _work is, and the component configs."""

    work: str
    """The build's working folder, ``<output>/_work``: every stage's intermediate files and markers."""
    output: str
    """The dataset's folder, where the shards are committed."""
    read: ReadOptions
    """How the inputs are read (``BuildConfig.read``)."""
    instances: InstanceConfig
    """How documents become instances (``BuildConfig.instances``)."""
    do_lower_case: bool
    """Lowercase and strip accents before WordPiece (``BuildConfig.do_lower_case``)."""
    dupe_factor: int
    """Passes over each document (``BuildConfig.dupe_factor``)."""
    vocab_size: int
    """Entries of the vocabulary in use (given or trained, not the one asked for): it picks uint16 or uint32 ids."""
    endpoint_url: str | None = None
    """An S3-compatible endpoint for s3:// URLs; None: the default one."""
    fence: Any = None
    """The output's writer lease, proved before each commit (storage/fence.py); None: nothing to prove."""

    def url(self, *parts: str) -> str:
        return join(self.work, *parts)

    def pool_part_url(self, uid: str) -> str:
        return self.url("pool", "parts", uid + WORK_SUFFIX)


def write_work_table(f, table: pa.Table) -> None:
    """One record batch: ``read_work_table`` gives the table back."""
    with pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table.combine_chunks())


def read_work_table(f) -> pa.Table:
    return pa.ipc.open_file(f).read_all()


def read_table(url: str, ctx: StepContext) -> pa.Table:
    fs, path = filesystem_for(url, ctx.endpoint_url)
    with fs.open(path, "rb") as f:
        return read_work_table(f)


def write_table(url: str, table: pa.Table, ctx: StepContext) -> None:
    with open_atomic(url, ctx.endpoint_url) as f:
        write_work_table(f, table)


# --- per-process caches: Ray reuses its worker processes across items, so each loads these once per build.
_CACHE: dict[str, tuple[Any, Any]] = {}
_LOADS: Counter = Counter()  # loads per slot in this process: what process_state reports


def cached(slot: str, key: Any, load) -> Any:
    hit = _CACHE.get(slot)
    if hit is None or hit[0] != key:
        _CACHE[slot] = (key, None)  # drop the old value before loading the new one (one pool in memory)
        _CACHE[slot] = (key, load())
        _LOADS[slot] += 1
    return _CACHE[slot][1]


def process_state(_item: Any = None) -> dict[str, Any]:
    """This process's id, how often it loaded each cached resource, Arrow's allocator and glibc's fixed mmap
    threshold: run as a step, it tells which worker processes hold a tokenizer, whether any loaded one twice, and
    how their memory is allocated (tests, benchmarks)."""
    from cluster.allocators import mmap_threshold_fixed

    return {"pid": os.getpid(), "loads": dict(_LOADS), "arrow_pool": pa.default_memory_pool().backend_name,
            "mmap_threshold": mmap_threshold_fixed()}
