"""Data build scaling: wall, CPU-seconds by process, MB per CPU-second of all processes, driver CPU, peak memory
per worker, the machine's own N-process ceiling and the serial/parallel split, against issue 11's targets.

    python benchmarks/build_throughput.py --scales 4,16 --cpus 1,2,4,8,16      # a 16-core machine (105 / 419 MB)
    python benchmarks/build_throughput.py --scales 2 --cpus 1,2                # a 2-core machine (~50 MB)

Each run is `python jobs/build_dataset.py` in a fresh process (its own local Ray, capped with --num-cpus), seq 128,
dupe factor 5, the bert-base-uncased vocab. The Nx corpus is the corpus (default: the shared corpora, 26 MB of
gzipped JSON Lines) repeated N times under distinct names, so its documents have distinct ids (N times the work).

Per run: wall (process start to exit: Python and Ray start-up included); CPU-seconds of every process of the tree,
split into the driver (the job's own process), Ray workers (the build's tasks), Ray Data's actors and Ray's daemons
(GCS, raylet, agents); MB per CPU-second counting all of them (robust when other work shares the machine); the
driver's CPU-seconds; the largest RSS of any single Ray worker process (and of the driver); the load average.
Per CPU count: the machine's ceiling, i.e. what N busy processes give relative to one (pure-Python loops, measured
in this invocation): no build can scale past it. Per scale: a least-squares fit of wall = S + W/P over the CPU
counts run, S being the serial seconds and W the parallel work. Then each of issue 11's targets, met or not met.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data" / "corpora"
VOCAB = REPO / "data" / "sample" / "reference" / "bert-base-uncased-vocab.txt"
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def raw_mb(folder: Path) -> float:
    total = 0
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            opener = gzip.open if p.suffix == ".gz" else open
            with opener(p, "rb") as f:
                while chunk := f.read(1 << 20):
                    total += len(chunk)
    return total / 1e6


def make_corpus(src: Path, scale: int, work: Path) -> Path:
    dst = work / f"corpus-{scale}x"
    for k in range(scale):
        (dst / f"copy{k}").mkdir(parents=True, exist_ok=True)
        for p in sorted(src.glob("*")):
            if p.is_file():
                shutil.copy(p, dst / f"copy{k}" / p.name)
    return dst


def tree_sample(root: int, cpu_ticks: dict[int, int], names: dict[int, str] | None = None,
                rss_peak: dict[int, int] | None = None) -> int:
    """RSS (bytes) summed over ``root`` and its descendants, from /proc (Linux; no psutil). Also records each
    process's CPU ticks (utime + stime) in ``cpu_ticks`` (kept per pid: a process that exits keeps its last value)
    and, given ``names``, its command line (Ray renames its processes: ``ray::IDLE``, ``ray::_StatsActor``, ...);
    given ``rss_peak``, each process's largest RSS so far."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/statm") as f:
                pages = int(f.read().split()[1])
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # the command name may contain spaces and parentheses
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)
        rss[pid] = pages * PAGE
        ticks[pid] = int(fields[11]) + int(fields[12])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        if rss_peak is not None:
            rss_peak[pid] = max(rss_peak.get(pid, 0), rss.get(pid, 0))
        cpu_ticks[pid] = max(cpu_ticks.get(pid, 0), ticks.get(pid, 0))
        if names is not None and pid != root:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    name = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                name = ""
            if name.startswith("ray::") or (name and not names.get(pid, "").startswith("ray::")):
                names[pid] = name  # Ray's latest title; a plain command line never replaces one
        todo.extend(children.get(pid, []))
    return total


def kind_of(pid: int, root: int, names: dict[int, str]) -> str:
    """The driver (the job's own process), a Ray worker running the build's tasks, one of Ray Data's own actors,
    or one of Ray's daemons (GCS, raylet, agents, monitors)."""
    name = names.get(pid, "")
    return ("driver" if pid == root else
            "ray_data_actors" if "_StatsActor" in name or "Coordinator" in name else
            "ray_workers" if (name.startswith("ray::") and "Agent" not in name) or "default_worker.py" in name
            else "ray_daemons")


def cpu_by_kind(root: int, cpu_ticks: dict[int, int], names: dict[int, str]) -> dict[str, float]:
    """CPU seconds by process kind (``kind_of``)."""
    out = {"driver": 0.0, "ray_workers": 0.0, "ray_data_actors": 0.0, "ray_daemons": 0.0}
    for pid, ticks in cpu_ticks.items():
        out[kind_of(pid, root, names)] += ticks / TICKS
    return out


