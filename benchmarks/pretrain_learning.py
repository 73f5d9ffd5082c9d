"""Does pre-training learn? A tiny BERT on the five shared corpora, against the trivial baselines, on held-out data.

    python benchmarks/pretrain_learning.py --stage all   [--out /work/artifacts] [--minutes 30]
    python benchmarks/pretrain_learning.py --stage data      # split + build train/eval with the real builder
    python benchmarks/pretrain_learning.py --stage train     # jobs/pretrain.py for at most --minutes
    python benchmarks/pretrain_learning.py --stage report    # baselines + learning curve from MLflow

Held-out split: in every corpus a seeded 4% of the *documents* (at least 3) go to the eval set, so no eval
sentence (nor its document) was seen in training. The vocabulary is trained on the train split only, and the eval
set is built with it. Baselines, computed on the eval shards: MLM = always predict the most frequent token among
the *train* set's masked labels; NSP = always predict the train set's majority class.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPORA = REPO.parent / "shared" / "data" / "corpora"


def split_documents(out: Path, fraction: float = 0.04, seed: int = 0) -> None:
    rng = random.Random(seed)
    for part in ("train", "eval"):
        (out / "raw" / part).mkdir(parents=True, exist_ok=True)
    for path in sorted(CORPORA.glob("*.jsonl.gz")):
        docs = [line for line in gzip.open(path, "rt", encoding="utf-8") if line.strip()]
        held = set(rng.sample(range(len(docs)), max(3, round(fraction * len(docs)))))
        for part, keep in (("train", lambda i, held=held: i not in held), ("eval", lambda i, held=held: i in held)):
            with gzip.open(out / "raw" / part / path.name, "wt", encoding="utf-8") as f:
                f.writelines(d for i, d in enumerate(docs) if keep(i))
        print(f"{path.name}: {len(docs) - len(held)} train / {len(held)} eval documents")


def data_dirs(out: Path, seq: int) -> tuple[Path, Path]:
    """(train, eval) dataset folders; seq 128 (the first build) in train/ and eval/, other lengths beside them."""
    suffix = "" if seq == 128 else f"-seq{seq}"
    return out / "pretrain-data" / f"train{suffix}", out / "pretrain-data" / f"eval{suffix}"


def build(out: Path, vocab_size: int, dupe_factor: int, seq: int) -> None:
    from jobs import build_dataset

    common = ["--max-seq-length", str(seq), "--max-predictions-per-seq", str(round(seq * 0.15 + 0.5)),
              "--num-shards", "8", "--num-cpus", "2"]
    train, ev = data_dirs(out, seq)
    first_vocab = out / "pretrain-data" / "train" / "vocab.txt"  # other lengths reuse the first build's vocab
    vocab = ["--vocab", str(first_vocab)] if first_vocab.exists() else ["--vocab-size", str(vocab_size)]
    if not (train / "manifest.json").exists():
        rc = build_dataset.main(["--input", str(out / "raw" / "train"), "--output", str(train),
                                 *vocab, "--dupe-factor", str(dupe_factor), *common])
        assert rc == 0, rc
    if not (ev / "manifest.json").exists():
        rc = build_dataset.main(["--input", str(out / "raw" / "eval"), "--output", str(ev),
                                 "--vocab", str(train / "vocab.txt"), "--dupe-factor", "1", *common])
        assert rc == 0, rc


def train(out: Path, args: argparse.Namespace) -> int:
    train_dir, eval_dir = data_dirs(out, args.seq)
    cmd = [sys.executable, str(REPO / "jobs" / "pretrain.py"),
           "--data", str(train_dir), "--eval-data", str(eval_dir), "--eval-sequences", str(args.eval_sequences),
           "--preset", args.preset, "--max-steps", str(args.max_steps), "--batch-size", str(args.batch_size),
           "--num-workers", "1", "--cpus-per-worker", "2", "--threads", "2",
           "--lr", str(args.lr), "--warmup-steps", str(args.max_steps // 25), "--max-grad-norm", "1.0",
           "--storage", str(out / args.name / "runs"), "--run-name", args.run_name,
           "--checkpoint-every", "200", "--keep-checkpoints", "2", "--log-every", "20",
           "--eval-every", str(args.eval_every), "--length-bucketing", "--max-minutes", str(args.minutes),
           "--export", str(out / args.name / "export"),
           "--mlflow-tracking-uri", f"sqlite:///{out / args.name / 'mlflow.db'}",
           "--experiment", "pretrain-learning", *(["--dynamic-masking"] if args.dynamic_masking else [])]
    print(" ".join(cmd), flush=True)
    # Ray starts its workers at nice 15 (RAY_worker_niceness); on a box shared with other people's nice-0 processes
    # that starves the training worker to a fraction of a core. Nice 0 gives it a fair share, no more.
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
           "RAY_worker_niceness": "0"}
    return subprocess.call(cmd, cwd=out / args.name, env=env)


def baselines(out: Path, seq: int) -> dict[str, float]:
    import numpy as np

    from corpus.schema import read_manifest
    from pretraining.rows import read_shard

    def load(folder: Path):
        return [read_shard(u) for u in read_manifest(str(folder)).shard_urls]

    train_dir, eval_dir = data_dirs(out, seq)
    train_rows, eval_rows = load(train_dir), load(eval_dir)
    top_token = int(np.bincount(np.concatenate([r.lab for r in train_rows])).argmax())
    majority = int(np.bincount(np.concatenate([r.nsp for r in train_rows])).argmax())
    eval_lab = np.concatenate([r.lab for r in eval_rows])
    eval_nsp = np.concatenate([r.nsp for r in eval_rows])
    vocab = (train_dir / "vocab.txt").read_text().splitlines()
    return {"mlm_top_token": vocab[top_token], "mlm_baseline_accuracy": float((eval_lab == top_token).mean()),
            "nsp_majority_class": int(majority), "nsp_baseline_accuracy": float((eval_nsp == majority).mean()),
            "eval_sequences": int(len(eval_nsp)), "eval_masked_tokens": int(len(eval_lab)),
            "train_sequences": int(sum(len(r) for r in train_rows))}


def report(out: Path, args: argparse.Namespace) -> None:
    from mlflow.tracking import MlflowClient

    base = baselines(out, args.seq)
    print(json.dumps(base, indent=1))
    client = MlflowClient(f"sqlite:///{out / args.name / 'mlflow.db'}")
    exp = client.get_experiment_by_name("pretrain-learning")
    run = client.search_runs([exp.experiment_id], filter_string=f"tags.`bert.run_name` = '{args.run_name}'")[0]
    hist = {k: {m.step: m.value for m in client.get_metric_history(run.info.run_id, k)}
            for k in ("loss", "mlm_accuracy", "nsp_accuracy", "sequences_per_second", "eval_loss",
                      "eval_mlm_accuracy", "eval_nsp_accuracy")}
    t0 = run.info.start_time
    print(f"run {run.info.run_id} status {run.info.status}; "
          f"wall {(run.info.end_time or int(time.time() * 1000)) - t0:.0f} ms")
    # Train metrics are means over the 20 steps before each logged step (batch-sized noise); eval is held-out.
    evals = set(hist["eval_mlm_accuracy"])
    steps = sorted(s for s in hist["loss"] if s % 100 == 0 or s in evals)
    print("| step | sequences seen | train loss | train MLM acc | train NSP acc | seq/s | eval loss | eval MLM acc "
          "| eval NSP acc |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for step in steps:
        ev = (f"{hist['eval_loss'][step]:.3f} | {hist['eval_mlm_accuracy'][step]:.3f} | "
              f"{hist['eval_nsp_accuracy'][step]:.3f}") if step in evals else "| |"
        print(f"| {step} | {step * args.batch_size} | {hist['loss'][step]:.3f} | {hist['mlm_accuracy'][step]:.3f} | "
              f"{hist['nsp_accuracy'][step]:.3f} | {hist['sequences_per_second'][step]:.1f} | {ev} |")
    last = max(hist["eval_mlm_accuracy"])
    mlm, nsp_acc = hist["eval_mlm_accuracy"][last], hist["eval_nsp_accuracy"][last]
    sps = sorted(hist["sequences_per_second"].values())
    print(f"final held-out: MLM {mlm:.4f} = {mlm / base['mlm_baseline_accuracy']:.1f}x the most-frequent-token "
          f"baseline {base['mlm_baseline_accuracy']:.4f} (target >= 3x); NSP {nsp_acc:.4f} vs majority "
          f"{base['nsp_baseline_accuracy']:.4f} (target >= 0.75); median {sps[len(sps) // 2]:.1f} sequences/s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", choices=("data", "train", "report", "all"), default="all")
    p.add_argument("--out", default="/work/artifacts")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--dupe-factor", type=int, default=3)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--preset", default="bert_tiny")
    p.add_argument("--max-steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--minutes", type=float, default=28.0, help="training-loop wall-clock budget (+ ~1 min start-up)")
    p.add_argument("--eval-sequences", type=int, default=4096, help="held-out sequences per evaluation (0 = all)")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--dynamic-masking", action="store_true", help="redraw MLM masks every epoch (several epochs)")
    p.add_argument("--run-name", default="tiny-5corpora")
    p.add_argument("--name", default="pretrain-learning", help="folder under --out for runs, MLflow and export")
    args = p.parse_args()
    out = Path(args.out)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if args.stage in ("data", "all"):
        if not (out / "raw" / "eval").exists():
            split_documents(out)
        build(out, args.vocab_size, args.dupe_factor, args.seq)
    if args.stage in ("train", "all"):
        (out / args.name).mkdir(parents=True, exist_ok=True)
        rc = train(out, args)
        if rc:
            return rc
    if args.stage in ("report", "all"):
        report(out, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
