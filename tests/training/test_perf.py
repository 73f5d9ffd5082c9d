"""Throughput figures: MFU of real tokens (mean real length, real masked positions), and warm-up kept out."""
from __future__ import annotations

import pytest
import torch

from bert_core import bert_base
from bert_core.flops import flops_per_sequence
from training.metrics import FIELDS, MetricSums
from training.perf import RunTotals, Window, throughput


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
