"""The generic executor: ``map(step, items) -> markers``, and the resumable stage that the build walks.

A *step* is a picklable callable (a frozen dataclass) taking one work item and returning the ``Marker`` it
committed; it may have a ``setup()`` that loads per-process resources (the tokenizer, the pool) into a
process-level cache. An *executor* runs a step over items: ``LocalExecutor`` is a plain loop in this process (tests,
debugging), ``pipeline.ray_data.RayDataExecutor`` runs the very same steps through Ray Data.
``share(obj)`` gives a handle that steps resolve with ``.get()``: the object itself here, one object-store copy on
Ray.

A ``Stage`` is a name, a step and its items by key; a ``rows.RowStage`` (the per-unit passes) is a read, operators
over rows and a sink, run with ``rows(stage, units)``. ``run_stage`` reads the stage's committed markers (resume),
runs the items or units that have none, shows its progress (``progress.py``) and returns every marker, in item
order. Output never depends on which executor ran, nor on CPUs, nodes or arrival order: ids and seeds come
from the items and the files.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from cluster.allocators import fixed_mmap_threshold
from pipeline.markers import Marker, compact, read_markers
from pipeline.progress import StageProgress
from pipeline.rows import RowStage, UserError, measured, sum_ops

log = logging.getLogger(__name__)


class Shared(Protocol):
    """A large read-only object handed to every step once: ``key`` identifies it for per-process caches."""

    key: str

    def get(self) -> Any: ...


@dataclasses.dataclass(frozen=True)
class LocalShared:
    key: str
    """Identifies the object for per-process caches (``work.cached``): a new key makes them load it again."""
    value: Any
    """The object itself: a plain loop shares its process with the steps, so nothing is copied."""

    def get(self) -> Any:
        return self.value


class Executor(Protocol):
    bars: bool  # the executor shows progress bars itself (Ray Data in a terminal): no progress lines then
    in_process: bool  # the steps run in the driver's process (a plain loop): a global step can run there too

    def begin(self) -> None:
        """Start what takes time (a cluster, worker processes) while the driver plans; returns at once."""

    def share(self, key: str, obj: Any) -> Shared: ...

    def warm(self, setup: Callable[[], None], items: int) -> None:
        """Start the worker processes that stages of at most ``items`` items will use and run ``setup`` (loading
        per-process state: the tokenizer) once in each, ahead of the stages and without waiting for it."""

    def share_result(self, key: str, fn: Callable[[], Any]) -> Shared:
        """A handle to what ``fn()`` returns, computed by a worker (the driver never holds it)."""

    def map(self, step: Callable[[Any], Marker], items: Sequence[Any]) -> Iterator[Marker | UserError]:
        """Run ``step`` on every item; the markers as they come, in any order."""

    def rows(self, stage: RowStage, units: Sequence[Any]) -> Iterator[Marker | UserError]:
        """Read ``units`` as rows, apply the stage's operators and commit through its sink; the markers."""

    def end(self) -> None:
        """Release what ``begin`` started (disconnect from Ray, or stop the local Ray it started)."""


