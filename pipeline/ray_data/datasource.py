"""The build's two ends in Ray Data's terms: ``CorpusDatasource`` (a ``ray.data.Datasource``: one read task per
planned unit, a row per document with its stable id; ``ReadCorpus`` in Ray's plans) and ``UnitsDatasink`` (a
``ray.data.Datasink`` named after the stage's sink, ``WriteDocs`` / ``WriteCounts``: each write task commits its
units with their markers and returns the markers)."""
from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasink

from corpus.readers import Unit
from pipeline.markers import Marker
from pipeline.ray_data.guard import in_worker
from pipeline.rows import UserError
from storage.redact import redact_url


class CorpusDatasource(Datasource):
    """Our corpus as a Ray Data datasource: one read task per unit (the units the plan fixed), yielding the unit's
    documents as rows (``docs.read_block``). Named ``ReadCorpus`` in Ray's plans, logs and Dashboard."""

    def __init__(self, units: Sequence[Unit], read: Callable[[Unit], Any], sizes: dict[str, int] | None = None):
        self._units, self._read, self._sizes = list(units), read, sizes or {}

    def get_name(self) -> str:
        return type(self._read).__name__.removeprefix("Read")  # Ray names the operator Read<name>: ReadCorpus

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(self._sizes.get(u.uid, 0) for u in self._units) or None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        # One task per unit whatever ``parallelism`` says: the units are the build's fixed plan.
        read = self._read
        return [ReadTask(lambda u=u: [in_worker(read, u)],
                         BlockMetadata(num_rows=None, size_bytes=self._sizes.get(u.uid), exec_stats=None,
                                       input_files=(redact_url(u.path),)), per_task_row_limit=per_task_row_limit)
                for u in self._units]


class UnitsDatasink(Datasink):
    """A row stage's sink as a Ray Data datasink: each write task commits its units (``sink.write``) and returns
    their markers, which the driver collects in ``on_write_complete``."""

    def __init__(self, sink: Any):
        self._sink = sink
        self.results: list[Marker | UserError] = []

    def get_name(self) -> str:
        return type(self._sink).__name__  # WriteDocs, WriteCounts

    def write(self, blocks, ctx) -> list[bytes]:
        import pyarrow as pa

        tables = [b if isinstance(b, pa.Table) else pa.Table.from_pandas(b) for b in blocks]
        return [pickle.dumps(m) for m in in_worker(self._sink.write, tables)]

    def on_write_complete(self, write_result) -> None:
        # Our write tasks' return values through Ray's object store (not storage): see executor._Items.
        self.results = [pickle.loads(b) for r in write_result.write_returns for b in r]
