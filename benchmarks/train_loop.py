"""The real pre-training loop, `pretraining.loop.fit` without Ray, on real shards: seq/s, MFU of real tokens, data wait.

    python benchmarks/train_loop.py                                   # CPU: bert_tiny on a seq-128 Moby Dick build
    python benchmarks/train_loop.py --device cuda --preset bert_base --batch-size 256 --compile   # one GPU
    python benchmarks/train_loop.py --device cuda --preset bert_base --data DIR512 --batch-size 32 --packing
    python benchmarks/train_loop.py ... --micro-batch-size 64 --cuda-graphs --fused-kernels off --compare-transformers

Without `--data` it builds a small dataset first (data/sample's Moby Dick with the bert-base-uncased vocabulary,
seq 128, the builder's plain loop) in a temp folder. The run is exactly what `jobs/pretrain.py --no-ray` runs: the
deterministic stream + background collation, padded to the loader's length buckets (or packed with --packing), the
train step, metric sums on the device. The first `--warmup` steps (compilation, allocator warm-up) are kept out of
the figures. `--batch-size` is the global batch of a step (packed rows with --packing); `--micro-batch-size`
(default: the batch) sets the accumulation that keeps it.

Two utilisations against `--peak-tflops` (default: the GPU's known bf16 peak; none on CPU, so neither there):
`mfu`, the model FLOPs of the real tokens (`bert_core.flops.flops_per_sequence` at the mean real length and the
masked tokens actually predicted, every layer in full: the convention of every MFU figure we publish), and `hfu`,
the FLOPs the model executed (`bert_core.flops.executed_flops`: padding, the last layer at [CLS] + slots, every
head slot). `--compare-transformers` then times compiled transformers' BertForPreTraining on the same dataset's
batches (padded to its buckets; the model step alone, no data loading) and prints the ratio of real sequences/s.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def build_sample(out: Path, seq: int) -> str:
    from jobs import build_dataset

    rc = build_dataset.main(["--input", str(REPO / "data" / "sample" / "corpus" / "mobydick.jsonl.gz"),
                             "--output", str(out), "--vocab", str(REPO / "data" / "sample" / "reference" /
                                                                 "bert-base-uncased-vocab.txt"),
                             "--max-seq-length", str(seq), "--max-predictions-per-seq", str(max(1, round(seq * 0.15))),
                             "--num-shards", "4", "--dupe-factor", "1", "--no-ray", "--no-mlflow",
                             "--log-level", "WARNING"])
    if rc:
        raise SystemExit(f"building the sample dataset failed ({rc})")
    return str(out)


def transformers_seq_per_s(a, config, data: str) -> float:
    """Compiled transformers' step on the first steps of the same dataset (padded), as gpu_step.py times it."""
    import gpu_step
    import torch
    from step_batches import dataset_steps

    from bert_core import BertForPreTraining
    from bert_core.hf import to_hf_state_dict

    args = gpu_step.parse_args(["--device", a.device, "--steps", str(a.steps), "--warmup", str(a.warmup),
                                "--data", data, "--batch", str(a.batch_size),
                                "--micro-batch", str(a.micro_batch_size or a.batch_size)]
                               + (["--cuda-graphs"] if a.cuda_graphs else [])
                               + ["--compile-backend", a.compile_backend])
    cfg = config.model.bert
    torch.manual_seed(0)
    weights = to_hf_state_dict(BertForPreTraining(cfg).state_dict())
    steps = dataset_steps(cfg, data, args.batch, args.micro_batch, False, 0, args.batches, args.device)
    return gpu_step.run_variant("transformers_compiled", cfg, weights, steps, args, "loop").seq_per_s


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    from pretraining import kernel_options

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a dataset built by jobs/build_dataset.py (default: build a small one)")
    p.add_argument("--seq", type=int, default=128, help="max_seq_length of the built sample (no --data)")
    p.add_argument("--preset", default="bert_tiny")
    p.add_argument("--batch-size", type=int, default=32, help="global batch of a step (packed rows with --packing)")
    p.add_argument("--micro-batch-size", type=int, help="rows per forward (default: the batch); accumulation "
                   "keeps the global batch")
    p.add_argument("--accum", type=int, help="micro-batches per step (another way to set --micro-batch-size)")
    p.add_argument("--steps", type=int, default=40, help="measured steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile (default: on for cuda)")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--cuda-graphs", action="store_true", help="CUDA graphs for the compiled step (accum 1)")
    p.add_argument("--fused-kernels", choices=tuple(kernel_options.FUSED_KERNELS), default="auto",
                   help=kernel_options.FUSED_KERNELS_HELP)
    p.add_argument("--low-precision-residual", action="store_true", help=kernel_options.LOW_PRECISION_RESIDUAL_HELP)
    p.add_argument("--packing", action="store_true", help="packed rows instead of length buckets")
    p.add_argument("--pack-sequences", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--no-bucketing", action="store_true", help="no length bucketing (widths still from buckets)")
    p.add_argument("--compare-transformers", action="store_true",
                   help="also time compiled transformers on the same data and print the ratio")
    a = p.parse_args(argv)
    try:
        kernel_options.validate(kernel_options.FUSED_KERNELS[a.fused_kernels], a.low_precision_residual)
    except ValueError as e:
        p.error(str(e))
    if a.accum and a.micro_batch_size:
        p.error("give --accum or --micro-batch-size, not both")
    micro = a.micro_batch_size or a.batch_size // (a.accum or 1)
    if a.batch_size % micro:
        p.error(f"--micro-batch-size {micro} must divide --batch-size {a.batch_size}")
    a.micro_batch_size = micro

    from bert_core import PRESETS
    from corpus.schema import read_manifest
    from pretraining.config import ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
    from pretraining.loader import DataConfig
    from pretraining.loop import fit
    from tracking.config import TrackingConfig

    with tempfile.TemporaryDirectory() as tmp:
        data = a.data or build_sample(Path(tmp) / "data", a.seq)
        shards = read_manifest(data)
        vocab = Path(data, "vocab.txt").read_text().splitlines() if "://" not in data else None
        config = PretrainConfig(
            model=ModelConfig(bert=PRESETS[a.preset](vocab_size=len(vocab),
                                                     max_position_embeddings=max(512, shards.max_seq_length))),
            data=DataConfig(train=shards, micro_batch_size=micro, accum=a.batch_size // micro,
                            length_bucketing=not a.no_bucketing, mask_id=vocab.index("[MASK]"), packing=a.packing,
                            pack_sequences=a.pack_sequences),
            max_steps=a.warmup + a.steps,
            optimizer=OptimizerConfig(lr=1e-4, warmup_steps=0),
            tracking=TrackingConfig(log_every=a.log_every),
            runtime=RuntimeConfig(device=a.device, compile=a.compile, compile_backend=a.compile_backend,
                                  cuda_graphs=a.cuda_graphs,
                                  fused_kernels=kernel_options.FUSED_KERNELS[a.fused_kernels],
                                  low_precision_residual=a.low_precision_residual, exclude_steps=a.warmup,
                                  threads=a.threads, peak_flops=a.peak_tflops * 1e12 if a.peak_tflops else None),
        )
        t0 = time.perf_counter()
        result = fit(config)
        wall = time.perf_counter() - t0
        theirs = transformers_seq_per_s(a, config, data) if a.compare_transformers else None
    tp = result.throughput
    out = {
        "preset": a.preset, "device": a.device, "batch_size": a.batch_size, "micro_batch_size": micro,
        "compile": a.compile if a.compile is not None else a.device == "cuda", "cuda_graphs": a.cuda_graphs,
        "fused_kernels": a.fused_kernels, "packing": a.packing,
        "max_seq_length": shards.max_seq_length, "length_buckets": list(config.data.length_buckets),
        "measured_steps": a.steps, "warmup_steps": a.warmup, "wall_seconds": round(wall, 1),
        "sequences_per_second": round(tp.get("sequences_per_second", 0.0), 1),
        "tokens_per_second": round(tp.get("tokens_per_second", 0.0), 1),
        "mean_real_tokens_per_sequence": round(tp.get("mean_real_tokens", 0.0), 1),
        "padding_fraction": round(tp.get("padding_fraction", 0.0), 4),
        "mfu": round(tp["mfu"], 4) if "mfu" in tp else None,
        "hfu": round(tp["hfu"], 4) if "hfu" in tp else None,
        "mfu_convention": "model FLOPs of real tokens (bert_core.flops.flops_per_sequence) / peak",
        "data_wait_fraction": round(tp.get("data_wait_fraction", 0.0), 4),
        "final_loss": round(result.metrics.get("loss", float("nan")), 4),
    }
    if theirs is not None:
        out.update(transformers_compiled_sequences_per_second=round(theirs, 1),
                   speedup_vs_transformers_compiled=round(tp.get("sequences_per_second", 0.0) / theirs, 2))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
