"""``RayDataExecutor``: the build's stages on Ray Data (the package's docstring says how)."""
from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from corpus.readers import Unit
from pipeline.markers import SUFFIX, Marker
from pipeline.ray_data.cluster import RayCluster, RayShared, run_step
from pipeline.ray_data.guard import guarded, in_worker
from pipeline.rows import RowStage, UserError, measured
from storage.fs import join, list_names, read_bytes

if TYPE_CHECKING:  # for the annotations only
    import ray.data

# Ray and Ray Data are imported where they are used: by the thread that brings Ray up, once it is up (a second of
# imports then overlaps the driver's planning and Ray's own start, instead of coming before both).

log = logging.getLogger(__name__)

POLL_S = 2.0  # how often the driver looks for new markers while a row pass runs (the progress lines)


class _Items:
    """One Ray Data task per work item: the step on the batch's item(s), the results pickled (a marker is a small
    dataclass). Subclassed per step (``_named``) so Ray's plans show ``MapBatches(<step>)``. The pickles are this
    build's own objects in Ray's object store, made by the driver and our tasks (Ray pickles every task argument
    the same way); nothing read from storage is unpickled: markers on disk are JSON (``markers.py``)."""

    def __init__(self, step: Callable[[Any], Marker]):
        self.step = step

    def __call__(self, batch: dict) -> dict:
        return {"marker": [pickle.dumps(run_step(self.step, pickle.loads(b))) for b in batch["item"]]}


def _call(fn: Callable[[], Any]) -> Any:
    return in_worker(fn)


def _named(step: Callable[[Any], Marker]) -> _Items:
    return type(type(step).__name__, (_Items,), {})(step)


