"""The build's two ends in Ray Data's terms: ``CorpusDatasource`` (a ``ray.data.Datasource``: one read task per
planned unit, or per few units of a big build, a row per document with its stable id; ``ReadCorpus`` in Ray's plans)
and ``UnitsDatasink`` (a ``ray.data.Datasink`` named after the stage's sink, ``WriteDocs`` / ``WriteCounts``: each
write task commits its units, one at a time as their rows come, with their markers and returns the markers).

Why a few units per task at scale: Ray Data's streaming executor costs the driver ~10 ms of CPU per task (measured
by ``benchmarks/build_driver_scale.py --ray-tasks``), and a unit is a task in each of the two row passes: at 250,000
units that was ~1.5 CPU-hours in one process and a ceiling of ~100 tasks a second. A task of up to
``MAX_UNITS_PER_TASK`` units divides both; the units of a task are read, processed and committed one after the
other, so a worker holds one unit's rows at a time, as before, and the output does not change (it never depends on
which task ran a unit)."""
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

MAX_UNITS_PER_TASK = 16  # 250,000 units: ~1.3 ms of Ray Data's driver CPU per unit instead of ~21 (two passes)
TASKS_PER_CPU = 8  # units are grouped only while every CPU still gets this many tasks (the tail stays short)


def units_per_task(units: int, cpus: int) -> int:
    """How many units one read task takes: 1 for a build of fewer than ``2 * TASKS_PER_CPU`` units per CPU, up to
    ``MAX_UNITS_PER_TASK`` for a big one."""
    return max(1, min(MAX_UNITS_PER_TASK, units // (TASKS_PER_CPU * max(1, cpus))))


class CorpusDatasource(Datasource):
    """Our corpus as a Ray Data datasource: one read task per unit, or per ``per_task`` consecutive units (the units
    the plan fixed), yielding each unit's documents as rows (``docs.read_block``), one block per unit. Named
    ``ReadCorpus`` in Ray's plans, logs and Dashboard."""

    def __init__(self, units: Sequence[Unit], read: Callable[[Unit], Any], sizes: dict[str, int] | None = None,
                 per_task: int = 1):
        self._units, self._read, self._sizes = list(units), read, sizes or {}
        self._per_task = max(1, per_task)

    def get_name(self) -> str:
        return type(self._read).__name__.removeprefix("Read")  # Ray names the operator Read<name>: ReadCorpus

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(self._sizes.get(u.uid, 0) for u in self._units) or None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        # One task per unit (or per group of units) whatever ``parallelism`` says: the units are the build's fixed
        # plan. A generator: the task's units are read one after the other, each flowing on before the next is read.
        read, k = self._read, self._per_task
        groups = [self._units[i:i + k] for i in range(0, len(self._units), k)]
        return [ReadTask(lambda g=g: (in_worker(read, u) for u in g),
                         BlockMetadata(num_rows=None, size_bytes=sum(self._sizes.get(u.uid, 0) for u in g) or None,
                                       exec_stats=None,
                                       input_files=tuple(dict.fromkeys(redact_url(u.path) for u in g))),
                         per_task_row_limit=per_task_row_limit)
                for g in groups]


class UnitsDatasink(Datasink):
    """A row stage's sink as a Ray Data datasink: each write task commits its units (``sink.write``) and returns
    their markers, which the driver collects as each task ends (``executor.write_streaming``). ``by_unit``: the rows
    come unit after unit (our read), so each unit is committed as soon as the next one's rows begin, and a task of
    several units holds one at a time; off (a user's Dataset), the task's rows are committed together."""

    def __init__(self, sink: Any, by_unit: bool = True):
        self._sink, self._by_unit = sink, by_unit
        self.results: list[Marker | UserError] = []

    def get_name(self) -> str:
        return type(self._sink).__name__  # WriteDocs, WriteCounts

    def write(self, blocks, ctx) -> list[bytes]:
        import pyarrow as pa

        tables = (b if isinstance(b, pa.Table) else pa.Table.from_pandas(b) for b in blocks)
        if not self._by_unit:
            return [pickle.dumps(m) for m in in_worker(self._sink.write, list(tables))]
        import pyarrow.compute as pc

        out: list[bytes] = []
        held: list[pa.Table] = []  # the rows of the last unit seen: more of them may come in the next block

        def commit(ts: list[pa.Table]) -> None:
            if ts:
                out.extend(pickle.dumps(m) for m in in_worker(self._sink.write, ts))

        for t in tables:
            if not t.num_rows:
                continue
            units = t.column("unit")
            last = units[-1]
            if held and held[0].column("unit")[-1] != units[0]:
                commit(held)  # its unit is complete: the next one's rows have begun
                held = []
            if units[0] == last:
                held.append(t)
                continue
            is_last = pc.equal(units, last)
            commit([*held, t.filter(pc.invert(is_last))])
            held = [t.filter(is_last)]
        commit(held)
        return out

    def on_write_complete(self, write_result) -> None:
        # Our write tasks' return values through Ray's object store (not storage): see executor._Items.
        self.results = [pickle.loads(b) for r in write_result.write_returns for b in r]
