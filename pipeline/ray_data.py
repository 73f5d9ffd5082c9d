"""The one Ray adapter: ``RayDataExecutor.map(step, items)`` runs any build step as Ray Data tasks.

    from_items(pickled items, one per block) -> map_batches(step) [tasks, one CPU each] -> markers

Every stage is the same kind of pipeline: one map of tasks over in-memory items, each task running the step on one
item and committing its output to storage, its small marker coming back. No actor pools: nothing holds a CPU while
waiting on another stage (the 2-CPU hang of NOTES-stack.md cannot happen), and ``num_cpus`` caps the parallelism.

Ray as a distributed engine: ``init`` (``jobs/_common.init_ray``) attaches to a running cluster (RAY_ADDRESS, as
``ray job submit`` sets, or a Ray already initialised) or starts a local one capped at ``--num-cpus``; ``begin``
starts that in a background thread while the driver plans. Before the first stage, one warm-up task per CPU
imports the step modules and runs the step's ``setup`` (the WordPiece encoder), so every worker is warm when the
heavy stage starts. Large shared objects (the vocabulary) go to the object store once (``share``); steps cache
what they build from them per worker process. The driver never runs a step: it reads no corpus bytes.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import pickle
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.markers import Marker
from pipeline.readers import InputError
from pipeline.storage import aws_env

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RayShared:
    """A handle to one object-store copy; ``get`` in a task reads it (zero-copy for numpy arrays)."""

    key: str
    ref: Any

    def get(self) -> Any:
        import ray

        return ray.get(self.ref)


def _apply(batch: dict[str, Any], step: Callable[[Any], Marker]) -> dict[str, list]:
    return {"marker": [pickle.dumps(step(pickle.loads(item))) for item in batch["item"]]}


def _setup(step: Callable[[Any], Marker]) -> int:
    """A warm-up task: import what the steps use and load the step's per-process state."""
    import os

    import pipeline.steps  # noqa: F401
    setup = getattr(step, "setup", None)
    if setup is not None:
        setup()
    return os.getpid()


def _unwrap(e: BaseException) -> BaseException | None:
    """The user's error inside Ray's wrappers (RayTaskError, UserCodeException), so the message stays clear."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (InputError, ValueError)) and type(e).__module__.startswith(("pipeline", "builtins")):
            return e
        e = getattr(e, "cause", None) or e.__cause__
    return None


class RayDataExecutor:
    """Runs steps on Ray Data; ``num_cpus`` caps the concurrent tasks of every stage (None: as many as the
    cluster's CPUs allow, which is what an autoscaling cluster wants)."""

    def __init__(self, num_cpus: int | None = None, init: Callable[[], None] | None = None):
        self.width = int(num_cpus) if num_cpus else None
        self._init = init  # None: the caller's Ray (or, as Ray Data does, a default ray.init())
        self._ready: concurrent.futures.Future | None = None
        self._queue = self.width  # tasks in flight per stage (see _bring_up)
        self._cpus = 1
        self._warm = False

    def begin(self) -> concurrent.futures.Future:
        """Start (once) bringing Ray up in a background thread; the future is done when the stages can run.

        The thread then stays alive (a daemon, idle) for the life of the process: Ray ties the processes it
        starts (GCS, raylet) to the *thread* that started them (parent-death signal), so they must not see it exit.
        """
        if self._ready is None:
            self._ready = concurrent.futures.Future()
            threading.Thread(target=self._bring_up, name="ray-start", daemon=True).start()
        return self._ready

    def _bring_up(self) -> None:
        import ray

        try:
            if self._init is not None:
                self._init()
            elif not ray.is_initialized():
                ray.init()  # what Ray Data itself does when used without ray.init()
            cluster_cpus = int(ray.cluster_resources().get("CPU", 1))
            self._cpus = min(cluster_cpus, self.width or cluster_cpus)
            # Ray Data notices a finished task up to 0.1 s late (its executor's ray.wait timeout) and only then
            # submits the next, and on a small machine whose CPUs all run tasks its loop also waits for a CPU. When
            # the cluster's own CPUs enforce the cap (a local Ray started with --num-cpus), a second task per CPU
            # waits at the raylet instead, which starts it the moment a CPU frees (40 tasks of ~0.4 s on 2 CPUs:
            # 1.27x -> 1.73x parallelism). On a bigger cluster the cap stays the number of tasks in flight.
            if self.width and cluster_cpus <= self.width:
                self._queue = 2 * self.width
        except BaseException as e:  # noqa: BLE001 - handed to the stages, which re-raise it
            self._ready.set_exception(e)
            return
        self._ready.set_result(None)
        threading.Event().wait()  # never returns: see begin

    def _wait(self) -> None:
        self.begin().result()  # re-raises a failed start

    def _runtime_env(self) -> dict[str, Any]:
        # Workers do not inherit the driver's environment: hand them the AWS settings (never logged).
        env = aws_env()
        return {"runtime_env": {"env_vars": env}} if env else {}

    def share(self, key: str, obj: Any) -> RayShared:
        import ray

        self._wait()
        return RayShared(key, ray.put(obj))

    def _warm_up(self, step: Callable[[Any], Marker]) -> None:
        """One task per CPU at once, so each lands in its own worker process: all of them import the steps and
        load the tokenizer before the first heavy task, instead of the first task on each paying for it."""
        import ray

        task = ray.remote(_setup).options(num_cpus=1, **self._runtime_env())
        pids = ray.get([task.remote(step) for _ in range(self._cpus)])
        log.info("warmed %d Ray worker processes", len(set(pids)))

    def map(self, step: Callable[[Any], Marker], items: Sequence[Any]) -> list[Marker]:
        """Run ``step`` on every item (one item per block and task); the markers, in any order."""
        import ray

        if not items:
            return []
        self._wait()
        if not self._warm:
            self._warm_up(step)
            self._warm = True
        # Ray Data reserves half of the cluster's resources per operator by default, so that a chain of operators
        # cannot starve its later stages. Our pipelines are one map over in-memory items: the reservation only
        # leaves CPUs idle (on 2 CPUs, 16 one-CPU tasks of 0.2 s took 4.1 s with it, 1.8 s without:
        # benchmarks/build_overheads.py).
        data_ctx = ray.data.DataContext.get_current()
        saved, data_ctx.op_resource_reservation_enabled = data_ctx.op_resource_reservation_enabled, False
        try:
            size = min(self._queue, len(items)) if self._queue else None  # a cap above the task count warns
            ds = ray.data.from_items([{"item": pickle.dumps(it)} for it in items],
                                     override_num_blocks=len(items)).map_batches(
                _apply, batch_size=1, fn_kwargs={"step": step}, num_cpus=1,
                compute=ray.data.TaskPoolStrategy(size=size), **self._runtime_env())
            markers = [pickle.loads(r["marker"]) for r in ds.iter_rows()]
            if log.isEnabledFor(logging.DEBUG):
                log.debug("Ray Data stats:\n%s", ds.stats())
            return markers
        except Exception as e:  # noqa: BLE001 - re-raised below, unwrapped when it is the user's error
            inner = _unwrap(e)
            if inner is not None and inner is not e:
                raise type(inner)(str(inner)) from e
            raise
        finally:
            data_ctx.op_resource_reservation_enabled = saved
