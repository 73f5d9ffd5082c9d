"""How much of a built dataset's batches is padding, per way of batching it: one pass of the loader over the data.

    python benchmarks/padding.py --data DIR                       # e.g. a seq-512 build of ../shared/data/corpora
    python benchmarks/padding.py --data DIR --micro-batch-size 32 --pack-sequences 3

Runs the training loader itself (`pretraining.loader.train_batches`, rank 0 of 1, no model) over the first epoch's
rows and counts real tokens against the positions a model would compute on:

- `pad to max`: every batch padded to max_seq_length (what a loader without bucketing pays);
- `buckets`: the loader's default, batches padded to the smallest length bucket (multiples of max_seq_length / 4)
  that fits, with length bucketing (rows of similar length batched together, `bucket_window` micro-batches sorted);
- `packed`: `--packing`, sequences laid end to end in max_seq_length-wide rows (at most S per row).

Also prints the MLM slots the static head runs that hold no masked token, and, per way, the executed/model FLOPs
ratio for BERT-base (`bert_core.flops`; packed attention counted as the variable-length kernel runs it).
"""
from __future__ import annotations

import argparse
import json
import sys

import torch


def measure(data_config, rows_total: int, vocab_size: int) -> dict[str, float]:
    from bert_core import bert_base, executed_flops, flops_per_sequence
    from pretraining.loader import train_batches
    from pretraining.metrics import FIELDS, MetricSums

    class Out:  # what MetricSums.add reads from a model output: only counts here
        def __init__(self, batch):
            labels = batch["masked_lm_labels"]
            self.mlm_count = (labels != -100).sum()
            self.nsp_count = (batch["next_sentence_label"] != -100).sum()
            self.mlm_loss = self.nsp_loss = torch.zeros(())
            self.mlm_correct = self.nsp_correct = torch.zeros((), dtype=torch.long)

    batches = train_batches(data_config, vocab_size, seed=12345, rank=0, world=1, start=0)
    sums, slots = MetricSums(), 0
    try:
        while sums.sequences < rows_total:
            batch = {k: torch.from_numpy(v) for k, v in next(batches).items()}
            sums.add(Out(batch), batch)
            slots += batch["masked_lm_labels"].numel()
    finally:
        batches.close()
    v = dict(zip(FIELDS, sums.values.tolist(), strict=False))
    cfg = bert_base()
    model = flops_per_sequence(cfg, round(v["tokens"] / v["sequences"]), v["mlm_count"] / v["sequences"])
    return {"sequences": v["sequences"], "real_tokens": v["tokens"], "positions": v["positions"],
            "padding": 1 - v["tokens"] / v["positions"], "empty_mlm_slots": 1 - v["mlm_count"] / slots,
            "executed_over_model_flops": executed_flops(cfg, **sums.executed()) / (model * v["sequences"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a dataset built by jobs/build_dataset.py")
    p.add_argument("--micro-batch-size", type=int, default=32, help="rows (or packed rows) per micro-batch")
    p.add_argument("--pack-sequences", type=int, default=3, help="at most this many sequences per packed row")
    a = p.parse_args(argv)

    from corpus.schema import read_manifest
    from pretraining.loader import DataConfig

    shards = read_manifest(a.data)
    total = sum(shards.shard_rows)
    ways = {
        "pad to max": DataConfig(train=shards, micro_batch_size=a.micro_batch_size, length_bucketing=False,
                                 length_buckets=(shards.max_seq_length,)),
        "buckets": DataConfig(train=shards, micro_batch_size=a.micro_batch_size),
        "packed": DataConfig(train=shards, micro_batch_size=a.micro_batch_size, packing=True,
                             pack_sequences=a.pack_sequences),
    }
    print(f"# {a.data}: {total} rows, max_seq_length {shards.max_seq_length}, micro-batch {a.micro_batch_size}, "
          f"buckets {list(ways['buckets'].length_buckets)}")
    for name, config in ways.items():
        r = measure(config, total, 30522)
        print(json.dumps({"way": name, **{k: round(v, 4) for k, v in r.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
