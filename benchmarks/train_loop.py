"""The real pre-training loop, `training.fit` without Ray, on real shards: seq/s, MFU of real tokens, data wait.

    python benchmarks/train_loop.py                                   # CPU: bert_tiny on a seq-128 Moby Dick build
    python benchmarks/train_loop.py --device cuda --preset bert_base --batch-size 256 --compile   # one GPU

Without `--data` it builds a small dataset first (data/sample's Moby Dick with the bert-base-uncased vocabulary,
seq 128, the builder's plain loop) in a temp folder. The run is exactly what `jobs/pretrain.py --no-ray` runs: the
deterministic stream + background collation, padded to the loader's length buckets, the train step, metric sums on
the device. The first `--warmup` steps (compilation, allocator warm-up) are kept out of the figures. MFU counts the
useful FLOPs of the real tokens (`bert_core.flops`: mean real length, masked positions actually predicted) against
`--peak-tflops` (default: the GPU's known bf16 peak; none on CPU, so no MFU there).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def build_sample(out: Path, seq: int) -> str:
    from jobs import build_dataset

    rc = build_dataset.main(["--input", str(REPO / "data" / "sample" / "corpus" / "mobydick.jsonl.gz"),
                             "--output", str(out), "--vocab", str(REPO / "data" / "sample" / "reference" /
                                                                 "bert-base-uncased-vocab.txt"),
                             "--max-seq-length", str(seq), "--max-predictions-per-seq", str(max(1, round(seq * 0.15))),
                             "--num-shards", "4", "--dupe-factor", "1", "--no-ray", "--log-level", "WARNING"])
    if rc:
        raise SystemExit(f"building the sample dataset failed ({rc})")
    return str(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a dataset built by jobs/build_dataset.py (default: build a small one)")
    p.add_argument("--seq", type=int, default=128, help="max_seq_length of the built sample (no --data)")
    p.add_argument("--preset", default="bert_tiny")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=40, help="measured steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile (default: on for cuda)")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--no-bucketing", action="store_true", help="no length bucketing (widths still from buckets)")
    a = p.parse_args()

    from bert_core import PRESETS
    from training import (DataConfig, ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig, TrackingConfig,
                          fit)
    from pipeline.schema import read_manifest
    from training.loader import ShardSet

    with tempfile.TemporaryDirectory() as tmp:
        data = a.data or build_sample(Path(tmp) / "data", a.seq)
        shards = ShardSet.from_manifest(read_manifest(data))
        vocab = Path(data, "vocab.txt").read_text().splitlines() if "://" not in data else None
        config = PretrainConfig(
            model=ModelConfig(bert=PRESETS[a.preset](vocab_size=len(vocab),
                                                     max_position_embeddings=max(512, shards.max_seq_length))),
            data=DataConfig(train=shards, micro_batch_size=a.batch_size // a.accum, accum=a.accum,
                            length_bucketing=not a.no_bucketing, mask_id=vocab.index("[MASK]")),
            max_steps=a.warmup + a.steps,
            optimizer=OptimizerConfig(lr=1e-4, warmup_steps=0),
            tracking=TrackingConfig(log_every=a.log_every),
            runtime=RuntimeConfig(device=a.device, compile=a.compile, compile_backend=a.compile_backend,
                                  exclude_steps=a.warmup, threads=a.threads,
                                  peak_flops=a.peak_tflops * 1e12 if a.peak_tflops else None),
        )
        t0 = time.perf_counter()
        result = fit(config)
        wall = time.perf_counter() - t0
    tp = result.throughput
    print(json.dumps({
        "preset": a.preset, "device": a.device, "batch_size": a.batch_size,
        "compile": a.compile if a.compile is not None else a.device == "cuda",
        "accum": a.accum, "max_seq_length": shards.max_seq_length, "length_buckets": list(config.data.length_buckets),
        "measured_steps": a.steps, "warmup_steps": a.warmup, "wall_seconds": round(wall, 1),
        "sequences_per_second": round(tp.get("sequences_per_second", 0.0), 1),
        "tokens_per_second": round(tp.get("tokens_per_second", 0.0), 1),
        "mean_real_tokens_per_sequence": round(tp.get("mean_real_tokens", 0.0), 1),
        "padding_fraction": round(tp.get("padding_fraction", 0.0), 4),
        "mfu": round(tp["mfu"], 4) if "mfu" in tp else None,
        "data_wait_fraction": round(tp.get("data_wait_fraction", 0.0), 4),
        "final_loss": round(result.metrics.get("loss", float("nan")), 4),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
