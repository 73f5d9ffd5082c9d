"""Throughput figures: MFU of real tokens (mean real length, real masked positions), and warm-up kept out."""
from __future__ import annotations

import pytest
import torch

from bert_core import bert_base
from bert_core.flops import flops_per_sequence
from pretraining.metrics import FIELDS, MetricSums
from pretraining.perf import RunTotals, Window, throughput


def sums(sequences: float, tokens: float, masked: float, positions: float) -> MetricSums:
    v = torch.zeros(len(FIELDS), dtype=torch.float64)
    for name, value in (("sequences", sequences), ("tokens", tokens), ("mlm_count", masked),
                        ("positions", positions)):
        v[FIELDS.index(name)] = value
    return MetricSums(v)


def test_mfu_counts_real_tokens_and_real_masks():
    cfg = bert_base()
    s = sums(sequences=256, tokens=256 * 112, masked=256 * 17, positions=256 * 128)
    out = throughput(s, seconds=0.1, wait_seconds=0.001, config=cfg, peak=989e12, world=1)
    assert out["sequences_per_second"] == pytest.approx(2560)
    assert out["data_wait_fraction"] == pytest.approx(0.01)
    assert out["padding_fraction"] == pytest.approx(1 - 112 / 128)
    expected = flops_per_sequence(cfg, 112, num_masked=17) * 2560 / 989e12
    assert out["mfu"] == pytest.approx(expected)
    assert out["mfu"] < flops_per_sequence(cfg, 128) * 2560 / 989e12  # padding is not useful work
    two = throughput(s, 0.1, 0.001, cfg, 989e12, world=2)
    assert two["mfu"] == pytest.approx(expected / 2)  # the peak of two GPUs
    assert "mfu" not in throughput(s, 0.1, 0.0, cfg, None, 1)


def test_window_counts_only_steps_after_warmup():
    running = sums(4, 400, 40, 512)
    w = Window(wait_seconds=0.0, counting=False)
    assert w.counted(running).sequences == 0  # a warm-up window shows no throughput
    w.exclude(running, wait_seconds=0.0)
    later = MetricSums(running.values + sums(8, 800, 80, 1024).values)
    assert w.counted(later).sequences == 8 and w.counted(later).tokens == 800
    totals = RunTotals()
    totals.add(w.counted(later), 2.0, 0.5)
    totals.add(sums(8, 800, 80, 1024), 2.0, 0.5)
    summary = totals.summary(bert_base(), None, 1)
    assert summary["sequences_per_second"] == pytest.approx(4.0) and summary["data_wait_fraction"] == 0.25
    assert summary["mean_real_tokens"] == pytest.approx(100)


def test_executed_counts_of_padded_and_packed_batches():
    from bert_core.flops import executed_flops, executed_flops_per_batch
    from pretraining.metrics import EXECUTED, executed_counts

    cfg = bert_base()
    padded = {"input_ids": torch.zeros(4, 128, dtype=torch.long), "masked_lm_positions": torch.zeros(4, 20)}
    counts = dict(zip(EXECUTED, (float(c) for c in executed_counts(padded, torch.device("cpu"))), strict=False))
    counts["sequences"] = counts.pop("pooled_rows")
    assert executed_flops(cfg, **counts) == pytest.approx(executed_flops_per_batch(cfg, 4, 128, 20))
    # one packed row of 7 positions: sequences of 3 and 2 tokens, an unused place, 2 positions of padding
    packed = {"input_ids": torch.zeros(1, 7, dtype=torch.long), "masked_lm_positions": torch.zeros(1, 4),
              "sequence_lengths": torch.tensor([[3, 2, 0]])}
    got = dict(zip(EXECUTED, (float(c) for c in executed_counts(packed, torch.device("cpu"))), strict=False))
    # blocks 3, 2 and the padding's 2: 9 + 4 + 4 pairs; 3 [CLS] rows + 4 slots at the mean block length 17 / 7
    assert got == pytest.approx({"positions": 7, "attention_pairs": 17, "query_rows": 7, "query_pairs": 17,
                                 "head_slots": 4, "pooled_rows": 3})


def test_hfu_counts_what_was_executed():
    from bert_core.flops import executed_flops

    cfg = bert_base()
    s = sums(sequences=256, tokens=256 * 112, masked=256 * 17, positions=256 * 128)
    executed = {"attention_pairs": 256 * 128 * 128, "query_rows": 256 * 21, "query_pairs": 256 * 21 * 128,
                "head_slots": 256 * 20, "pooled_rows": 256}
    for name, value in executed.items():
        s.values[FIELDS.index(name)] = value
    out = throughput(s, seconds=0.1, wait_seconds=0.0, config=cfg, peak=989e12, world=1)
    counts = {**{k: v for k, v in executed.items() if k != "pooled_rows"}, "sequences": 256, "positions": 256 * 128}
    assert out["hfu"] == pytest.approx(executed_flops(cfg, **counts) * 10 / 989e12)
    assert out["hfu"] > out["mfu"]  # 12.5% padding and 3 empty slots per row cost more than the last layer saves
