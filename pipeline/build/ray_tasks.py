"""The other Ray adapter (``--engine tasks``): ``RayTasksExecutor`` runs the same steps as plain Ray tasks.

Same steps, same bytes as ``ray_data.RayDataExecutor`` (tested), without Ray Data: the driver keeps two tasks per
CPU in flight and blocks in ``ray.wait`` until one ends (the raylet starts the next the moment a CPU frees), where
Ray Data's streaming executor polls every 0.1 s and adds a per-task cost of its own (docs/benchmarks.md has both).
No progress bars, no per-operator statistics: the build's progress lines only. docs/scaling.md says when to pick
it. Bringing Ray up, the early worker processes and their warm-up: ``ray_cluster.py``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pipeline.build.markers import Marker
from pipeline.build.ray_cluster import RayCluster, raise_users, run_step


class RayTasksExecutor(RayCluster):
    def map(self, step: Callable[[Any], Marker], items: Sequence[Any]) -> Iterator[Marker]:
        """Run ``step`` on every item, one task each; the markers, in completion order."""
        import ray

        if not items:
            return
        self._wait()
        # Two tasks per CPU in flight when the cluster's CPUs are the cap: the second waits at the raylet, which
        # starts it the moment a CPU frees. On a cluster bigger than --num-cpus the window is the cap itself.
        cluster = self._cluster_cpus()
        window = 2 * cluster if self.width is None or cluster <= self.width else self.width
        task = ray.remote(run_step).options(**self._options())
        step_ref = ray.put(step)  # once per stage, not once per task
        todo = list(reversed(items))
        running: list = []
        try:
            while todo or running:
                while todo and len(running) < window:
                    running.append(task.remote(step_ref, todo.pop()))
                done, running = ray.wait(running, num_returns=1)  # blocks: no polling in the driver
                for out in ray.get(done):
                    yield raise_users(out)
        finally:
            for ref in running:  # a failed or abandoned stage stops its other tasks
                ray.cancel(ref)
