"""Data build throughput (MB of raw text per second per CPU) and peak memory of all processes, at 1x and 4x corpus.

    python benchmarks/build_throughput.py [--corpus DIR] [--scales 1,4] [--cpus 1,2] [--dupe-factor 5]

Each run is `python jobs/build_dataset.py` in a fresh process (its own local Ray, capped with --num-cpus), seq 128,
the bert-base-uncased vocab. The 4x corpus is the corpus repeated 4 times under distinct names, so its documents
have distinct ids (4x the work, not a cache hit). Peak memory is the largest sum of RSS over the whole process tree
(driver, Ray's GCS/raylet and every worker), sampled every 0.2 s.

Reported: end-to-end MB/s/CPU (process start to exit: Python and Ray start-up included), build MB/s/CPU (the
build's own clock, from the manifest: Ray already up), and MB per CPU-second actually consumed by the whole process
tree (robust when other work shares the machine), against the reference script's ~0.1 MB/s per process. The load
average during each run is printed: wall-clock figures mean little when it exceeds the CPU count. CPU seconds are
also split by process: the driver, the Ray workers running the build's tasks, Ray Data's actors and Ray's daemons.
Ratios printed: 2 CPUs vs 1 (target >= 1.7x) and peak memory 4x vs 1x (target <= 1.25x).
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
REFERENCE_MB_S = 0.1
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


def tree_sample(root: int, cpu_ticks: dict[int, int], names: dict[int, str] | None = None) -> int:
    """RSS (bytes) summed over ``root`` and its descendants, from /proc (Linux; no psutil). Also records each
    process's CPU ticks (utime + stime) in ``cpu_ticks`` (kept per pid: a process that exits keeps its last value)
    and, given ``names``, its command line (Ray renames its processes: ``ray::IDLE``, ``ray::_StatsActor``, ...)."""
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


def cpu_by_kind(root: int, cpu_ticks: dict[int, int], names: dict[int, str]) -> dict[str, float]:
    """CPU seconds of the driver (the job's own process: planning, and the docs units it runs while Ray starts),
    the Ray workers that run the build's tasks, Ray Data's own actors, and Ray's daemons (GCS, raylet, agents,
    monitors)."""
    out = {"driver": 0.0, "ray_workers": 0.0, "ray_data_actors": 0.0, "ray_daemons": 0.0}
    for pid, ticks in cpu_ticks.items():
        name = names.get(pid, "")
        kind = ("driver" if pid == root else
                "ray_data_actors" if "_StatsActor" in name or "Coordinator" in name else
                "ray_workers" if (name.startswith("ray::") and "Agent" not in name) or "default_worker.py" in name
                else "ray_daemons")
        out[kind] += ticks / TICKS
    return out


def run(corpus: Path, cpus: int, dupe: int, out: Path, no_ray: bool) -> dict:
    cmd = [sys.executable, str(REPO / "jobs" / "build_dataset.py"), "--input", str(corpus), "--output", str(out),
           "--vocab", str(VOCAB), "--dupe-factor", str(dupe), "--max-seq-length", "128", "--num-cpus", str(cpus),
           "--log-level", "WARNING"] + (["--no-ray"] if no_ray else [])
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_DATA_DISABLE_PROGRESS_BARS="1",
               TOKENIZERS_PARALLELISM="false")
    env.pop("RAY_ADDRESS", None)
    t0 = time.time()
    err = open(out.parent / f"{out.name}.stderr", "w+")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    peak, cpu_ticks, names, load = 0, {}, {}, []
    while proc.poll() is None:
        peak = max(peak, tree_sample(proc.pid, cpu_ticks, names))
        load.append(os.getloadavg()[0])
        time.sleep(0.2)
    wall = time.time() - t0
    if proc.returncode != 0:
        err.seek(0)
        tail = err.read()[-3000:]
        raise RuntimeError(f"{' '.join(cmd)} failed with {proc.returncode}:\n{tail}")
    manifest = json.loads((out / "manifest.json").read_text())
    return {"wall_s": wall, "build_s": manifest["build_seconds"], "peak_rss_mb": peak / 1e6,
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
    machine puts on any CPU-count ratio (shared cores, hyper-threads, turbo and noisy neighbours all show up here)."""
    import multiprocessing

    one = _busy_loop(n)
    with multiprocessing.get_context("spawn").Pool(cpus) as pool:
        pool.map(_busy_loop, [1] * cpus)  # workers up and the module imported before timing
        t0 = time.perf_counter()
        pool.map(_busy_loop, [n] * cpus)
        wall = time.perf_counter() - t0
    return cpus * one / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=SHARED if SHARED.exists() else REPO / "data" / "sample" / "corpus")
    ap.add_argument("--scales", default="1,4")
    ap.add_argument("--cpus", default="1,2")
    ap.add_argument("--dupe-factor", type=int, default=5)
    ap.add_argument("--plain-loop", action="store_true", help="also time the plain loop (no Ray) at 1x")
    ap.add_argument("--plain-only", action="store_true",
                    help="only the plain loop (no Ray, 1 CPU) at every scale: the steps' own memory and throughput")
    ap.add_argument("--cpus-at-max-scale", default=None, help="CPU counts to run at the largest scale (default: --cpus)")
    args = ap.parse_args()
    scales = [int(s) for s in args.scales.split(",")]
    cpus = [int(c) for c in args.cpus.split(",")]
    work = Path(tempfile.mkdtemp(prefix="build-bench-"))
    results = {}
    try:
        for scale in scales:
            corpus = make_corpus(args.corpus, scale, work)
            mb = raw_mb(corpus)
            run_cpus = cpus
            if args.cpus_at_max_scale and scale == scales[-1] and len(scales) > 1:
                run_cpus = [int(c) for c in args.cpus_at_max_scale.split(",")]
            modes = [(c, False) for c in run_cpus] + ([(1, True)] if args.plain_loop and scale == scales[0] else [])
            if args.plain_only:
                modes = [(1, True)]
            for c, no_ray in modes:
                out = work / f"out-{scale}x-{c}cpu{'-plain' if no_ray else ''}"
                for attempt in range(3):  # a loaded machine can time out Ray's start-up: retry that run
                    try:
                        r = run(corpus, c, args.dupe_factor, out, no_ray)
                        break
                    except RuntimeError as e:
                        print(f"run failed (attempt {attempt + 1}): {str(e)[-400:]}", flush=True)
                        shutil.rmtree(out, ignore_errors=True)
                else:
                    raise SystemExit("giving up")
                shutil.rmtree(out, ignore_errors=True)
                r |= {"raw_mb": mb, "e2e_mb_s_cpu": mb / r["wall_s"] / c, "build_mb_s_cpu": mb / r["build_s"] / c,
                      "mb_per_cpu_s": mb / r["cpu_s"]}
                key = f"{scale}x/{c}cpu" + ("/plain" if no_ray else "")
                results[key] = r
                print(f"{key:14s} raw {mb:6.1f} MB  wall {r['wall_s']:6.1f} s  build {r['build_s']:6.1f} s  "
                      f"e2e {r['e2e_mb_s_cpu']:.2f} MB/s/CPU  build {r['build_mb_s_cpu']:.2f} MB/s/CPU  "
                      f"{r['mb_per_cpu_s']:.2f} MB per CPU-second  peak {r['peak_rss_mb']:.0f} MB  "
                      f"instances {r['instances']}  load {r['load_avg']:.1f}", flush=True)
                print(f"{'':14s} CPU seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_s_by_kind"].items()),
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    s0, c0, c1 = scales[0], cpus[0], cpus[-1]
    ratios = {}
    if len(cpus) > 1:
        for s in scales:
            if f"{s}x/{c0}cpu" not in results or f"{s}x/{c1}cpu" not in results:
                continue
            a, b = results[f"{s}x/{c0}cpu"], results[f"{s}x/{c1}cpu"]
            ratios[f"{s}x speed-up {c1} vs {c0} CPU (e2e)"] = a["wall_s"] / b["wall_s"]
            ratios[f"{s}x speed-up {c1} vs {c0} CPU (build)"] = a["build_s"] / b["build_s"]
            ratios[f"{s}x CPU-seconds per MB {c1} vs {c0} CPU"] = b["cpu_s"] / a["cpu_s"]
    if len(scales) > 1 and args.plain_only:
        ratios[f"peak memory {scales[-1]}x / {s0}x, plain loop"] = (
            results[f"{scales[-1]}x/1cpu/plain"]["peak_rss_mb"] / results[f"{s0}x/1cpu/plain"]["peak_rss_mb"])
    if len(scales) > 1:
        for c in cpus:
            if f"{scales[-1]}x/{c}cpu" not in results:
                continue
            ratios[f"peak memory {scales[-1]}x / {s0}x at {c} CPU"] = (
                results[f"{scales[-1]}x/{c}cpu"]["peak_rss_mb"] / results[f"{s0}x/{c}cpu"]["peak_rss_mb"])
    if len(cpus) > 1:
        # The peer for the CPU-count ratio: what this machine gives two (or N) busy processes at all.
        ratios[f"machine ceiling: {c1} busy processes vs 1 (pure-Python loop)"] = machine_scaling(c1)
    best = max(r["e2e_mb_s_cpu"] for r in results.values())
    ratios["best e2e MB/s/CPU vs reference 0.1 MB/s"] = best / REFERENCE_MB_S
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x")
    print(json.dumps({"machine": f"{platform.node()} {os.cpu_count()} CPU {platform.machine()}",
                      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "load_avg_at_end": os.getloadavg(), "results": results, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
