"""Training-loop throughput: the full loop (Parquet -> the global data order -> collate -> step) vs the model-only step.

    python benchmarks/train_throughput.py --data /work/artifacts/pretrain-data/train [--preset bert_tiny]
        [--micro-batch-size 32] [--steps 60] [--threads 2] [--dynamic-masking] [--length-bucketing]

Both measurements run in this process with the same model, optimizer, threads and the *same batches*: the full
loop exactly as a Ray Train worker runs it (background reader thread, `train_step`), recording the batches it
consumed, and `train_step` alone over those batches, already in memory, alternating every `--chunk` steps. The ratio
is what the data path costs; `data_wait_fraction` is the share of the full loop's wall time spent waiting for a batch
(the job logs the same metric). Sequences/s count sequences; tokens/s count real (unpadded) tokens.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/work/artifacts/pretrain-data/train")
    p.add_argument("--preset", default="bert_tiny")
    p.add_argument("--micro-batch-size", type=int, default=32)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10, help="steps excluded from the timing (one chunk)")
    p.add_argument("--chunk", type=int, default=10, help="steps per alternation of full loop / model-only")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dynamic-masking", action="store_true")
    p.add_argument("--length-bucketing", action="store_true")
    a = p.parse_args()

    import torch

    from bert_core import PRESETS, BertForPreTraining
    from corpus.schema import read_manifest
    from pretraining.loader import DataConfig, train_batches
    from pretraining.metrics import MetricSums
    from pretraining.step import train_step
    from training.optim import build_optimizer, build_scheduler
    from training.step import to_device

    torch.set_num_threads(a.threads)
    shards = read_manifest(a.data)
    vocab = Path(a.data, "vocab.txt").read_text().splitlines() if "://" not in a.data else None
    vocab_size = len(vocab)
    data = DataConfig(train=shards, micro_batch_size=a.micro_batch_size, accum=a.accum,
                      length_bucketing=a.length_bucketing, dynamic_masking=a.dynamic_masking,
                      mask_id=vocab.index("[MASK]"))

    def fresh():
        torch.manual_seed(0)
        model = BertForPreTraining(PRESETS[a.preset](vocab_size=vocab_size))
        opt = build_optimizer(model, "adamw", lr=1e-4)
        return model, opt, build_scheduler(opt, 0, 10_000)

    # The two measurements alternate in chunks of `--chunk` steps, so a change in the (shared) machine's load hits
    # both alike: chunk k of the full loop (reader thread + collate + step, recording its batches), then the
    # model-only step on exactly those batches, already in memory, with a second model and optimizer.
    full_model, full_opt, full_sched = fresh()
    only_model, only_opt, only_sched = fresh()
    stream = train_batches(data, vocab_size, seed=1, rank=0, world=1, start=0)
    full_s = model_s = wait_s = 0.0
    sums = MetricSums()
    for step0 in range(0, a.warmup + a.steps, a.chunk):
        n = min(a.chunk, a.warmup + a.steps - step0)
        timed = step0 >= a.warmup
        t0, w0, kept = time.perf_counter(), stream.wait_seconds, []
        for _ in range(n):
            micro = [next(stream) for _ in range(a.accum)]
            kept.append(micro)
            train_step(full_model, full_opt, [to_device(b, "cpu") for b in micro], scheduler=full_sched,
                       sums=sums if timed else None)
        t1 = time.perf_counter()
        for micro in kept:
            train_step(only_model, only_opt, [to_device(b, "cpu") for b in micro], scheduler=only_sched)
        t2 = time.perf_counter()
        if timed:
            full_s, model_s, wait_s = full_s + t1 - t0, model_s + t2 - t1, wait_s + stream.wait_seconds - w0
    stream.close()
    seqs, tokens = sums.sequences, sums.tokens

    result = {
        "preset": a.preset, "micro_batch_size": a.micro_batch_size, "accum": a.accum, "steps": a.steps,
        "threads": a.threads, "dynamic_masking": a.dynamic_masking, "length_bucketing": a.length_bucketing,
        "full_loop_sequences_per_second": round(seqs / full_s, 1),
        "model_only_sequences_per_second": round(seqs / model_s, 1),
        "full_over_model_only": round(model_s / full_s, 3),
        "tokens_per_second": round(tokens / full_s, 1),
        "data_wait_fraction": round(wait_s / full_s, 4),
        "mean_real_tokens_per_sequence": round(tokens / seqs, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
