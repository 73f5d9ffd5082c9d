"""``RayDataExecutor``: the build's stages on Ray Data (the package's docstring says how)."""
from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from corpus.readers import Unit
from pipeline.markers import Marker
from pipeline.ray_data.cluster import RayCluster, RayShared, run_step
from pipeline.ray_data.guard import guarded, in_worker
from pipeline.rows import RowStage, UserError, measured

if TYPE_CHECKING:  # for the annotations only
    import ray.data

# Ray and Ray Data are imported where they are used: by the thread that brings Ray up, once it is up (a second of
# imports then overlaps the driver's planning and Ray's own start, instead of coming before both).

log = logging.getLogger(__name__)


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

        from pipeline.ray_data.datasource import CorpusDatasource, units_per_task

        opts, compute = self._options(), self._compute()
        per_task = units_per_task(len(units), self.width or self._cluster_cpus())
        ds = ray.data.read_datasource(CorpusDatasource(units, measured(stage.read), stage.sizes, per_task),
                                      override_num_blocks=-(-len(units) // per_task), compute=compute,
                                      num_cpus=opts["num_cpus"],
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
        """One Ray Data execution: read, operators, sink. Each write task's markers are yielded as the task ends
        (Ray hands its return value to the driver): the driver never lists a folder of markers while a pass runs,
        so waiting for 250,000 units costs what waiting for 100 does (benchmarks/build_driver_scale.py)."""
        if not units and stage.source is None:
            return
        from pipeline.ray_data.datasource import UnitsDatasink

        self._wait()
        ds = self.dataset(stage, units) if stage.source is None else self.stream(stage)
        yield from write_streaming(ds, UnitsDatasink(stage.sink, by_unit=stage.source is None), self._options())


def write_streaming(ds: ray.data.Dataset, sink: Any, remote_args: dict[str, Any]) -> Iterator[Any]:
    """``ds.write_datasink(sink, ray_remote_args=remote_args)`` as Ray Data 2.60 runs it (the same ``Write`` operator,
    fused after the pass's operators, the same ``on_write_complete`` and the same "Data sink ... finished" line in
    Ray Data's log), but each write task's returns are yielded as the task ends instead of after the last one:
    ``write_datasink`` materialises the whole execution first. Ray is pinned below 2.61 (pyproject.toml), which
    these internals are read from; ``tests/pipeline/test_ray_build.py`` holds the operators' names and the line."""
    import ray
    from ray.data import Dataset
    from ray.data._internal.logical.interfaces import LogicalPlan
    from ray.data._internal.logical.operators import Write
    from ray.data.datasource.datasink import WriteResult, _gen_datasink_write_result

    out = Dataset._from_parent(ds, LogicalPlan(
        Write(sink, input_dependencies=[ds._logical_plan.dag], ray_remote_args=remote_args), ds.context))
    results: list[WriteResult] = []
    bundles, _, executor = out._execute_to_iterator()
    done = False
    try:
        for bundle in bundles:
            result = _gen_datasink_write_result(ray.get(bundle.block_refs))
            results.append(WriteResult(result.num_rows, result.size_bytes, []))  # the returns are handed on, not kept
            for returned in result.write_returns:  # a task's markers, pickled by the sink (see _Items)
                for b in returned:
                    yield pickle.loads(b)
        done = True
        total = WriteResult.combine(*results)
        logging.getLogger("ray.data.dataset").info("Data sink %s finished. %d rows and %s data written.",
                                                   sink.get_name(), total.num_rows, _size(total.size_bytes))
        sink.on_write_complete(total)
    except Exception as e:
        sink.on_write_failed(e)
        raise
    finally:
        if not done:  # a failed or abandoned pass stops its tasks now, not when garbage-collected
            getattr(bundles, "close", lambda: None)()
            if executor is not None:
                executor.shutdown(force=True)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("Ray Data's statistics of the pass:\n%s", out.stats())


def _size(n: int) -> str:
    from ray.data._internal.execution.util import memory_string

    return memory_string(n)