def run(corpus: Path, cpus: int, dupe: int, out: Path, no_ray: bool, num_shards: int | None = None) -> dict:
    cmd = [sys.executable, str(REPO / "jobs" / "build_dataset.py"), "--input", str(corpus), "--output", str(out),
           "--vocab", str(VOCAB), "--dupe-factor", str(dupe), "--max-seq-length", "128", "--num-cpus", str(cpus),
           "--log-level", "WARNING"] + (["--no-ray"] if no_ray else []) + (
               ["--num-shards", str(num_shards)] if num_shards else [])
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_DATA_DISABLE_PROGRESS_BARS="1",
               TOKENIZERS_PARALLELISM="false")
    env.pop("RAY_ADDRESS", None)
    t0 = time.time()
    err = open(out.parent / f"{out.name}.stderr", "w+")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    peak, cpu_ticks, names, load, rss_peak = 0, {}, {}, [], {}
    while proc.poll() is None:
        peak = max(peak, tree_sample(proc.pid, cpu_ticks, names, rss_peak))
        load.append(os.getloadavg()[0])
        time.sleep(0.2)
    wall = time.time() - t0
    if proc.returncode != 0:
        err.seek(0)
        tail = err.read()[-3000:]
        raise RuntimeError(f"{' '.join(cmd)} failed with {proc.returncode}:\n{tail}")
    manifest = json.loads((out / "manifest.json").read_text())
    workers = [v for pid, v in rss_peak.items() if kind_of(pid, proc.pid, names) == "ray_workers"]
    return {"wall_s": wall, "build_s": manifest["build_seconds"], "peak_rss_mb": peak / 1e6,
            "peak_worker_rss_mb": max(workers, default=0) / 1e6, "driver_peak_rss_mb": rss_peak.get(proc.pid, 0) / 1e6,
            "cpu_s": sum(cpu_ticks.values()) / TICKS, "cpu_s_by_kind": cpu_by_kind(proc.pid, cpu_ticks, names),
            "load_avg": sum(load) / max(1, len(load)),
            "instances": manifest["totals"]["instances"], "cmd": " ".join(cmd[1:])}


def _busy_loop(n: int) -> float:
    start = time.process_time()
    total = 0
    for i in range(n):
        total += i * i
    return time.process_time() - start


