"""The Ray adapter: ``RayDataExecutor`` runs the build's steps through Ray Data, one work item per Ray Data task.

A stage is ``ray.data.from_items(work items)`` -> ``map_batches(step)`` (one block, one task per item) streamed
back to the driver, which only collects the small markers: Ray Data's streaming executor schedules the tasks over
every CPU of the cluster, retries a task whose worker or node died, shows its progress bars in a terminal and keeps
per-operator statistics. What Ray Data does not do stays in the steps: units cut at document boundaries, the
seeded pool, the sliced balanced shards, the markers that make a build resumable (``executor.run_stage``).

Fixed costs, and what this module does about them (docs/benchmarks.md has the figures):

- ``begin`` brings Ray up (attaching to RAY_ADDRESS, as ``ray job submit`` sets, or starting a local Ray) in a
  background thread while the driver lists and plans, then starts one worker process per CPU by handing each a
  task that imports what the steps use. Worker processes are the expensive part of a Ray start (a Python
  interpreter, Ray, Arrow, NumPy: about a second each): started early, they are ready when the first stage comes.
- ``warm(setup)`` loads the tokenizer into each of those processes (one task per CPU, not waited for); the
  stages' tasks then run in the same processes, whose caches (``work.cached``) hold the tokenizer and the pool for
  the rest of the build.
- Tasks rather than Ray Data's actor pools for steps with per-process state: an actor is a new process per stage
  (a second or more each, measured in docs/benchmarks.md), while the job's task workers live across stages; the
  per-process caches give what an actor's ``__init__`` would.

Never a hang for want of resources: ``--num-cpus`` below 1 is refused before Ray starts, and a cluster that has no
CPU for the build's one-CPU tasks is waited for a bounded time (an autoscaler may be adding nodes), then refused.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pipeline.build.markers import Marker
from pipeline.readers import InputError
from pipeline.storage import aws_env

log = logging.getLogger(__name__)

CPU_WAIT_S = 60.0  # how long a cluster without CPUs is given to get some (an autoscaler adding a node)


@dataclasses.dataclass(frozen=True)
class RayShared:
    """A handle to one object-store copy; ``get`` in a task reads it (zero-copy for numpy arrays)."""

    key: str
    ref: Any

    def get(self) -> Any:
        import ray

        return ray.get(self.ref)


def _prestart() -> int:
    """A worker's first task: import what the steps and Ray Data's tasks use, so a stage's first item does not."""
    import numpy  # noqa: F401
    import pyarrow.compute  # noqa: F401
    import ray.data  # noqa: F401

    import pipeline.build.instances  # noqa: F401
    import pipeline.build.shards  # noqa: F401
    import pipeline.sentences  # noqa: F401
    import pipeline.tokenize  # noqa: F401
    return os.getpid()


def _warm(setup: Callable[[], None], *_prestarted: int) -> int:
    setup()
    return os.getpid()


@dataclasses.dataclass(frozen=True)
class _UserError:
    """A user's mistake (a bad input, a bad value) raised by a step, carried back as the task's result: Ray Data
    would wrap it in a UserCodeException whose cause is lost on the way, and the user would get a stack trace
    instead of the one line that names the file and the fix."""

    error: BaseException


def _is_users(e: BaseException) -> bool:
    return isinstance(e, (InputError, ValueError)) and type(e).__module__.startswith(("pipeline", "builtins"))


def _apply(step: Callable[[Any], Marker], batch: dict) -> dict:
    """One Ray Data task: the step on the batch's item(s), the markers pickled (a marker is a small dataclass)."""
    out = []
    for b in batch["item"]:
        try:
            out.append(pickle.dumps(step(pickle.loads(b))))
        except (InputError, ValueError) as e:
            if not _is_users(e):
                raise
            out.append(pickle.dumps(_UserError(e)))
    return {"marker": out}


def check_num_cpus(num_cpus: int | None) -> None:
    if num_cpus is not None and num_cpus < 1:
        raise ValueError(f"--num-cpus {num_cpus}: every task of the build needs one CPU; use at least 1, or leave "
                         "it out to use every CPU of the cluster")


