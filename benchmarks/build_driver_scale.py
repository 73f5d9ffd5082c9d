"""The build's driver at 1 TB: its CPU and memory per unit, traced on a planned build of up to 250,000 units.

    python benchmarks/build_driver_scale.py                          # 100, 2,500, 25,000 and 250,000 units
    python benchmarks/build_driver_scale.py --units 100,10000        # a quicker look

No terabyte is needed: the inputs are sparse files (``truncate``: their size on disk is 0) of plain text, 1,000
units of 4 MiB each (the default ``unit_bytes``), so the driver lists them, plans every unit and every shard, and
walks every stage exactly as for a real 1 TB corpus. Only the steps do not run: a replaying executor answers each
unit (and each shard, the pool) with the marker a real build gave for one unit of real text (a build of
data/sample's Moby Dick run first, in the same process), renamed to the item it answers. What the driver does with
the markers (the progress lines, the stages' hooks, the shards' plan, the manifest's sums) is the real code.

Each size runs in a fresh process; per size it prints the driver's CPU-seconds (user + system, this process only:
what the harness spends making the markers is measured and taken out), its peak RSS over the Python start-up's, the
LIST calls of the build's folders and the GETs of marker files the driver made, and, between two sizes, the cost per
unit: (CPU(N2) - CPU(N1)) / (N2 - N1) and (RSS(N2) - RSS(N1)) / (N2 - N1). The issue's targets: <= 2 ms of driver
CPU per unit, memory O(files + shards) (a fixed few hundred bytes per unit at most), and the same LIST calls at
250,000 units as at 100 (waiting for a unit costs what it costs at any size).

``--ray-tasks N`` adds, on a local Ray, what Ray Data's own streaming executor costs the driver per task (N trivial
tasks through ``from_items -> map_batches``, the driver's CPU divided by N): the part of a real unit's driver cost
that is Ray Data's, not ours.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SAMPLE = REPO / "data" / "sample"
UNIT = 4 << 20  # BuildConfig.unit_bytes' default
UNITS_PER_FILE = 1000


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Replay:
    """An executor that runs no step: each item or unit is answered with the template marker of its stage, with the
    fields it shares with the item (``uid``, ``path``, ``index``, ...) taken from the item. ``spent`` is its own CPU."""

    bars = False
    in_process = True

    def __init__(self, templates: dict[str, object]):
        self.templates, self.spent = templates, 0.0

    def begin(self) -> None:
        pass

    def share(self, key, obj):
        from pipeline.executor import LocalShared

        return LocalShared(key, obj)

    def warm(self, setup, items) -> None:
        pass

    def share_result(self, key, fn):
        from pipeline.executor import LocalShared

        return LocalShared(key, None)  # the pool itself: only the steps (not run here) would read it

    def _answer(self, stage: str, item):
        t = time.thread_time()
        tpl = self.templates[stage]
        names = {f.name for f in dataclasses.fields(tpl)} & (
            {f.name for f in dataclasses.fields(item)} if dataclasses.is_dataclass(item) else set())
        m = dataclasses.replace(tpl, **{n: getattr(item, n) for n in names})
        if hasattr(item, "slices"):  # a shard: the rows its plan gives it, under its own name
            m = dataclasses.replace(m, rows=sum(hi - lo for *_, lo, hi in item.slices),
                                    file=m.file.replace("-00000-of-00001", f"-{item.index:05d}-of-{item.count:05d}"))
        data = pickle.dumps(m)  # what a worker does; the driver's unpickling (below) is the driver's, as on Ray
        self.spent += time.thread_time() - t
        return pickle.loads(data)

    def map(self, step, items):
        # a stage's step and its marker type live in the stage's file (pipeline/pool.py, pipeline/shards.py)
        stage = next(s for s, m in self.templates.items() if type(m).__module__ == type(step).__module__)
        for item in items:
            yield self._answer(stage, item)

    def rows(self, stage, units):
        for u in units:
            yield self._answer(stage.name, u)

    def end(self) -> None:
        pass


def _cfg(inputs, output, **kw):
    from corpus.create_instances import InstanceConfig
    from pipeline import BuildConfig

    return BuildConfig(inputs=tuple(inputs), output=str(output), vocab=str(SAMPLE / "reference" /
                       "bert-base-uncased-vocab.txt"), dupe_factor=5,
                       instances=InstanceConfig(max_seq_length=128, max_predictions_per_seq=20), **kw)


def templates(root: Path, nbytes: int = UNIT - 1) -> dict[str, object]:
    """Each stage's marker for one unit of real text: Moby Dick (data/sample, ~1.2 MB), up to ``nbytes``."""
    from pipeline import build
    from pipeline.executor import LocalExecutor

    got: dict[str, object] = {}
    text = root / "one-unit.txt"
    import gzip

    with gzip.open(SAMPLE / "corpus" / "mobydick.jsonl.gz", "rt") as f:
        docs = [json.loads(line)["text"] for line in f]
    text.write_text("\n\n".join(docs)[:nbytes])
    build(_cfg([str(text)], root / "one-unit-out", num_shards=1), LocalExecutor(),
          on_stage=lambda name, markers, *a: markers and got.setdefault(name, markers[0]))
    return got