def machine_scaling(cpus: int, n: int = 15_000_000) -> float:
    """Throughput of ``cpus`` processes running a pure-Python loop at once, relative to one alone: the ceiling this
    machine puts on any CPU-count ratio (shared cores, hyper-threads, turbo and noisy neighbours all show up here).
    Both sides are wall-clock times taken the same way, so load from other work weighs on both."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(cpus) as pool:
        pool.map(_busy_loop, [1] * cpus)  # workers up and the module imported before timing
        t0 = time.perf_counter()
        pool.map(_busy_loop, [n])
        one = time.perf_counter() - t0
        t0 = time.perf_counter()
        pool.map(_busy_loop, [n] * cpus)
        wall = time.perf_counter() - t0
    return cpus * one / wall


def fit_serial_parallel(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """Least squares of wall = S + W / P over (P, wall): (S serial seconds, W parallel CPU-seconds of work)."""
    if len({p for p, _ in points}) < 2:
        return None
    xs, ys = [1 / p for p, _ in points], [w for _, w in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    work = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - work * mx, work


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def targets(results: dict, scales: list[int], cpus: list[int], ceilings: dict[int, float]) -> list[str]:
    """Issue 11's targets, each with its figures and met / NOT met."""
    lines = []
    big, top = scales[-1], max(cpus)
    one, many = results.get(f"{big}x/1cpu"), results.get(f"{big}x/{top}cpu")
    if one and many and top > 1:
        speedup = one["wall_s"] / many["wall_s"]
        need = 10 * top / 16  # 10x at 16 CPUs, prorated for a smaller machine
        lines.append(f"{big}x: {top} CPUs vs 1: {speedup:.2f}x (target >= {need:.1f}x, or >= 0.75 of the machine's "
                     f"{ceilings[top]:.2f}x ceiling = {0.75 * ceilings[top]:.2f}x): "
                     + _verdict(speedup >= need or speedup >= 0.75 * ceilings[top]))
    for key, r in results.items():
        if key.endswith("/plain"):
            continue
        lines.append(f"{key}: {r['mb_per_cpu_s']:.2f} MB per CPU-second of all processes (target >= 2): "
                     f"{_verdict(r['mb_per_cpu_s'] >= 2)}; driver {r['cpu_s_by_kind']['driver']:.1f} CPU-s "
                     f"(target <= 3): {_verdict(r['cpu_s_by_kind']['driver'] <= 3)}; peak per worker "
                     f"{r['peak_worker_rss_mb']:.0f} MB (target <= 1000): {_verdict(r['peak_worker_rss_mb'] <= 1000)}")
    if len(scales) > 1:
        for c in cpus:
            a, b = results.get(f"{scales[0]}x/{c}cpu"), results.get(f"{big}x/{c}cpu")
            if a and b and a["peak_worker_rss_mb"]:
                ratio = b["peak_worker_rss_mb"] / a["peak_worker_rss_mb"]
                lines.append(f"peak per worker {big}x / {scales[0]}x at {c} CPU: {ratio:.2f} (flat: <= 1.25): "
                             + _verdict(ratio <= 1.25))
                growth = b["cpu_s_by_kind"]["driver"] - a["cpu_s_by_kind"]["driver"]
                lines.append(f"driver CPU {big}x - {scales[0]}x at {c} CPU: {growth:+.2f} s (target <= +1 s): "
                             + _verdict(growth <= 1))
    for s in scales:  # the 2-core figure: ~50 MB at 2 CPUs, Ray start-up included
        r = results.get(f"{s}x/2cpu")
        if r and 30 <= r["raw_mb"] <= 80:
            lines.append(f"{s}x/2cpu: {r['e2e_mb_s_cpu']:.2f} MB/s per CPU end to end (target >= 1.0 on ~50 MB): "
                         + _verdict(r["e2e_mb_s_cpu"] >= 1.0))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=SHARED if SHARED.exists() else REPO / "data" / "sample" / "corpus")
    ap.add_argument("--scales", default="2")
    ap.add_argument("--cpus", default="1,2")
    ap.add_argument("--dupe-factor", type=int, default=5)
    ap.add_argument("--cpus-at-max-scale", default=None, help="CPU counts to run at the largest scale (default: --cpus)")
    ap.add_argument("--shard-mb", type=float, default=None, help="one shard per this many MB of raw text (rows per "
                    "shard held constant across scales, as a user sizes --num-shards); default: the job's 16 shards")
    ap.add_argument("--plain-loop", action="store_true", help="also time the plain loop (no Ray, 1 CPU) at the "
                    "smallest scale: the steps' own cost")
    args = ap.parse_args()
    scales = sorted(int(s) for s in args.scales.split(","))
    cpus = sorted(int(c) for c in args.cpus.split(","))
    # The ceiling first, on an idle machine: what N busy processes give here, for every N run below.
    ceilings = {c: (machine_scaling(c) if c > 1 else 1.0) for c in cpus}
    for c, v in ceilings.items():
        print(f"machine ceiling: {c} busy processes give {v:.2f}x one", flush=True)
    work = Path(tempfile.mkdtemp(prefix="build-bench-"))
    results = {}
    unit_mb = raw_mb(args.corpus)
    try:
        for scale in scales:
            corpus = make_corpus(args.corpus, scale, work)
            mb = unit_mb * scale
            run_cpus = cpus
            if args.cpus_at_max_scale and scale == scales[-1] and len(scales) > 1:
                run_cpus = sorted(int(c) for c in args.cpus_at_max_scale.split(","))
            modes = [(c, False) for c in run_cpus] + ([(1, True)] if args.plain_loop and scale == scales[0] else [])
            for c, no_ray in modes:
                out = work / f"out-{scale}x-{c}cpu{'-plain' if no_ray else ''}"
                for attempt in range(3):  # a loaded machine can time out Ray's start-up: retry that run
                    try:
                        shards = max(1, round(mb / args.shard_mb)) if args.shard_mb else None
                        r = run(corpus, c, args.dupe_factor, out, no_ray, shards)
                        break
                    except RuntimeError as e:
                        print(f"run failed (attempt {attempt + 1}): {str(e)[-400:]}", flush=True)
                        shutil.rmtree(out, ignore_errors=True)
                else:
                    raise SystemExit("giving up")
                shutil.rmtree(out, ignore_errors=True)
                r |= {"raw_mb": mb, "e2e_mb_s_cpu": mb / r["wall_s"] / c, "mb_per_cpu_s": mb / r["cpu_s"]}
                key = f"{scale}x/{c}cpu" + ("/plain" if no_ray else "")
                results[key] = r
                print(f"{key:10s} raw {mb:6.1f} MB  wall {r['wall_s']:6.1f} s  e2e {r['e2e_mb_s_cpu']:.2f} MB/s/CPU  "
                      f"{r['mb_per_cpu_s']:.2f} MB per CPU-second (all processes)  driver "
                      f"{r['cpu_s_by_kind']['driver']:.1f} CPU-s  peak per worker {r['peak_worker_rss_mb']:.0f} MB  "
                      f"driver {r['driver_peak_rss_mb']:.0f} MB  all {r['peak_rss_mb']:.0f} MB  "
                      f"load {r['load_avg']:.1f}", flush=True)
                print(f"{'':10s} CPU seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_s_by_kind"].items()),
                      flush=True)
            shutil.rmtree(corpus, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fits = {}
    for scale in scales:
        pts = [(c, results[f"{scale}x/{c}cpu"]["wall_s"]) for c in cpus if f"{scale}x/{c}cpu" in results]
        fit = fit_serial_parallel(pts)
        if fit:
            serial, par = fit
            fits[f"{scale}x"] = {"serial_s": serial, "parallel_s": par, "serial_fraction": serial / (serial + par)}
            print(f"{scale}x: wall = {serial:.1f} s + {par:.1f} s / P  (serial fraction at 1 CPU "
                  f"{serial / (serial + par):.2f}; fit over P = {[p for p, _ in pts]})")
    verdicts = targets(results, scales, cpus, ceilings)
    for line in verdicts:
        print(line)
    print(json.dumps({"machine": f"{platform.node()} {os.cpu_count()} CPU {platform.machine()}",
                      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv),
                      "load_avg_at_end": os.getloadavg(), "ceilings": ceilings, "results": results, "fits": fits,
                      "targets": verdicts}, indent=1))


if __name__ == "__main__":
    main()
