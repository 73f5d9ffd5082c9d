"""What curation costs next to the build's own work on the same text, and the memory of near dedup on Ray.

    python benchmarks/curate_cost.py                    # the shared corpora (26 MB); near dedup's memory at 1x and 4x
    python benchmarks/curate_cost.py --scales 2,20      # the issue's memory check: ~52 MB and ~520 MB
    python benchmarks/curate_cost.py --skip stages,memory --ray-scales 1,4 --distinct --repeats 3   # the CPU budget
    python benchmarks/curate_cost.py --smoke            # a tiny run (what the test suite runs)

1. In this process, one thread, the same documents (JSON Lines, one document per line): the build's work (the
   whole build as a plain loop, ``pipeline`` with ``LocalExecutor``: read, sentences, WordPiece, pairs
   and masks at seq 128, dupe factor 5, shards) and each curation stage (language, quality, decontamination with
   its index, exact and near signatures, the global decision, applying it, the mix draw), as CPU-seconds of this
   process, MB of text per CPU-second, and percent of the build's CPU-seconds.
2. On Ray with 2 CPUs (a local Ray started here, loopback only), at each ``--ray-scales`` size of the passages
   corpus (below): the build (``pipeline`` on ``RayDataExecutor``, as the job runs it) without and with
   ``--dedup near`` (signatures in the read pass, the curate stage's decision on Ray Data, the drop lists), CPU-seconds
   of every process of the Ray (driver, workers, Ray Data's actors, daemons) for each, the stages' wall seconds, and
   per MB between the sizes: the issue's budget is that dedup adds <= 30% to the build's CPU-seconds. Each stage's
   CPU-seconds are printed beside its wall (in brackets); ``--repeats N`` alternates the two builds N times and
   prints medians, and dedup's own stages (the read pass's extra, curate, reports) apart from the stages it does not
   touch, whose run-to-run noise on a small box is larger than the budget; ``--distinct`` makes copies k > 0 new
   passages instead of near copies, so the larger sizes measure dedup on text it keeps.
3. The peak memory of any one Ray worker during the build with ``--dedup near`` at each ``--scales`` size (a fresh
   Ray each; dupe factor 1), over the whole build and while the curate stage decides: private (RSS minus shared
   pages, what Ray's memory monitor counts for a worker) and shared (the object store's pages the worker mapped: one
   copy per node, bounded by the store's size and spilled beyond it, counted again in every worker that read it),
   and RSS (both). The corpus cut into 200-word passages, copy k of it with 2 words of every passage changed, so near
   dedup finds (k-1)/k of them; a flat private peak means a worker's memory is bounded by block and partition, not
   corpus.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")

import pyarrow as pa  # noqa: E402
from build_throughput import PAGE, Watch  # noqa: E402

from curate import (  # noqa: E402
    CurateConfig,
    DecontaminationConfig,
    DedupConfig,
    LanguageConfig,
    MixConfig,
    QualityConfig,  # noqa: E402
)
from curate.decontaminate import build_index  # noqa: E402
from curate.dedup import ApplyDrops, Signatures, drop_set  # noqa: E402
from curate.eval_sets import eval_texts  # noqa: E402
from curate.mix import Mix  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
VOCAB = REPO / "data" / "sample" / "reference" / "bert-base-uncased-vocab.txt"
BATCH_BYTES = 16 << 20  # documents per curation call: about a build unit


def _docs(files: list[Path], limit_bytes: int | None = None) -> list[dict]:
    out, size = [], 0
    for p in files:
        with gzip.open(p, "rt", encoding="utf-8") as f:
            for line in f:
                d = json.loads(line)
                out.append({"id": d["id"], "text": d["text"], "source": p.name})
                size += len(d["text"].encode())
                if limit_bytes and size >= limit_bytes:
                    return out
    return out


def _batches(docs: list[dict]) -> list[pa.Table]:
    out, cur, size = [], [], 0
    for d in docs:
        cur.append(d)
        size += len(d["text"])
        if size >= BATCH_BYTES:
            out.append(pa.Table.from_pylist(cur))
            cur, size = [], 0
    if cur:
        out.append(pa.Table.from_pylist(cur))
    return out


class Sampling:
    """``watch.sample()`` every 0.1 s in a thread while the block runs: a process that ends mid-run (Ray starts and
    ends workers as tasks come and go) keeps its last sample instead of vanishing from the count."""

    def __init__(self, watch: Watch):
        self.watch, self.stop = watch, threading.Event()
        self.lock = threading.Lock()  # the watch's tables are read from the build's thread too (``cpu``, a hook)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            with self.lock:
                self.watch.sample()

    def cpu(self, driver: int) -> float:
        """CPU-seconds of every process so far, at the last sample."""
        with self.lock:
            return sum(self.watch.cpu_by_kind(driver).values())

    def __enter__(self) -> Watch:
        self.thread.start()
        return self.watch

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.watch.sample()


def _cpu(fn):
    t0 = time.process_time()
    result = fn()
    return time.process_time() - t0, result


def build_cpu(corpus: Path, work: Path, executor=None) -> float:
    from corpus.create_instances import InstanceConfig
    from pipeline import BuildConfig, build
    from pipeline.executor import LocalExecutor

    cfg = BuildConfig(inputs=(str(corpus),), output=str(work / f"build-{time.time_ns()}"), vocab=str(VOCAB),
                      dupe_factor=5, instances=InstanceConfig(max_seq_length=128))
    cpu, _ = _cpu(lambda: build(cfg, executor or LocalExecutor()))
    return cpu


def stage_costs(docs: list[dict], corpus: Path, tasks: Path, work: Path) -> tuple[float, list[tuple[str, float]]]:
    mb = sum(len(d["text"].encode()) for d in docs) / 1e6
    build = build_cpu(corpus, work)
    batches = _batches(docs)
    rows: list[tuple[str, float]] = []
    cfg = CurateConfig(language=LanguageConfig(languages=("en",)), quality=QualityConfig(),
                       decontamination=DecontaminationConfig(paths=(str(tasks),)), dedup=DedupConfig(mode="near"),
                       mix=MixConfig(weights=(("austen", 0.5), ("mobydick", 2.0))))
    cpu, index = _cpu(lambda: build_index(eval_texts(cfg.decontamination.paths), cfg.decontamination))
    rows.append((f"decontamination index ({index.texts:,} evaluation texts, once per build)", cpu))
    for name, f in cfg.document_filters(index):
        cpu, _ = _cpu(lambda f=f: [f(b) for b in batches])
        rows.append((name, cpu))
    exact, near = DedupConfig(mode="exact"), cfg.dedup
    cpu, sig_exact = _cpu(lambda: [Signatures(exact)(b) for b in batches])
    rows.append(("dedup exact: content hashes", cpu))
    cpu, _ = _cpu(lambda: drop_set(sig_exact, exact))
    rows.append(("dedup exact: decision (plain loop)", cpu))
    cpu, sigs = _cpu(lambda: [Signatures(near)(b) for b in batches])
    rows.append(("dedup near: signatures (hash + MinHash)", cpu))
    cpu, drops = _cpu(lambda: drop_set(sigs, near))
    rows.append((f"dedup near: decision (plain loop; {len(drops)} dropped)", cpu))
    cpu, _ = _cpu(lambda: [ApplyDrops(drops)(b) for b in batches])
    rows.append(("dedup: applying the drop set", cpu))
    cpu, _ = _cpu(lambda: [Mix(cfg.mix)(b) for b in batches])
    rows.append(("mix draw", cpu))
    print(f"\n## 1. In one process: {mb:.1f} MB of text, {len(docs):,} documents, {len(batches)} batches")
    print("\n| stage | CPU-s | MB per CPU-s | % of the build |\n|---|---:|---:|---:|")
    print(f"| **the build** (plain loop: read, sentences, WordPiece, pairs + masks x5, shards) | {build:.2f} |"
          f" {mb / build:.2f} | 100 |")
    for name, cpu in rows:
        print(f"| {name} | {cpu:.2f} | {mb / max(cpu, 1e-9):.1f} | {100 * cpu / build:.1f} |")
    dedup = sum(c for n, c in rows if n.startswith(("dedup near", "dedup: ")))
    print(f"\nnear dedup in all (signatures + decision + applying): {dedup:.2f} CPU-s = {100 * dedup / build:.1f}% of"
          " the build's CPU-seconds in one process")
    return build, rows


class Stages:
    """The build's ``on_stage`` hook: each stage's wall seconds; ``running`` names what runs now (a stage starts
    when the one before it ends), so a sampler can keep the workers' peak memory per stage."""

    def __init__(self, cpu_now=None):
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}  # CPU-s of every process from the stage's start to its end (with cpu_now)
        self.running = "read and before"
        self.cpu_now, self._last = cpu_now, cpu_now() if cpu_now else 0.0
        self.ending = None  # called as a stage ends, before ``running`` moves on (a sampler's last sample of it)

    def __call__(self, name: str, markers: list, ops: dict, started: float, ended: float) -> None:
        self.wall[name] = ended - started
        if self.ending:
            self.ending()
        self.running = f"after {name}"
        if self.cpu_now:  # the sampler's last figures (at most 0.1 s old): a stage's share, to the next stage
            now = self.cpu_now()
            self.cpu[name], self._last = now - self._last, now