class LocalExecutor:
    """A plain loop over the steps, in this process: what tests and debugging use."""

    bars = False
    in_process = True

    def begin(self) -> None:
        fixed_mmap_threshold()  # as every Ray task of the build does in its worker (cluster/allocators.py)

    def share(self, key: str, obj: Any) -> Shared:
        return LocalShared(key, obj)

    def warm(self, setup: Callable[[], None], items: int) -> None:
        pass  # the first item loads what it needs

    def share_result(self, key: str, fn: Callable[[], Any]) -> Shared:
        return LocalShared(key, fn())

    def map(self, step: Callable[[Any], Marker], items: Sequence[Any]) -> Iterator[Marker]:
        return (step(item) for item in items)

    def rows(self, stage: RowStage, units: Sequence[Any]) -> Iterator[Marker | UserError]:
        read = measured(stage.read)
        tables = ((b for b in stage.source.iter_batches(batch_size=None, batch_format="pyarrow"))
                  if stage.source is not None else (read(u) for u in units))
        for table in tables:  # the same callables Ray Data runs, one unit (or one block of a Dataset) at a time
            for op in stage.operators:
                table = measured(op)(table)
            yield from stage.sink.write([table])

    def end(self) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class Stage:
    """``items``: key -> item, the key naming the item's marker (``<work>/<name>/<key>.done.json``); ``sizes``:
    bytes of text per key, for the progress lines' MB/s and ETA (None: items only); ``noun`` names the items;
    ``after``: the stage's hook, called by the driver with the build's state once the stage's markers are in it; it
    returns the next state (what the later stages need from this one: the units, the vocabulary, the pool) or
    refuses early."""

    name: str
    """The stage's name: its folder of markers in _work and its key in ``BuildState.markers``."""
    step: Callable[[Any], Marker]
    """The picklable callable run on each item; it commits the item's output, then returns its marker."""
    items: dict[str, Any]
    """The work items by key, in the order their markers are returned."""
    marker: type[Marker]
    """The stage's marker type: how committed markers are read back on resume."""
    sizes: dict[str, int] | None = None
    """Bytes of text per key, for the progress lines' MB/s and ETA; None: items counted only."""
    noun: str = "items"
    """What the progress lines call the items (``units``, ``shards``, ...)."""
    after: Callable[[Any], Any] | None = None
    """The hook the driver calls with the build's state once the markers are in it, returning the next state; None:
    later stages need only the markers."""
    probe: Callable[[], float | None] | None = None
    """The share (0..1) of a running item done, as its step reports it (the vocab stage): progress for a stage of
    one long item; None: progress counts finished items only."""


def ops_line(stage: str, ops: dict[str, tuple[float, ...]]) -> str:
    """A row pass's operators, as the progress lines show them at its end."""
    return f"{stage} operators: " + "; ".join(
        f"{k} {int(v[0]):,} -> {int(v[1]):,} rows, {v[2] / 1e6:.1f} MB out, {v[3]:.1f} CPU-s" for k, v in ops.items())


def run_stage(stage: Stage | RowStage, executor: Executor, work: str, endpoint_url: str | None = None
              ) -> list[Marker]:
    """Every item's marker in item order, running only the items that have none committed."""
    assert stage.marker.stage == stage.name, (stage.marker, stage.name)
    if isinstance(stage, RowStage) and stage.source is not None:
        log.info("%s: the documents Dataset, streamed", stage.name)
        progress = StageProgress(stage.name, "blocks", 0, 0, lines=False)
        results = []
        for m in executor.rows(stage, []):
            if isinstance(m, UserError):
                m.raise_()
            results.append(m)
        log.info("%s", progress.finish())
        log.info("%s", ops_line(stage.name, sum_ops(results)))
        return results
    items = stage.units if isinstance(stage, RowStage) else stage.items
    if not items:
        return []
    done = {k: compact(m) for k, m in read_markers(work, stage.marker, endpoint_url).items() if k in items}
    pending = {k: item for k, item in items.items() if k not in done}
    sizes = stage.sizes or {}
    log.info("%s: %d %s to run%s", stage.name, len(pending), stage.noun,
             f" ({len(done)} done before)" if done else "")
    progress = StageProgress(stage.name, stage.noun, len(pending), sum(sizes.get(k, 0) for k in pending),
                             lines=not executor.bars, probe=getattr(stage, "probe", None))
    try:
        if pending:
            run = (executor.rows(stage, list(pending.values())) if isinstance(stage, RowStage)
                   else executor.map(stage.step, list(pending.values())))
            for m in run:
                if isinstance(m, UserError):
                    m.raise_()
                done[m.key] = compact(m)  # kept until the manifest: a few hundred bytes each (markers.py)
                progress.add(sizes.get(m.key, 0))
    finally:
        summary = progress.finish()
    log.info("%s", summary)
    if isinstance(stage, RowStage) and pending:
        log.info("%s", ops_line(stage.name, sum_ops(list(done.values()))))
    missing = [k for k in items if k not in done]
    assert not missing, f"{stage.name}: no marker for {missing[:5]}"
    return [done[k] for k in items]
