"""The batches `benchmarks/gpu_step.py` times, with what each step is worth in FLOPs.

A `Step` is the micro-batches of one optimizer step (on the device) plus its real sequences and tokens, its model
FLOPs (`bert_core.flops.flops_per_sequence` summed over its real sequences: the MFU convention) and the FLOPs
bert_core and transformers each execute (`bert_core.flops.executed_flops`: padding, bert_core's last layer at
[CLS] + slots and head at every slot, transformers' full last layer and head at every position).

Two sources: synthetic full-length rows of a given shape, or the training loader itself over a built dataset
(length buckets, or packed rows with --packing), so real padding and packing are what gets timed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from bert_core import BertConfig, executed_flops, flops_per_sequence


@dataclass
class Step:
    micro: list[dict[str, torch.Tensor]]
    sequences: int
    tokens: int
    model_flops: float
    executed_ours: float
    executed_transformers: float  # 0.0 where transformers cannot run the batch (packed rows)


def _dense_labels(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """HF's (B, T) MLM labels from our (B, P) slots (padding slots sit at position 0, where nothing is masked)."""
    b, t = batch["input_ids"].shape
    dense = torch.full((b, t), -100, dtype=torch.long)
    dense.scatter_(1, batch["masked_lm_positions"], batch["masked_lm_labels"])
    dense[:, 0] = -100
    return dense


def _work(cfg: BertConfig, batches: list[dict[str, torch.Tensor]]) -> tuple[int, int, float, float, float]:
    """(sequences, tokens, model FLOPs, executed by bert_core, executed by transformers) of CPU micro-batches."""
    from pretraining.metrics import EXECUTED, executed_counts

    seqs = tokens = 0
    model = ours = theirs = 0.0
    for batch in batches:
        lengths = batch.get("sequence_lengths")
        if lengths is None:
            lengths = batch["attention_mask"].sum(1, keepdim=True)
        slots = (batch["masked_lm_labels"] != -100).sum(1)
        real = lengths[lengths > 0]
        seqs, tokens = seqs + real.numel(), tokens + int(real.sum())
        # a packed row's masked tokens split over its sequences by length: the head's FLOPs are linear in them, so
        # any split gives the same total
        masked = (slots[:, None] * lengths / lengths.sum(1, keepdim=True).clamp(min=1))[lengths > 0]
        model += sum(flops_per_sequence(cfg, int(n), num_masked=float(m)) for n, m in zip(real, masked, strict=False))
        counts = dict(zip(EXECUTED, (float(c) for c in executed_counts(batch, torch.device("cpu"))), strict=False))
        counts["sequences"] = counts.pop("pooled_rows")
        ours += executed_flops(cfg, **counts)
        if "sequence_lengths" not in batch:
            b, t = batch["input_ids"].shape
            theirs += executed_flops(cfg, positions=b * t, attention_pairs=b * t * t, query_rows=b * t,
                                     query_pairs=b * t * t, head_slots=b * t, sequences=b)
    return seqs, tokens, model, ours, theirs


def _step(cfg: BertConfig, micro: list[dict[str, torch.Tensor]], device: torch.device) -> Step:
    seqs, tokens, model, ours, theirs = _work(cfg, micro)
    for batch in micro:
        if "sequence_lengths" not in batch:
            batch["labels"] = _dense_labels(batch)
    return Step([{k: v.to(device) for k, v in b.items()} for b in micro], seqs, tokens, model, ours, theirs)


def synthetic_steps(cfg: BertConfig, seq_len: int, batch_size: int, masked: tuple[int, int], micro_batch: int,
                    n: int, device: torch.device, gen: torch.Generator) -> list[Step]:
    """`n` steps of `batch_size` full-length rows (no padding), `masked` = (fewest, most) masked tokens per row
    (drawn per row; slots padded to the most), cut into micro-batches of `micro_batch` rows."""
    lo, hi = masked
    steps = []
    for _ in range(n):
        micro = []
        for _ in range(batch_size // micro_batch):
            b, t, p = micro_batch, seq_len, hi
            n_masked = torch.randint(lo, hi + 1, (b,), generator=gen)
            positions = torch.stack([torch.randperm(t - 2, generator=gen)[:p].sort().values + 1 for _ in range(b)])
            labels = torch.randint(1000, cfg.vocab_size, (b, p), generator=gen)
            pad = torch.arange(p) >= n_masked[:, None]
            positions[pad], labels[pad] = 0, -100
            micro.append(dict(input_ids=torch.randint(1000, cfg.vocab_size, (b, t), generator=gen),
                              attention_mask=torch.ones(b, t, dtype=torch.long),
                              token_type_ids=(torch.arange(t) >= t // 2).long().expand(b, t).contiguous(),
                              masked_lm_positions=positions, masked_lm_labels=labels,
                              next_sentence_label=torch.randint(0, 2, (b,), generator=gen)))
        steps.append(_step(cfg, micro, device))
    return steps


def dataset_steps(cfg: BertConfig, data: str, batch_size: int, micro_batch: int, packing: bool,
                  pack_sequences: int, n: int, device: torch.device) -> list[Step]:
    """The first `n` steps the training loader (rank 0 of 1) yields from the dataset at `data`: padded to its
    length buckets with length bucketing, or packed."""
    from corpus.schema import read_manifest
    from pretraining.loader import DataConfig, train_batches

    shards = read_manifest(data)
    config = DataConfig(train=shards, micro_batch_size=micro_batch, accum=batch_size // micro_batch,
                        packing=packing, pack_sequences=pack_sequences)
    batches = train_batches(config, cfg.vocab_size, seed=0, rank=0, world=1, start=0)
    try:
        return [_step(cfg, [{k: torch.from_numpy(v) for k, v in next(batches).items()}
                            for _ in range(config.accum)], device) for _ in range(n)]
    finally:
        batches.close()
