"""The Ray adapter: the build on Ray Data. Each per-unit pass is one Ray Data execution over rows:

    ReadCorpus -> MapBatches(SplitTokenize) -> Write (sink WriteDocs)          the read pass: the input, once
    ReadDocs -> MapBatches(CountPairs) -> Write (sink WriteCounts)             the instances pass

``CorpusDatasource`` (a ``ray.data.Datasource``: one read task per planned unit, or per up to 16 units of a big
build, a row per document with its stable id) feeds the operators of a ``rows.RowStage`` (``map_batches``, one
block per unit) and ``UnitsDatasink`` (a ``ray.data.Datasink`` named after the stage's sink, ``WriteDocs`` /
``WriteCounts``) commits each unit with its marker. Ray Data fuses the chain into one task per unit (or group of units;
same compute, same resources):
Ray's Dashboard and ``Dataset.stats()`` show it as ``ReadCorpus->MapBatches(SplitTokenize)->...->Write`` with rows
and bytes per operator, and a unit's rows never leave the process that read them before they are committed.

The few one-item or per-file stages (pieces of big compressed files, the vocabulary, the pool's merge, the
shards) are ``from_items(work items) -> map_batches(<step>)``, one Ray Data task per item (a stage of one item: one Ray
task named after its step, without an execution's start-up); they are not rows
because what they do is not per document: the shards' exact balance needs every unit's row count first and then
hands each shard precisely its slices (docs/data.md says why no Ray Data repartition does that).

What stays ours, and why: the reading of ``--input`` files (``corpus/readers/``, for every format: Ray Data's
``read_text``/``read_json``/``read_parquet`` give no byte offsets or row indices for the ``<file>:<offset>``
document ids every seed derives from, split by file or row group only, never at a document boundary inside a big
file or compressed stream, and know neither blank-line-separated documents nor the reference's one-sentence-per-line
format; our listing also gives the size/etag stamps of the build's identity in one LIST per prefix); the pieces of
big compressed files; the seeded pool; the completion markers that make a killed build resumable. Ray Data's own
readers are for the other input: ``build(config, documents=ray.data.read_parquet(...))``, ids from a column.
Bringing Ray up, the early worker processes and their warm-up: ``cluster.py``. A Ray Dataset of documents as the
input: ``documents.py``.

    executor.py    RayDataExecutor (row passes: read_datasource -> map_batches -> write_datasink; item stages)
    datasource.py  CorpusDatasource (ReadCorpus, ReadDocs), UnitsDatasink (WriteDocs, WriteCounts)
    cluster.py     Ray brought up early, warm worker processes, the vocabulary in the object store
    documents.py   build(config, documents=ds): the Dataset's digest and units
    guard.py       in_worker/guarded: every task's code with our log lines and its exceptions redacted
"""
from __future__ import annotations

from typing import Any

__all__ = ["RayDataExecutor"]


def __getattr__(name: str) -> Any:
    # Imported on first use: importing ray.data costs the plain loop (--no-ray) a second it does not need.
    if name == "RayDataExecutor":
        from pipeline.ray_data.executor import RayDataExecutor

        return RayDataExecutor
    raise AttributeError(name)
