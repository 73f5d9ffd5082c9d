"""The generic executor: ``map(step, items) -> markers``, and the resumable stage that the build walks.

A *step* is a picklable callable (a frozen dataclass) taking one item and returning the ``Marker`` it committed; it
may have a ``setup()`` that loads per-process resources (the tokenizer, the pool) into a process-level cache. An
*executor* runs a step over items: ``LocalExecutor`` is a plain loop in this process (tests, debugging),
``pipeline.build.ray_tasks.RayExecutor`` runs the very same steps as Ray tasks. ``share(obj)`` gives a handle that
steps resolve with ``.get()``: the object itself here, one object-store copy on Ray.

A ``Stage`` is a name, a step and its items by key; ``run_stage`` reads the stage's committed markers (resume), maps
the step over the items that have none and returns every item's marker, in item order. Output never depends on
which executor ran, nor on CPUs, nodes or arrival order: ids and seeds come from the items and the files.
"""
from __future__ import annotations

import dataclasses
import logging
import resource
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from pipeline.build.markers import Marker, read_markers

log = logging.getLogger(__name__)


class Shared(Protocol):
    """A large read-only object handed to every step once: ``key`` identifies it for per-process caches."""

    key: str

    def get(self) -> Any: ...


@dataclasses.dataclass(frozen=True)
class LocalShared:
    key: str
    value: Any

    def get(self) -> Any:
        return self.value


class Executor(Protocol):
    def begin(self) -> None:
        """Start what takes time (a cluster) while the driver plans; returns at once."""

    def share(self, key: str, obj: Any) -> Shared: ...

    def map(self, step: Callable[[Any], Marker], items: Sequence[Any]) -> list[Marker]:
        """Run ``step`` on every item; the markers in any order."""


class LocalExecutor:
    """A plain loop over the steps, in this process: what tests and debugging use."""

    def begin(self) -> None:
        pass

    def share(self, key: str, obj: Any) -> Shared:
        return LocalShared(key, obj)

    def map(self, step: Callable[[Any], Marker], items: Sequence[Any]) -> list[Marker]:
        return [step(item) for item in items]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclasses.dataclass(frozen=True)
class Stage:
    """``items``: key -> item, the key naming the item's marker (``<work>/<name>/<key>.done.json``)."""

    name: str
    step: Callable[[Any], Marker]
    items: dict[str, Any]
    marker: type[Marker]


def run_stage(stage: Stage, executor: Executor, work: str, endpoint_url: str | None = None) -> list[Marker]:
    """Every item's marker in item order, running only the items that have none committed."""
    assert stage.marker.stage == stage.name, (stage.marker, stage.name)
    done = {k: m for k, m in read_markers(work, stage.marker, endpoint_url).items() if k in stage.items}
    pending = [item for k, item in stage.items.items() if k not in done]
    log.info("%s stage: %d items (%d already done)", stage.name, len(stage.items), len(done))
    t0, cpu0 = time.perf_counter(), _cpu()
    if pending:
        for m in executor.map(stage.step, pending):
            done[m.key] = m
    # The driver's own CPU per stage: it must stay flat in corpus size (it plans and collects markers only).
    log.info("%s stage: done in %.1f s, driver CPU %.2f s (%.2f s since start)", stage.name,
             time.perf_counter() - t0, _cpu() - cpu0, _cpu())
    missing = [k for k in stage.items if k not in done]
    assert not missing, f"{stage.name}: no marker for {missing[:5]}"
    return [done[k] for k in stage.items]