class RayDataExecutor:
    """Runs steps through Ray Data; ``num_cpus`` caps the concurrent tasks of every stage (None: as many as the
    cluster's CPUs, which is what an autoscaling cluster wants). ``bars``: Ray Data's progress bars (a terminal)
    instead of the build's progress lines."""

    def __init__(self, num_cpus: int | None = None, init: Callable[[], None] | None = None, bars: bool = False):
        check_num_cpus(num_cpus)
        self.width = num_cpus
        self.bars = bars
        self._init = init  # None: the caller's Ray (or a default ray.init())
        self._ready: concurrent.futures.Future | None = None
        self._owns_ray = False
        self._prestarted: list = []  # refs of the prestart tasks (their workers' pids)
        self._warming: list = []  # refs of the warm-up tasks; kept so that they are not cancelled

    # --- bringing Ray up

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
            self._owns_ray = not ray.is_initialized()  # a caller's Ray is the caller's to shut down
            if self._init is not None:
                self._init()
            elif not ray.is_initialized():
                ray.init()
            cpus = self._wait_for_cpus()
            # Worker processes first (the longest path of a small build: process, imports, tokenizer), then the
            # driver's own import of Ray Data while they start.
            remote = ray.remote(_prestart).options(**self._options())
            self._prestarted = [remote.remote() for _ in range(self._workers(cpus))]
            self._configure()
        except BaseException as e:  # noqa: BLE001 - handed to the stages, which re-raise it
            self._ready.set_exception(e)
            return
        self._ready.set_result(None)
        threading.Event().wait()  # never returns: see begin

    def _configure(self) -> None:
        import ray.data

        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = self.bars
        # Each execution is one map operator: reserving resources per operator (against starving a later one) only
        # holds CPUs back (16 tasks of 50 ms on 2 CPUs: 1.04 s with it, 0.72 s without; build_overheads.py).
        ctx.op_resource_reservation_enabled = False
        if not self.bars:
            # Ray Data announces every execution at INFO ("Starting execution of Dataset ...") and warns once that
            # its bars are off: in a log, the build's own progress lines say it per stage, with MB/s and ETA.
            logging.getLogger("ray.data").setLevel(logging.WARNING)
            logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)

    def _wait_for_cpus(self) -> int:
        import ray

        deadline = time.monotonic() + CPU_WAIT_S
        while (cpus := int(ray.cluster_resources().get("CPU", 0))) < 1:
            if time.monotonic() > deadline:
                raise ValueError(f"the Ray cluster has had no CPU for {CPU_WAIT_S:.0f} s, and every task of the "
                                 "build needs one: add worker nodes (or start the head with --num-cpus), or run "
                                 "without RAY_ADDRESS to start a local Ray")
            log.warning("the Ray cluster has no CPU yet (an autoscaler adding nodes?); waiting up to %.0f s",
                        deadline - time.monotonic())
            time.sleep(5)
        return cpus

    def _workers(self, cpus: int) -> int:
        return min(cpus, self.width or cpus)

    def _wait(self) -> None:
        ready, t0 = self.begin(), time.perf_counter()
        while True:  # no silent minute while a local Ray starts on a busy machine
            try:
                return ready.result(timeout=5.0)  # re-raises a failed start
            except concurrent.futures.TimeoutError:
                log.info("waiting for Ray to come up (%.0f s wall)", time.perf_counter() - t0)

    def _options(self) -> dict[str, Any]:
        # The same options for the warm-up tasks and the stages' tasks: Ray gives tasks with another runtime_env
        # other worker processes, which would miss the warm caches.
        opts: dict[str, Any] = {"num_cpus": 1}
        env = aws_env()  # workers do not inherit the driver's environment: hand them the AWS settings (never logged)
        if env:
            opts["runtime_env"] = {"env_vars": env}
        return opts

    # --- the Executor protocol

    def share(self, key: str, obj: Any) -> RayShared:
        import ray

        self._wait()
        return RayShared(key, ray.put(obj))

    def warm(self, setup: Callable[[], None]) -> None:
        import ray

        self._wait()
        remote = ray.remote(_warm).options(**self._options())
        # Each warm-up task waits for every prestart task: then all the workers are up and idle at once, and the
        # warm-up tasks (each busy for the tokenizer's load) land one per worker instead of queueing on the first
        # worker that finished its imports.
        self._warming += [remote.remote(setup, *self._prestarted) for _ in self._prestarted]

    def end(self) -> None:
        """Disconnect from Ray (stopping a local Ray this process started) now, if ``begin`` brought it up; a Ray the
        caller had initialised stays."""
        import ray

        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    def map(self, step: Callable[[Any], Marker], items: Sequence[Any]) -> Iterator[Marker]:
        """Run ``step`` on every item, one Ray Data task each; the markers, in completion order."""
        import ray.data

        if not items:
            return
        self._wait()
        ds = ray.data.from_items([{"item": pickle.dumps(item)} for item in items], override_num_blocks=len(items))
        ds = ds.map_batches(functools.partial(_apply, step), batch_size=None, zero_copy_batch=True,
                            compute=ray.data.TaskPoolStrategy(size=min(self.width, len(items)) if self.width else None),
                            **self._options())
        batches = iter(ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=0))
        try:
            for batch in batches:
                for b in batch["marker"]:
                    out = pickle.loads(b)
                    if isinstance(out, _UserError):
                        raise out.error
                    yield out
        finally:
            batches.close()  # a failed or abandoned stage stops its tasks now, not when garbage-collected
        if log.isEnabledFor(logging.DEBUG):
            log.debug("Ray Data's statistics of the stage:\n%s", ds.stats())