class RayDataExecutor(RayCluster):
    """Runs the build on Ray Data. ``bars``: Ray Data's progress bars (a terminal) instead of the build's progress
    lines."""

    def __init__(self, num_cpus: int | None = None, init: Callable[[], None] | None = None, bars: bool = False):
        super().__init__(num_cpus, init)
        self.bars = bars

    def _configure(self) -> None:
        import ray.data

        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = self.bars
        # A pass is one (fused) operator: reserving resources per operator (against starving a later one) only holds
        # CPUs back (16 tasks of 50 ms on 2 CPUs: 1.13 s with it, 0.66 s without; build_overheads.py).
        ctx.op_resource_reservation_enabled = False
        if self.width:
            # --num-cpus on a bigger cluster: Ray Data's own cap on an execution's CPUs. Not a pool size per operator
            # (TaskPoolStrategy(size=...)): Ray Data 2.60 does not fuse operators with a size, and an unfused chain
            # would hand a unit's rows from process to process.
            ctx.execution_options.resource_limits = ctx.execution_options.resource_limits.copy(cpu=self.width)
        if not self.bars:
            # Ray Data announces every execution on the console at INFO ("Starting execution of Dataset ...") and
            # warns once that its bars are off: in a log, the build's own progress lines say it per stage, with MB/s
            # and ETA. Its log file (<session>/logs/ray-data/) keeps everything: the plans, the sinks' totals.
            from ray.data._internal.logging import SessionFileHandler

            for h in logging.getLogger("ray.data").handlers:
                if not isinstance(h, SessionFileHandler):
                    h.setLevel(logging.WARNING)
            logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)

    def _compute(self) -> ray.data.TaskPoolStrategy:
        import ray.data

        return ray.data.TaskPoolStrategy()  # the same for every operator, so that Ray Data fuses them

    def share_result(self, key: str, fn: Callable[[], Any]):
        import ray

        self._wait()
        # A task's return value is owned by the driver (it outlives the worker that made it); the driver never
        # fetches it, the workers read it from their node's object store.
        return RayShared(key, ray.remote(_call).options(**self._options()).remote(fn))

    def map(self, step: Callable[[Any], Marker], items: Sequence[Any]) -> Iterator[Marker | UserError]:
        """Run ``step`` on every item, one Ray Data task each (one item: one Ray task); the markers, in completion
        order."""
        if not items:
            return
        import ray.data

        self._wait()
        if len(items) == 1:
            # One item (the pool's merge, the one shard of a small build): a task, as Ray Data would run it, without
            # an execution's start-up and its operators' bookkeeping for a single block.
            ref = ray.remote(run_step).options(name=type(step).__name__, **self._options()).remote(step, items[0])
            try:
                marker = ray.get(ref)
            except BaseException:
                ray.cancel(ref)  # a failed or interrupted stage stops its task now (a no-op once it has ended)
                raise
            yield marker
            return
        ds = ray.data.from_items([{"item": pickle.dumps(item)} for item in items], override_num_blocks=len(items))
        ds = ds.map_batches(_named(step), batch_size=None, zero_copy_batch=True, compute=self._compute(),
                            **self._options())
        batches = iter(ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=0))
        try:
            for batch in batches:
                for b in batch["marker"]:
                    yield pickle.loads(b)
        finally:
            batches.close()  # a failed or abandoned stage stops its tasks now, not when garbage-collected
        if log.isEnabledFor(logging.DEBUG):
            log.debug("Ray Data's statistics of the stage:\n%s", ds.stats())

    def dataset(self, stage: RowStage, units: Sequence[Unit]) -> ray.data.Dataset:
        """The row stage's Dataset up to its sink: ReadCorpus -> MapBatches(<operator>) ..."""
        import ray.data

        from pipeline.ray_data.datasource import CorpusDatasource

        opts, compute = self._options(), self._compute()
        ds = ray.data.read_datasource(CorpusDatasource(units, measured(stage.read), stage.sizes),
                                      override_num_blocks=len(units), compute=compute, num_cpus=opts["num_cpus"],
                                      ray_remote_args={k: v for k, v in opts.items() if k != "num_cpus"})
        for op in stage.operators:
            ds = ds.map_batches(guarded(measured(op)), batch_size=None, batch_format="pyarrow", zero_copy_batch=True,
                                compute=compute, **opts)
        return ds

    def stream(self, stage: RowStage) -> ray.data.Dataset:
        """A user's Dataset through the stage's operators (its own operators run first, once)."""
        ds = stage.source
        for op in stage.operators:
            ds = ds.map_batches(guarded(measured(op)), batch_size=None, batch_format="pyarrow", zero_copy_batch=True,
                                compute=self._compute(), **self._options())
        return ds

    def rows(self, stage: RowStage, units: Sequence[Unit]) -> Iterator[Marker | UserError]:
        """One Ray Data execution: read, operators, sink. Markers are yielded as they are committed (the driver
        lists the stage's marker folder every few seconds, for the progress lines), then the sink's results."""
        if not units and stage.source is None:
            return
        from pipeline.ray_data.datasource import UnitsDatasink

        self._wait()
        ds = self.dataset(stage, units) if stage.source is None else self.stream(stage)
        sink = UnitsDatasink(stage.sink)
        failed: list[BaseException] = []

        def write() -> None:
            try:
                ds.write_datasink(sink, ray_remote_args=self._options())
            except BaseException as e:  # noqa: BLE001 - re-raised in the driver's thread
                failed.append(e)

        thread = threading.Thread(target=write, name=f"ray-data-{stage.name}", daemon=True)
        thread.start()
        work = stage.sink.ctx.work
        ep = stage.sink.ctx.endpoint_url
        wanted, seen = {u.uid for u in units}, set()
        while thread.is_alive():
            thread.join(POLL_S)
            for name in list_names(join(work, stage.name), ep):
                key = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else None
                if key in wanted and key not in seen:
                    seen.add(key)
                    yield stage.marker.from_json(read_bytes(join(work, stage.name, name), ep))
        if failed:
            raise failed[0]
        for m in sink.results:
            if isinstance(m, UserError) or stage.source is not None or m.key not in seen:
                yield m
        if log.isEnabledFor(logging.DEBUG):
            log.debug("Ray Data's statistics of the %s pass:\n%s", stage.name, ds.stats())
