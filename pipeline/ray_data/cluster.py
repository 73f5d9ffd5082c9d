"""The Ray side of the build's executor: bringing Ray up early, the worker processes started and warmed ahead of the
stages, the vocabulary in the object store, users' errors carried back as values, and never a hang for CPUs.

- ``begin`` brings Ray up (``init``: ``cluster.ray_start.init_ray`` attaches to RAY_ADDRESS, as ``ray job
  submit`` sets, or starts a local Ray capped at ``--num-cpus``) in a background thread while the driver lists and
  plans.
- ``warm(setup, items)`` starts the worker processes the stages will use (one per CPU, fewer when no stage has that
  many items) by handing each a task that imports what the steps use and runs ``setup`` (loads the tokenizer),
  while the driver goes on planning; a stage's first execution waits for them to end, so that its tasks take the
  warmed processes instead of starting more (a one-unit build runs in one worker process). Worker processes are the
  expensive part of a job on Ray (an interpreter, Ray, Arrow, NumPy, the tokenizer: a second or more each, see
  docs/benchmarks.md); started as soon as the driver knows its units, they are ready when the first stage comes,
  and the stages' tasks run in them (Ray reuses a job's task workers), whose caches (``work.cached``) keep the
  tokenizer for the rest of the build.
- ``share`` puts a large read-only object (the vocabulary) in the object store once.
- ``--num-cpus`` below 1 is refused before Ray starts, and a cluster without a CPU for the build's one-CPU tasks is
  waited for a bounded time (an autoscaler may be adding nodes), then refused: a clear error, never a hang.
- ``end`` disconnects (and stops a local Ray this process started) when the build is over: sooner than Ray's own
  exit handler.
"""
from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from corpus.readers import InputError
from pipeline.markers import Marker
from pipeline.ray_data.guard import in_worker
from pipeline.rows import UserError, users_mistake
from storage.redact import redact_text

log = logging.getLogger(__name__)

CPU_WAIT_S = 60.0  # how long a cluster without CPUs is given to get some (an autoscaler adding a node)


@dataclasses.dataclass(frozen=True)
class RayShared:
    """A handle to one object-store copy; ``get`` in a task reads it (zero-copy for numpy arrays)."""

    key: str
    """Names the object (``eval_index:<digest>``, ``drop_set:<build id>``, ...): per-process caches are keyed by it."""
    ref: Any
    """The Ray ObjectRef of the object-store copy."""

    def get(self) -> Any:
        import ray

        return ray.get(self.ref)


def run_step(step: Callable[[Any], Marker], item: Any) -> Marker | UserError:
    """A step in a worker, a user's mistake returned as a value (``rows.UserError`` says why)."""
    try:
        return in_worker(step, item)
    except (InputError, ValueError) as e:
        if not users_mistake(e):
            raise
        return UserError(type(e).__name__ if isinstance(e, InputError) else "ValueError", redact_text(str(e)))


def _warm(setup: Callable[[], None]) -> int:
    """A worker's first task: import what the steps and Ray Data's tasks use, load the per-process state."""
    import numpy  # noqa: F401
    import pyarrow.compute  # noqa: F401
    import ray.data  # noqa: F401

    import corpus.sentences  # noqa: F401
    import corpus.tokenize  # noqa: F401
    import pipeline.instances  # noqa: F401
    import pipeline.shards  # noqa: F401
    setup()
    return os.getpid()


def check_num_cpus(num_cpus: int | None) -> None:
    if num_cpus is not None and num_cpus < 1:
        raise ValueError(f"--num-cpus {num_cpus}: every task of the build needs one CPU; use at least 1, or leave "
                         "it out to use every CPU of the cluster")


