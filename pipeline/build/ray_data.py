"""The Ray adapter: ``RayDataExecutor`` runs the build's steps through Ray Data, one work item per Ray Data task.

A stage is ``ray.data.from_items(work items)`` -> ``map_batches(step)`` (one block, one task per item) streamed
back to the driver, which only collects the small markers: Ray Data's streaming executor schedules the tasks over
every CPU of the cluster, retries a task whose worker or node died, shows its progress bars in a terminal and keeps
per-operator statistics (logged at DEBUG). What Ray Data does not do stays in the steps: units cut at document
boundaries, the seeded pool, the sliced balanced shards, the markers that make a build resumable
(``executor.run_stage``). Bringing Ray up, the early worker processes and their warm-up: ``ray_cluster.py``.

Tasks rather than Ray Data's actor pools for steps with per-process state: an actor is a new process per stage
(a second or more each, measured by benchmarks/build_overheads.py), while the job's task workers live across
stages and their caches (``work.cached``) give what an actor's ``__init__`` would. A stage is one map operator fed
from memory, so there are no read tasks for an actor pool to starve (the 2-CPU hang of NOTES-stack.md).
"""
from __future__ import annotations

import functools
import logging
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pipeline.build.markers import Marker
from pipeline.build.ray_cluster import RayCluster, raise_users, run_step

log = logging.getLogger(__name__)


def _apply(step: Callable[[Any], Marker], batch: dict) -> dict:
    """One Ray Data task: the step on the batch's item(s), the results pickled (a marker is a small dataclass)."""
    return {"marker": [pickle.dumps(run_step(step, pickle.loads(b))) for b in batch["item"]]}


class RayDataExecutor(RayCluster):
    """Runs steps through Ray Data. ``bars``: Ray Data's progress bars (a terminal) instead of the build's progress
    lines."""

    def __init__(self, num_cpus: int | None = None, init: Callable[[], None] | None = None, bars: bool = False):
        super().__init__(num_cpus, init)
        self.bars = bars

    def _configure(self) -> None:
        import ray.data

        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = self.bars
        # Each execution is one map operator: reserving resources per operator (against starving a later one) only
        # holds CPUs back (16 tasks of 50 ms on 2 CPUs: 1.13 s with it, 0.66 s without; build_overheads.py).
        ctx.op_resource_reservation_enabled = False
        if not self.bars:
            # Ray Data announces every execution at INFO ("Starting execution of Dataset ...") and warns once that
            # its bars are off: in a log, the build's own progress lines say it per stage, with MB/s and ETA.
            logging.getLogger("ray.data").setLevel(logging.WARNING)
            logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)

    def map(self, step: Callable[[Any], Marker], items: Sequence[Any]) -> Iterator[Marker]:
        """Run ``step`` on every item, one Ray Data task each; the markers, in completion order."""
        import ray.data

        if not items:
            return
        self._wait()
        ds = ray.data.from_items([{"item": pickle.dumps(item)} for item in items], override_num_blocks=len(items))
        size = min(self.width, len(items)) if self.width else None
        ds = ds.map_batches(functools.partial(_apply, step), batch_size=None, zero_copy_batch=True,
                            compute=ray.data.TaskPoolStrategy(size=size), **self._options())
        batches = iter(ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=0))
        try:
            for batch in batches:
                for b in batch["marker"]:
                    yield raise_users(pickle.loads(b))
        finally:
            batches.close()  # a failed or abandoned stage stops its tasks now, not when garbage-collected
        if log.isEnabledFor(logging.DEBUG):
            log.debug("Ray Data's statistics of the stage:\n%s", ds.stats())
