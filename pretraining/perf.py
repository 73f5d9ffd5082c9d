"""Throughput, MFU of real tokens and data wait over a logging window, with compile warm-up kept out.

MFU counts the useful FLOPs of the tokens actually trained on (`bert_core.flops.flops_per_sequence`: the mean real
length per sequence, the masked positions actually predicted, every encoder layer in full), not the padded shapes,
against the accelerator's peak. `hfu` (hardware FLOPs utilisation) counts what the model executed instead
(`bert_core.flops.executed_flops`: padding, the last layer at [CLS] + slots, every head slot): how busy the
device was, where MFU says how much of it was useful.
"""
from __future__ import annotations

import time

import torch

from bert_core.config import BertConfig
from bert_core.flops import executed_flops, flops_per_sequence
from pretraining.metrics import MetricSums

# Dense bf16 peaks (FLOP/s) by device-name fragment; --peak-tflops overrides.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}


def peak_flops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def throughput(sums: MetricSums, seconds: float, wait_seconds: float, config: BertConfig, peak: float | None,
               world: int) -> dict[str, float]:
    """seq/s, real tokens/s, data-wait fraction and (with a peak) mfu and hfu, from all ranks' sums over
    `seconds`."""
    seconds = max(seconds, 1e-9)
    seqs = max(sums.sequences, 1.0)
    out = {"sequences_per_second": sums.sequences / seconds, "tokens_per_second": sums.tokens / seconds,
           "data_wait_fraction": min(1.0, wait_seconds / seconds),
           "padding_fraction": 1.0 - sums.tokens / max(sums.positions, 1.0)}
    if peak:
        per_seq = flops_per_sequence(config, round(sums.tokens / seqs), num_masked=sums.masked / seqs)
        out["mfu"] = per_seq * out["sequences_per_second"] / (peak * world)
        out["hfu"] = executed_flops(config, **sums.executed()) / seconds / (peak * world)
    return out


class RunTotals:
    """The counted (post-warm-up) sums, seconds and data wait of every logging window of a run, on the host."""

    def __init__(self) -> None:
        self.sums, self.seconds, self.wait = MetricSums(), 0.0, 0.0

    def add(self, counted: MetricSums, seconds: float, wait: float) -> None:
        self.sums = MetricSums(self.sums.values + counted.values.cpu())
        self.seconds += seconds
        self.wait += wait

    def summary(self, config: BertConfig, peak: float | None, world: int) -> dict[str, float]:
        if self.sums.sequences <= 0:
            return {}
        out = throughput(self.sums, self.seconds, self.wait, config, peak, world)
        out.update(seconds=self.seconds, sequences=self.sums.sequences,
                   mean_real_tokens=self.sums.tokens / self.sums.sequences)
        return out


class Window:
    """A logging window's clock, data wait and the sums of the steps that count for throughput.

    A window opened during warm-up (compilation) does not count until `exclude()` is called after the last warm-up
    step: that restarts the clock and remembers the sums so far (a device tensor copy, no sync), so the window's
    throughput covers only the steps after it.
    """

    def __init__(self, wait_seconds: float, counting: bool = True) -> None:
        self.start, self.wait0, self.base, self.counting = time.perf_counter(), wait_seconds, None, counting

    def exclude(self, sums: MetricSums, wait_seconds: float) -> None:
        self.base = sums.values.clone()
        self.start, self.wait0, self.counting = time.perf_counter(), wait_seconds, True

    def pause(self, seconds: float) -> None:
        """Time spent on something else (evaluation) does not count."""
        self.start += seconds

    def counted(self, sums: MetricSums) -> MetricSums:
        """The sums of the counted steps (all zero while the window does not count)."""
        if not self.counting:
            return MetricSums(torch.zeros_like(sums.values))
        return sums if self.base is None else MetricSums(sums.values - self.base.to(sums.values.device))