def one_size(units: int) -> dict:
    """The driver's build of ``units`` sparse units; what it cost (run in a fresh process)."""
    import fsspec.implementations.local as local

    from pipeline import build

    lists: dict[str, int] = {}
    gets = [0]
    ls, cat = local.LocalFileSystem.ls, local.LocalFileSystem.cat_file

    def counting_ls(self, path, *a, **kw):
        key = os.path.basename(str(path).rstrip("/"))
        lists[key] = lists.get(key, 0) + 1
        return ls(self, path, *a, **kw)

    def counting_cat(self, path, *a, **kw):
        gets[0] += str(path).endswith(".done.json")
        return cat(self, path, *a, **kw)

    with tempfile.TemporaryDirectory(prefix="driver-scale-") as d:
        root = Path(d)
        tpl = pickle.loads(Path(os.environ["DRIVER_SCALE_TEMPLATES"]).read_bytes())
        files, left = [], units
        while left:
            n = min(left, UNITS_PER_FILE)
            p = root / "corpus" / f"part-{len(files):05d}.txt"
            p.parent.mkdir(exist_ok=True)
            with open(p, "wb") as f:
                f.truncate(n * UNIT)  # sparse: no disk, no bytes read
            files.append(str(p))
            left -= n
        local.LocalFileSystem.ls, local.LocalFileSystem.cat_file = counting_ls, counting_cat
        replay = Replay(tpl)
        rss0, cpu0, t0 = _rss_mb(), _cpu(), time.perf_counter()
        # --num-shards as the default would plan it for 1 TB: ~tokens / 400 MB-ish shards (fixed here: 256)
        m = build(_cfg(files, root / "out", num_shards=min(256, max(1, units // 1000))), replay)
        wall, cpu = time.perf_counter() - t0, _cpu() - cpu0 - replay.spent
        local.LocalFileSystem.ls, local.LocalFileSystem.cat_file = ls, cat
        return {"units": units, "files": len(files), "shards": len(m.shards), "instances": m.totals.instances,
                "driver_cpu_s": cpu, "harness_cpu_s": replay.spent, "wall_s": wall,
                "peak_rss_mb": _rss_mb(), "rss_before_mb": rss0, "lists": lists, "marker_gets": gets[0]}


def ray_task_cost(n: int) -> dict:
    """The driver's CPU per task of a Ray Data execution of ``n`` trivial tasks (Ray Data's own bookkeeping)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    import ray.data

    tmp = tempfile.mkdtemp(prefix="rd", dir="/tmp")  # short: Ray's socket paths are limited to ~107 bytes
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=tmp)
    ray.data.DataContext.get_current().enable_progress_bars = False
    out = {}
    for k in (2, n // 10, n):  # the first pays Ray Data's start-up (its actors, imports): not counted
        ds = ray.data.from_items([{"i": i} for i in range(k)], override_num_blocks=k)
        ds = ds.map_batches(lambda b: b, batch_size=None, compute=ray.data.TaskPoolStrategy(), num_cpus=1)
        c0, t0 = _cpu(), time.perf_counter()
        rows = sum(len(b["i"]) for b in ds.iter_batches(batch_size=None, prefetch_batches=0))
        out[k] = (_cpu() - c0, time.perf_counter() - t0, rows)
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    (k1, (c1, w1, _)), (k2, (c2, w2, _)) = sorted(out.items())[-2:]
    return {"tasks": [k1, k2], "driver_cpu_s": [c1, c2], "wall_s": [w1, w2],
            "driver_ms_per_task": 1000 * (c2 - c1) / (k2 - k1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", default="100,2500,25000,250000")
    ap.add_argument("--ray-tasks", type=int, default=0, help="also Ray Data's own driver cost per task (N tasks)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process: one size, JSON out
    ap.add_argument("--ray-one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--templates", help=argparse.SUPPRESS)
    ap.add_argument("--template-bytes", type=int, default=UNIT - 1,
                    help="bytes of Moby Dick in the real one-unit build whose markers answer every unit")
    args = ap.parse_args()
    if args.templates is not None:  # a child process: the markers of a real one-unit build, pickled
        with tempfile.TemporaryDirectory(prefix="driver-scale-tpl-") as d:
            Path(args.templates).write_bytes(pickle.dumps(templates(Path(d), args.template_bytes)))
        return
    if args.one is not None:
        print(json.dumps(one_size(args.one)))
        return
    if args.ray_one is not None:
        print(json.dumps(ray_task_cost(args.ray_one)))
        return
    load = os.getloadavg()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load average "
          f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min) at the start")
    runs = []
    tpl = tempfile.NamedTemporaryFile(prefix="driver-scale-", suffix=".pickle", delete=False).name
    subprocess.run([sys.executable, __file__, "--templates", tpl, "--template-bytes", str(args.template_bytes)],
                   check=True, capture_output=True, cwd=REPO)
    # A driver stalled for a minute (a loaded box) loses its output's lease and stops (storage/lease.py): this
    # benchmark measures the driver's CPU and memory, not the lease, so its builds get an hour.
    env = os.environ | {"DRIVER_SCALE_TEMPLATES": tpl, "BERT_LEASE_STALE_SECONDS": "3600"}
    for n in (int(x) for x in args.units.split(",")):
        p = subprocess.run([sys.executable, __file__, "--one", str(n)], capture_output=True, text=True, cwd=REPO,
                           env=env)
        if p.returncode:
            os.unlink(tpl)
            raise SystemExit(f"{n} units failed:\n{p.stderr[-4000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        runs.append(r)
        work_lists = {k: v for k, v in r["lists"].items() if k in ("read", "instances", "shards", "pool", "pieces")}
        print(f"{n:>8,} units ({r['files']} files, {r['shards']} shards): driver {r['driver_cpu_s']:7.2f} CPU-s "
              f"({1000 * r['driver_cpu_s'] / n:.3f} ms per unit), wall {r['wall_s']:6.1f} s, peak RSS "
              f"{r['peak_rss_mb']:7.1f} MB ({r['rss_before_mb']:.1f} before the build); LISTs of the marker folders "
              f"{work_lists}, of any folder "
              f"{sum(r['lists'].values())}; marker GETs {r['marker_gets']}")
    os.unlink(tpl)
    for a, b in zip(runs, runs[1:], strict=False):
        du = b["units"] - a["units"]
        print(f"  {a['units']:,} -> {b['units']:,} units: {1000 * (b['driver_cpu_s'] - a['driver_cpu_s']) / du:.3f} "
              f"ms of driver CPU per unit, {(b['peak_rss_mb'] - a['peak_rss_mb']) * 2**20 / du:.0f} "
              "bytes of peak RSS per unit")
    first, last = runs[0], runs[-1]
    per_unit = (last["driver_cpu_s"] - first["driver_cpu_s"]) / (last["units"] - first["units"])
    same_lists = {k: v for k, v in first["lists"].items()} == {k: v for k, v in last["lists"].items()}
    print(f"driver CPU per unit {1000 * per_unit:.3f} ms (target <= 2 ms): {'met' if per_unit <= 0.002 else 'NOT met'};"
          f" LIST calls at {last['units']:,} units the same as at {first['units']:,}: "
          f"{'yes' if same_lists else 'NO'}; marker GETs by the driver: {last['marker_gets']}")
    if args.ray_tasks:
        p = subprocess.run([sys.executable, __file__, "--ray-one", str(args.ray_tasks)], capture_output=True,
                           text=True, cwd=REPO)
        if p.returncode:
            raise SystemExit(f"the Ray Data run failed:\n{p.stderr[-4000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        print(f"Ray Data's own driver cost: {r['tasks'][0]:,} tasks {r['driver_cpu_s'][0]:.2f} CPU-s, "
              f"{r['tasks'][1]:,} tasks {r['driver_cpu_s'][1]:.2f} CPU-s: {r['driver_ms_per_task']:.2f} ms per task")


if __name__ == "__main__":
    main()
