"""The fixed costs behind the data build's engine choices, each against its alternative in one run.

    python benchmarks/build_overheads.py [--cpus 2] [--items 16]

On one local Ray (``--cpus`` CPUs), after its start-up (reported):

1. A stage of ``--items`` trivial items (each sleeps 50 ms, the work a CPU would do) four ways: as Ray Data tasks
   (``from_items`` -> ``map_batches``: what ``pipeline.ray_data`` does, per-operator resource reservation
   off as there), the same with Ray Data's default reservation on, as plain Ray tasks (what
   ``pipeline.ray_tasks`` does), and through a Ray Data actor pool (``ActorPoolStrategy``, the alternative
   for per-process state). Each is run three times in a row: the first run pays the one-time costs (Ray Data's
   detached actors, worker processes), the others show the per-stage cost. Ideal wall: items x 0.05 s / CPUs.
2. Whether the stages' task workers live on across stages: the worker pids of consecutive stages (tasks) and how
   many new processes an actor pool starts per stage.
3. ``import ray.data`` in a fresh interpreter (the driver pays it once per job).
"""
from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def _sleep_batch(batch):
    time.sleep(0.05)
    return {"pid": [os.getpid()] * len(batch["item"])}


class _SleepActor:
    def __call__(self, batch):
        return _sleep_batch(batch)


def _sleep_task(_):
    time.sleep(0.05)
    return os.getpid()


def data_stage(items: int, cpus: int, actors: bool, reserve: bool = False) -> tuple[float, set[int]]:
    import ray.data

    ray.data.DataContext.get_current().op_resource_reservation_enabled = reserve
    ds = ray.data.from_items([{"item": pickle.dumps(i)} for i in range(items)], override_num_blocks=items)
    if actors:
        ds = ds.map_batches(_SleepActor, batch_size=None, num_cpus=1,
                            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=cpus))
    else:
        ds = ds.map_batches(_sleep_batch, batch_size=None, num_cpus=1,
                            compute=ray.data.TaskPoolStrategy(size=min(cpus, items)))
    t = time.perf_counter()
    pids = {int(p) for b in ds.iter_batches(batch_size=None, prefetch_batches=0) for p in b["pid"]}
    return time.perf_counter() - t, pids


def task_stage(items: int) -> tuple[float, set[int]]:
    import ray

    remote = ray.remote(_sleep_task).options(num_cpus=1)
    t = time.perf_counter()
    pids = set(ray.get([remote.remote(i) for i in range(items)]))
    return time.perf_counter() - t, pids


def import_seconds() -> float:
    code = "import time; t = time.perf_counter(); import ray.data; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--items", type=int, default=16)
    args = ap.parse_args()
    print(f"import ray.data in a fresh interpreter: {import_seconds():.2f} s")
    import ray
    import ray.data

    t = time.perf_counter()
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    print(f"local Ray start ({args.cpus} CPUs): {time.perf_counter() - t:.2f} s")
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ideal = args.items * 0.05 / args.cpus
    print(f"a stage of {args.items} items of 0.05 s on {args.cpus} CPUs (ideal {ideal:.2f} s wall):")
    seen: dict[str, set[int]] = {}
    for name, stage in (("Ray Data tasks", lambda: data_stage(args.items, args.cpus, False)),
                        ("... reservation on", lambda: data_stage(args.items, args.cpus, False, True)),
                        ("plain Ray tasks", lambda: task_stage(args.items)),
                        ("Ray Data actor pool", lambda: data_stage(args.items, args.cpus, True))):
        walls, pids = [], []
        for _ in range(3):
            w, p = stage()
            walls.append(w)
            pids.append(p)
        new = [len(p - set().union(*seen.values(), *pids[:i])) for i, p in enumerate(pids)]
        seen[name] = set().union(*pids)
        print(f"  {name:20s} wall {walls[0]:.2f} / {walls[1]:.2f} / {walls[2]:.2f} s (first / second / third run); "
              f"overhead over ideal at the third {walls[2] - ideal:+.2f} s; new worker processes per run {new}")
    ray.shutdown()


if __name__ == "__main__":
    main()