def _memory_table() -> dict[int, tuple[int, int]]:
    """pid -> (private bytes, shared bytes) of every process: ``/proc/PID/statm``'s resident pages minus its shared
    ones (what Ray's own memory monitor counts for a worker: ``rss - shared``), and the shared ones, which for a Ray
    worker are mostly the object store's pages it has mapped (one copy per node, in /dev/shm, sized by
    ``object_store_memory`` and spilled to disk beyond it: not the worker's memory, counted in every worker that
    touched them)."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/statm") as f:
                    resident, shared = (int(x) * PAGE for x in f.read().split()[1:3])
            except OSError:
                continue
            out[int(name)] = (resident - shared, shared)
    return out


class PeakByStage(Sampling):
    """Sampling that also keeps, per stage (``Stages.running``), the largest private and shared memory of any one
    Ray worker (``_memory_table``)."""

    def __init__(self, watch: Watch, stages: Stages, driver: int):
        super().__init__(watch)
        self.stages, self.driver = stages, driver
        self.private: dict[str, int] = {}
        self.shared: dict[str, int] = {}
        stages.ending = self._record  # a stage shorter than the sampling interval still gets one sample, at its end

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            self._record()

    def _record(self) -> None:
        with self.lock:
            self.watch.sample()
            mem = _memory_table()
            workers = [mem[p] for p in self.watch.ticks
                       if p in mem and self.watch.kind(p, self.driver) == "ray_workers"]
            label = self.stages.running
            self.private[label] = max([self.private.get(label, 0)] + [m[0] for m in workers])
            self.shared[label] = max([self.shared.get(label, 0)] + [m[1] for m in workers])


def build_on_ray(corpus: Path, work: Path, cpus: int, dedup: str, dupe_factor: int = 5, on_stage=None):
    from corpus.create_instances import InstanceConfig
    from pipeline import BuildConfig, build
    from pipeline.ray_data import RayDataExecutor

    cfg = BuildConfig(inputs=(str(corpus),), output=str(work / f"build-{time.time_ns()}"), vocab=str(VOCAB),
                      dupe_factor=dupe_factor, instances=InstanceConfig(max_seq_length=128),
                      curate=CurateConfig(dedup=DedupConfig(mode=dedup)))
    return build(cfg, RayDataExecutor(num_cpus=cpus), on_stage=on_stage)


def _passages_file(src: list[Path], scale: int, work: Path, limit_bytes: int | None,
                   distinct: bool = False) -> tuple[Path, float, int]:
    docs = scaled_corpus(src, scale, limit_bytes, distinct)
    corpus = work / f"passages-{scale}x{'-distinct' if distinct else ''}.jsonl"
    with open(corpus, "w") as f:
        for d in docs:
            f.write(json.dumps({"id": d["id"], "text": d["text"]}) + "\n")
    return corpus, sum(len(d["text"].encode()) for d in docs) / 1e6, len(docs)


RAY_START_ATTEMPTS = 6


def _start_ray(cpus: int, prefix: str) -> None:
    """A local Ray on loopback; on a loaded machine its node can miss Ray's hard-coded 30 s to register (issue 42:
    the benchmark could not start there), so a start that timed out is retried, as ``cluster.ray_start`` does."""
    import ray

    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                     configure_logging=False, _temp_dir=tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
            return
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this; anything else re-raises
            if "timed out during startup" not in str(e) or attempt == RAY_START_ATTEMPTS:
                raise
            print(f"# local Ray start timed out (attempt {attempt} of {RAY_START_ATTEMPTS}, load "
                  f"{os.getloadavg()[0]:.1f}); retrying", file=sys.stderr)
            ray.shutdown()


def ray_costs(src: list[Path], scales: list[int], work: Path, cpus: int, limit_bytes: int | None,
              distinct: bool = False, repeats: int = 1) -> None:
    """The build job's work on Ray (``jobs/build_dataset.py``'s build, seq 128, dupe factor 5) without and with
    ``--dedup near``, on the same passages: CPU-seconds of every process."""
    import ray

    _start_ray(cpus, "rc")
    ray.data.DataContext.get_current().enable_progress_bars = False
    copies = ("copy k of the corpus new passages of four 50-word quarters of random passages (no near copies)"
              if distinct else "copy k of the corpus with 2 words of each passage changed")
    print(f"\n## 2. The build on Ray, {cpus} CPUs, without and with --dedup near (200-word passages; {copies})\n")
    print("| input | build | wall s | CPU-s all processes | driver / workers / Ray Data actors / daemons | "
          "stages (wall s) | dropped |\n|---|---|---:|---:|---|---|---:|")
    driver = os.getpid()
    rows, own = [], []
    try:
        for scale in scales:
            corpus, mb, _ = _passages_file(src, scale, work, limit_bytes, distinct)
            if not rows and not limit_bytes:  # (not in --smoke)
                build_on_ray(corpus, work, cpus, "off")  # warm: workers up, as on a cluster
            out: dict[str, list[float]] = {"off": [], "near": []}
            stage_cpu: dict[str, list[dict[str, float]]] = {"off": [], "near": []}
            for _ in range(repeats):  # alternated, so a drift of the box's speed falls on both
                for dedup in ("off", "near"):
                    t0 = time.time()
                    sampling = Sampling(Watch([driver]))
                    with sampling as watch:
                        stages = Stages(lambda sampling=sampling: sampling.cpu(driver))
                        m = build_on_ray(corpus, work, cpus, dedup, on_stage=stages)
                    cpu = watch.cpu_by_kind(driver)
                    out[dedup].append(sum(cpu.values()))
                    stage_cpu[dedup].append(stages.cpu)
                    print(f"| {mb:.0f} MB ({scale}x) | {'--dedup near' if dedup == 'near' else 'no dedup'} | "
                          f"{time.time() - t0:.1f} | {out[dedup][-1]:.1f} | "
                          + " / ".join(f"{v:.1f}" for v in cpu.values()) + " | "
                          + ", ".join(f"{k} {v:.1f} ({stages.cpu.get(k, 0):.1f})" for k, v in stages.wall.items())
                          + f" | {sum(m.dropped.values()):,} |", flush=True)
            b, d = statistics.median(out["off"]), statistics.median(out["near"])
            rows.append((scale, mb, b, d))
            # What dedup's own stages cost: the read pass's extra CPU (the signatures), the curate stage, the drop
            # reports; the stages it does not touch (pool, instances, shards) are left out, so their run-to-run noise
            # (several CPU-s on this box) does not count for or against it.
            read = [n for n in stage_cpu["off"][0] if n.startswith(("read", "pieces"))]
            extra = [sum(s.get(n, 0) for n in read) for s in stage_cpu["near"]]
            base_read = statistics.median(sum(s.get(n, 0) for n in read) for s in stage_cpu["off"])
            own.append((mb, statistics.median(e - base_read + s.get("curate", 0) + s.get("reports", 0)
                                              for e, s in zip(extra, stage_cpu["near"], strict=False)), b))
    finally:
        ray.shutdown()
    for _scale, mb, b, d in rows:
        print(f"\n{mb:.0f} MB: --dedup near at {cpus} CPUs adds {100 * (d - b) / b:.0f}% to the build's CPU-seconds"
              f" (medians of {repeats}; budget: 30%): {'met' if d - b <= 0.3 * b else 'NOT met'}")
    for mb, cost, b in own:
        print(f"{mb:.0f} MB: dedup's own stages (the read pass's extra, curate, reports; median of {repeats}) "
              f"{cost:.1f} CPU-s = {100 * cost / b:.0f}% of the build's")
    if len(rows) > 1:
        (_, m0, b0, d0), (_, m1, b1, d1) = rows[0], rows[-1]
        print(f"per MB between {m0:.0f} and {m1:.0f} MB: the build {(b1 - b0) / (m1 - m0):.3f} CPU-s, --dedup near"
              f" adds {((d1 - b1) - (d0 - b0)) / (m1 - m0):.3f} CPU-s")


def scaled_corpus(src: list[Path], scale: int, limit_bytes: int | None, distinct: bool = False) -> list[dict]:
    """200-word passages; copy k > 0 has 2 words of each passage changed (a near copy, ~0.9 Jaccard), or with
    ``distinct`` is made of new passages, each four 50-word quarters of four passages drawn at random (seeded by k):
    no two share more than a quarter's shingles, so near dedup finds (almost) nothing to drop and pays its whole
    cost, as on a corpus without copies."""
    base = []
    for d in _docs(src, limit_bytes):
        w = d["text"].split()
        base += [(f"{d['id']}@{i}", w[i:i + 200]) for i in range(0, len(w) - 199, 200)]
    out = []
    for k in range(scale):
        rng = random.Random(k)
        for doc_id, w in base:
            if k and distinct:
                picks = [base[rng.randrange(len(base))][1] for _ in range(4)]
                w = [x for q, p in enumerate(picks) for x in p[50 * q:50 * q + 50]]
            elif k:
                w = list(w)
                w[rng.randrange(10, 90)] = f"copy{k}"
                w[rng.randrange(110, 190)] = f"copy{k}"
            out.append({"id": f"c{k}/{doc_id}", "text": " ".join(w), "source": f"copy{k}"})
    return out


def memory(src: list[Path], scales: list[int], work: Path, cpus: int, limit_bytes: int | None) -> None:
    """The build job's work with --dedup near (dupe factor 1: the instances pass is not what is measured) on a fresh
    local Ray per size: the largest private memory of any one Ray worker (RSS minus shared pages, as Ray's memory
    monitor counts it) over the build and while the curate stage (the dedup decision, the drop lists) ran, the
    largest shared resident memory of one worker (the object store's pages it mapped) and the largest RSS (both)."""
    import ray

    print(f"\n## 3. The build with --dedup near on Ray, {cpus} CPUs: peak memory of one worker by input size\n")
    print("| input | documents | wall s | CPU-s all processes | dropped | private (RSS - shared), the build | "
          "private, curate stage | shared (object store pages), the build | RSS, the build |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for scale in scales:
        corpus, mb, n_docs = _passages_file(src, scale, work, limit_bytes)
        _start_ray(cpus, "rm")
        ray.data.DataContext.get_current().enable_progress_bars = False
        try:
            driver = os.getpid()
            t0 = time.time()
            stages = Stages()
            sampler = PeakByStage(Watch([driver]), stages, driver)
            with sampler as watch:  # a worker's peak while it runs, not its memory at the end
                m = build_on_ray(corpus, work, cpus, "near", dupe_factor=1, on_stage=stages)
            wall = time.time() - t0
            cpu = sum(watch.cpu_by_kind(driver).values())
            print(f"| {mb:.0f} MB ({scale}x) | {n_docs:,} | {wall:.1f} | {cpu:.1f} | {sum(m.dropped.values()):,} |"
                  f" {max(sampler.private.values(), default=0) / 1e6:.0f} MB |"
                  f" {sampler.private.get('after read', 0) / 1e6:.0f} MB |"  # the stage after read: curate
                  f" {max(sampler.shared.values(), default=0) / 1e6:.0f} MB | {watch.worker_peak_mb(driver):.0f} MB |",
                  flush=True)
            print("  private peak by stage: " + ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in sampler.private.items()),
                  flush=True)
        finally:
            ray.shutdown()
        corpus.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=SHARED / "corpora", help="a folder of gzipped JSON Lines")
    ap.add_argument("--tasks", type=Path, default=SHARED / "tasks", help="evaluation sets for decontamination")
    ap.add_argument("--scales", default="1,4", help="input sizes for the memory check, in copies of the corpus")
    ap.add_argument("--ray-scales", default="1,4", help="input sizes for the CPU cost on Ray, in copies")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="~1 MB and tiny scales: checks that every part runs")
    ap.add_argument("--skip", default="", help="parts to leave out: stages,ray,memory")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each Ray build, alternated; medians printed")
    ap.add_argument("--distinct", action="store_true",
                    help="the Ray part's copies are new passages (no near copies), not near copies of the corpus")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    files = sorted(args.corpus.glob("*.jsonl.gz"))
    limit = 1 << 20 if args.smoke else None
    print(f"curate_cost on {platform.node()} ({os.cpu_count()} CPUs),"
          f" {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="curate-cost-") as tmp:
        work = Path(tmp)
        docs = _docs(files, limit)
        corpus = work / "corpus.jsonl"
        with open(corpus, "w") as f:
            for d in docs:
                f.write(json.dumps({"id": d["id"], "text": d["text"]}) + "\n")
        if "stages" not in skip:
            stage_costs(docs, corpus, args.tasks, work)
        if "ray" not in skip:
            ray_costs(files, [int(x) for x in args.ray_scales.split(",") if x], work, args.cpus, limit,
                      args.distinct, args.repeats)
        if "memory" not in skip:
            memory(files, [int(s) for s in args.scales.split(",") if s], work, args.cpus, limit)


if __name__ == "__main__":
    main()
