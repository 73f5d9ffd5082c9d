"""Which learning rate trains which model size? Presets x learning rates, pre-training and fine-tuning, on the
shared corpora and tasks (`../shared/data`), a few seeds. Its table is in docs/learning-rates.md, and the defaults
in `training/defaults.py` come from it.

    nice -n 10 python benchmarks/lr_sweep.py --out /tmp/lr-sweep                # data, pretrain, finetune, table
    nice -n 10 python benchmarks/lr_sweep.py --out /tmp/lr-sweep --stage table   # the markdown table again
    python benchmarks/lr_sweep.py --presets bert_tiny bert_mini bert_small --steps 2000 --seeds 0 1 2  # bigger

Every run is the job a user runs (`jobs/pretrain.py`, `jobs/finetune.py` as subprocesses, `--no-ray`, one torch
thread), with every flag but --lr and --seed left at what the sweep states below. Results are appended as JSON lines
to OUT/results.jsonl; a (stage, preset, lr, seed, task) already there is not rerun, so an interrupted sweep resumes.

- Data: the shared Austen and Moby Dick corpora; a seeded 5% of the documents of each is held out (eval), the rest
  is built (dupe factor 1, seq 128, an 8,192-entry WordPiece vocabulary trained on the train part).
- Pre-training: --steps steps of --pretrain-batch sequences, warm-up 10% of the steps, linear decay; the figure is
  held-out MLM accuracy at the end (and the most frequent masked token's share of the held-out labels beside it).
- Fine-tuning: from each preset's pre-trained model at the best pre-training lr among those done (seed 0), on each
  task a seeded 90/10 split (`--split-eval-from-train 0.1 --split-seed 0`), seeded subsets (TASKS; 300 evaluation
  examples), 3 epochs (the job's default), warm-up 10%, seq 64; the figure is held-out accuracy, the evaluation
  rows' majority share beside it.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# ../shared/data beside the checkout (a git worktree sits one level deeper: ../../shared/data).
SHARED = next((d for d in (REPO.parent / "shared" / "data", REPO.parent.parent / "shared" / "data") if d.is_dir()),
              REPO.parent / "shared" / "data")
CORPORA = ("austen.jsonl.gz", "mobydick.jsonl.gz")
# task -> (file, --task, extra flags); seeded subsets sized so a run takes minutes on a busy shared core (2,000
# lexname examples hold every class of its 300 evaluation examples: the job refuses labels unseen in training).
EVAL_EXAMPLES = 300
TASKS = {
    "rt_sentiment": ("rt_sentiment.jsonl.gz", "classification", ["--max-train-examples", "1000"]),
    "wordnet_lexname": ("wordnet_lexname.jsonl.gz", "classification", ["--max-train-examples", "2000"]),
    "wordnet_wic": ("wordnet_wic.jsonl.gz", "pair_classification",
                    ["--max-train-examples", "2000", "--text-column", "sentence1", "--text-pair-column", "sentence2"]),
}
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
       "RAY_DATA_DISABLE_PROGRESS_BARS": "1", "OMP_NUM_THREADS": "1"}


def split_documents(out: Path, fraction: float = 0.05, seed: int = 0) -> None:
    rng = random.Random(seed)
    for part in ("train", "eval"):
        (out / "raw" / part).mkdir(parents=True, exist_ok=True)
    for name in CORPORA:
        docs = [line for line in gzip.open(SHARED / "corpora" / name, "rt", encoding="utf-8") if line.strip()]
        held = set(rng.sample(range(len(docs)), max(3, round(fraction * len(docs)))))
        for part, keep in (("train", lambda i, held=held: i not in held), ("eval", lambda i, held=held: i in held)):
            with gzip.open(out / "raw" / part / name, "wt", encoding="utf-8") as f:
                f.writelines(d for i, d in enumerate(docs) if keep(i))


def build_data(out: Path) -> None:
    common = [sys.executable, str(REPO / "jobs" / "build_dataset.py"), "--max-seq-length", "128",
              "--dupe-factor", "1", "--num-cpus", "2", "--progress", "lines"]
    if not (out / "raw" / "eval").exists():
        split_documents(out)
    train, ev = out / "data" / "train", out / "data" / "eval"
    for folder, extra in ((train, ["--input", str(out / "raw" / "train"), "--vocab-size", "8192",
                                   "--num-shards", "4"]),
                          (ev, ["--input", str(out / "raw" / "eval"), "--vocab", str(train / "vocab.txt"),
                                "--num-shards", "1"])):
        if not (folder / "manifest.json").exists():
            subprocess.run([*common, *extra, "--output", str(folder)], check=True, env={**os.environ, **ENV})


def done(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.open()] if path.exists() else []


def record(out: Path, rec: dict) -> None:
    with (out / "results.jsonl").open("a") as f:
        f.write(json.dumps(rec) + "\n")


def job(cmd: list[str], log: Path) -> tuple[dict, float]:
    """Runs a job; its last stdout line is its JSON summary. Returns it and the wall seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{time.strftime('%H:%M:%S')}] {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    with log.open("w") as err:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO,
                              env={**os.environ, **ENV})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"rc {proc.returncode}: {' '.join(cmd)}; see {log}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def pretrain(out: Path, args: argparse.Namespace) -> None:
    have = {(r["preset"], r["lr"], r["seed"]) for r in done(out) if r["stage"] == "pretrain"}
    # Seeds outermost: every lr's first seed is done (and fine-tuning can start from the best) before the second.
    for seed in args.seeds:
        for preset in args.presets:
            for lr in args.pretrain_lrs:
                if (preset, lr, seed) in have:
                    continue
                name = f"{preset}-lr{lr:g}-seed{seed}"
                cmd = [sys.executable, str(REPO / "jobs" / "pretrain.py"), "--no-ray", "--threads", "1",
                       "--data", str(out / "data" / "train"), "--eval-data", str(out / "data" / "eval"),
                       "--eval-sequences", "1024", "--preset", preset, "--max-steps", str(args.steps),
                       "--batch-size", str(args.pretrain_batch), "--lr", f"{lr:g}",
                       "--warmup-steps", str(args.steps // 10), "--seed", str(seed),
                       "--checkpoint-every", str(args.steps), "--keep-checkpoints", "1", "--log-every", "50",
                       "--storage", str(out / "runs"), "--run-name", name, "--export", str(out / "models" / name),
                       "--mlflow-tracking-uri", f"sqlite:///{out / 'mlflow.db'}", "--experiment", "lr-sweep",
                       "--no-system-metrics"]
                final, wall = job(cmd, out / "logs" / f"pretrain-{name}.log")
                rec = {"stage": "pretrain", "preset": preset, "lr": lr, "seed": seed, "steps": args.steps,
                       "batch": args.pretrain_batch, "eval_mlm_accuracy": final.get("eval_mlm_accuracy"),
                       "eval_nsp_accuracy": final.get("eval_nsp_accuracy"), "eval_loss": final.get("eval_loss"),
                       "export": str(out / "models" / name), "wall_s": round(wall, 1),
                       "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                record(out, rec)
                print(f"    -> eval MLM accuracy {rec['eval_mlm_accuracy']} in {wall:.0f} s", flush=True)


def best_pretrained(out: Path, preset: str) -> str:
    runs = [r for r in done(out) if r["stage"] == "pretrain" and r["preset"] == preset and r["seed"] == 0]
    if not runs:
        raise SystemExit(f"no pre-training run of {preset} in {out}/results.jsonl: run --stage pretrain first")
    return max(runs, key=lambda r: r["eval_mlm_accuracy"] or 0)["export"]


def finetune(out: Path, args: argparse.Namespace) -> None:
    have = {(r["preset"], r["task"], r["lr"], r["seed"]) for r in done(out) if r["stage"] == "finetune"}
    for preset in args.presets:
        init = best_pretrained(out, preset)
        for task in args.tasks:
            file, family, extra = TASKS[task]
            for lr in args.finetune_lrs:
                for seed in args.seeds:
                    if (preset, task, lr, seed) in have:
                        continue
                    name = f"{preset}-{task}-lr{lr:g}-seed{seed}"
                    cmd = [sys.executable, str(REPO / "jobs" / "finetune.py"), "--no-ray", "--cpus-per-worker", "1",
                           "--task", family, "--train", str(SHARED / "tasks" / file), "--init", init,
                           "--split-eval-from-train", "0.1", "--split-seed", "0",
                           "--max-eval-examples", str(EVAL_EXAMPLES),
                           "--max-seq-length", "64", "--lr", f"{lr:g}", "--seed", str(seed), *extra,
                           "--mlflow-tracking-uri", f"sqlite:///{out / 'mlflow.db'}", "--experiment", "lr-sweep",
                           "--output", str(out / "finetuned" / name)]
                    final, wall = job(cmd, out / "logs" / f"finetune-{name}.log")
                    rec = {"stage": "finetune", "preset": preset, "task": task, "lr": lr, "seed": seed,
                           "accuracy": final.get("accuracy"), "init": init, "wall_s": round(wall, 1),
                           "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                    record(out, rec)
                    print(f"    -> accuracy {rec['accuracy']} in {wall:.0f} s", flush=True)


def eval_majority(task: str) -> float:
    """The majority label's share of the rows the jobs evaluate on: the held-out 10% (split seed 0) and its seeded
    EVAL_EXAMPLES, selected by the job's own split functions."""
    from finetuning.records import split_train_eval, subsample

    rows = [json.loads(line) for line in gzip.open(SHARED / "tasks" / TASKS[task][0], "rt", encoding="utf-8")]
    held = subsample(split_train_eval(rows, 0.1, 0)[1], EVAL_EXAMPLES, 0)
    return Counter(str(r["label"]) for r in held).most_common(1)[0][1] / len(held)


def mlm_baseline(out: Path) -> float:
    import numpy as np

    from corpus.schema import read_manifest
    from pretraining.rows import read_shard

    def labels(folder: Path):
        return np.concatenate([read_shard(u).lab for u in read_manifest(str(folder)).shard_urls])

    top = int(np.bincount(labels(out / "data" / "train")).argmax())
    return float((labels(out / "data" / "eval") == top).mean())


def cell(values: list[float]) -> str:
    if not values:
        return "not run"
    return f"{statistics.mean(values):.3f} ({', '.join(f'{v:.3f}' for v in values)})"


def table(out: Path, args: argparse.Namespace) -> None:
    rows = done(out)
    pre = [r for r in rows if r["stage"] == "pretrain"]
    fine = [r for r in rows if r["stage"] == "finetune"]
    lrs = sorted({r["lr"] for r in pre})
    print(f"Pre-training, held-out MLM accuracy after {pre[0]['steps'] if pre else args.steps} steps of "
          f"{pre[0]['batch'] if pre else args.pretrain_batch} sequences (mean (seeds)); most frequent token "
          f"baseline {mlm_baseline(out):.3f}\n")
    print("| preset | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | wall s/run |")
    print("|---|" + "---|" * (len(lrs) + 1))
    for preset in dict.fromkeys(r["preset"] for r in pre):
        mine = [r for r in pre if r["preset"] == preset]
        print(f"| {preset} | " + " | ".join(cell([r["eval_mlm_accuracy"] for r in mine if r["lr"] == lr])
                                            for lr in lrs)
              + f" | {statistics.mean(r['wall_s'] for r in mine):.0f} |")
    if not fine:
        return
    lrs = sorted({r["lr"] for r in fine})
    print("\nFine-tuning, held-out accuracy after 3 epochs (mean (seeds)), from the preset's best pre-training\n")
    print("| preset | task (majority share) | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | wall s/run |")
    print("|---|---|" + "---|" * (len(lrs) + 1))
    for preset in dict.fromkeys(r["preset"] for r in fine):
        for task in dict.fromkeys(r["task"] for r in fine if r["preset"] == preset):
            mine = [r for r in fine if r["preset"] == preset and r["task"] == task]
            print(f"| {preset} | {task} ({eval_majority(task):.3f}) | "
                  + " | ".join(cell([r["accuracy"] for r in mine if r["lr"] == lr]) for lr in lrs)
                  + f" | {statistics.mean(r['wall_s'] for r in mine):.0f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", choices=("data", "pretrain", "finetune", "table", "all"), default="all")
    p.add_argument("--out", type=Path, default=Path("/tmp/lr-sweep"))
    p.add_argument("--presets", nargs="+", default=["bert_tiny", "bert_mini"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--steps", type=int, default=400, help="pre-training steps (warm-up: 10%% of them)")
    p.add_argument("--pretrain-batch", type=int, default=32)
    p.add_argument("--pretrain-lrs", nargs="+", type=float, default=[1e-4, 5e-4, 1e-3, 2e-3])
    p.add_argument("--finetune-lrs", nargs="+", type=float, default=[5e-5, 2e-4, 1e-3, 3e-3])
    p.add_argument("--tasks", nargs="+", default=["rt_sentiment", "wordnet_lexname"], choices=list(TASKS))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.stage in ("data", "all"):
        build_data(args.out)
    if args.stage in ("pretrain", "all"):
        pretrain(args.out, args)
    if args.stage in ("finetune", "all"):
        finetune(args.out, args)
    if args.stage in ("table", "all"):
        table(args.out, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