class RayCluster(abc.ABC):
    """The Ray side of an executor; subclasses give ``map``. ``num_cpus`` caps the concurrent tasks of every stage
    (None: as many as the cluster's CPUs, which is what an autoscaling cluster wants)."""

    bars = False
    in_process = False

    def __init__(self, num_cpus: int | None = None, init: Callable[[], None] | None = None):
        check_num_cpus(num_cpus)
        self.width = num_cpus
        self._init = init  # None: the caller's Ray (or a default ray.init())
        self._ready: concurrent.futures.Future | None = None  # Ray is up: the cluster's CPUs
        self._configured: concurrent.futures.Future = concurrent.futures.Future()  # the driver's set-up is done
        self._owns_ray = False
        self._warming: list = []  # refs of the warm-up tasks (their workers' pids); kept so they are not cancelled

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
            log.info("Ray is up with %d CPUs", cpus)
            self._ready.set_result(cpus)
            # The driver's own set-up after: the worker processes (``warm``), the longest path of a small build,
            # can be started in the meantime.
            self._configure()
        except BaseException as e:  # noqa: BLE001 - handed to the stages, which re-raise it
            for f in (self._ready, self._configured):
                if not f.done():
                    f.set_exception(e)
            return
        self._configured.set_result(None)
        threading.Event().wait()  # never returns: see begin

    def _configure(self) -> None:  # noqa: B027 - an optional hook: a subclass without set-up needs nothing here
        """The driver's set-up once Ray is up (subclasses)."""

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

    def _wait(self, configured: bool = True) -> int:
        """The cluster's CPUs once Ray is up (and, by default, the driver's set-up done)."""
        cpus, t0 = self.begin(), time.perf_counter()
        for f in (cpus, self._configured) if configured else (cpus,):
            while True:  # no silent minute while a local Ray starts on a busy machine
                try:
                    f.result(timeout=5.0)  # re-raises a failed start
                    break
                except concurrent.futures.TimeoutError:
                    log.info("waiting for Ray to come up (%.0f s wall)", time.perf_counter() - t0)
        if configured and self._warming:
            self._warmed()
        return cpus.result()

    def _warmed(self) -> None:
        """Wait until the warm-up tasks are done, before a stage's first task: each frees its worker process for
        the stage's tasks. Not waited for, a stage with fewer items than CPUs starts its tasks on the CPUs the
        warm-up does not hold, in new worker processes (a one-unit build then started two on a 2-core box, each an
        interpreter, Ray, Arrow and the tokenizer); a stage with more items could not start before they ended."""
        import ray

        ray.wait(self._warming, num_returns=len(self._warming))  # a failed warm-up: the stage's task says why
        self._warming = []

    def _cluster_cpus(self) -> int:
        """The cluster's CPUs now (an autoscaling cluster's count changes between stages)."""
        import ray

        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def _options(self) -> dict[str, Any]:
        # The same options for the warm-up tasks and the stages' tasks: Ray gives tasks with another runtime_env
        # other worker processes, which would miss the warm caches.
        # No runtime_env env vars: Ray writes them to runtime_env_agent.log and serves them on its dashboard.
        # Credentials reach the workers as the cluster provides them (a local Ray inherits this process's environment;
        # cluster.ray_start).
        return {"num_cpus": 1}

    # --- the Executor protocol

    def share(self, key: str, obj: Any) -> RayShared:
        import ray

        self._wait(configured=False)
        return RayShared(key, ray.put(obj))

    def warm(self, setup: Callable[[], None], items: int) -> None:
        import ray

        cpus = self._wait(configured=False)
        remote = ray.remote(_warm).options(**self._options())
        # All at once, each busy for a second or more: Ray gives every one its own worker process (idle ones first).
        self._warming += [remote.remote(setup) for _ in range(max(1, min(cpus, self.width or cpus, items)))]

    def end(self) -> None:
        """Disconnect from Ray (stopping a local Ray this process started) now, if ``begin`` brought it up; a Ray the
        caller had initialised stays."""
        import ray

        if self._owns_ray and ray.is_initialized():
            # Reference cycles holding Ray objects (Ray Data's plans and their ObjectRefs) are freed now, while Ray is
            # up: freed after the shutdown, by a collection in whichever thread allocates then (the job's MLflow
            # writer, drawing the report meanwhile), an ObjectRef reaches the shut-down core worker, which ends the
            # process with exit code 1. No automatic collection starts in another thread until Ray is down.
            t0 = time.perf_counter()
            gc.disable()
            try:
                gc.collect()
                ray.shutdown()
            finally:
                gc.enable()
            log.debug("Ray shut down in %.2f s", time.perf_counter() - t0)

    @abc.abstractmethod
    def map(self, step: Callable[[Any], Marker], items: Sequence[Any]) -> Iterator[Marker | UserError]:
        """Run ``step`` on every item on the cluster; the markers, in completion order."""
