"""Throughput, MFU of real tokens and data wait over a logging window, with compile warm-up kept out.

MFU counts the useful FLOPs of the tokens actually trained on (`bert_core.flops`: the mean real length per
sequence, the masked positions actually predicted), not the padded shapes, against the accelerator's peak.
"""
from __future__ import annotations

import time

import torch

from bert_core.config import BertConfig
from bert_core.flops import flops_per_sequence
from training.metrics import MetricSums

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
    """seq/s, real tokens/s, data-wait fraction and (with a peak) mfu, from all ranks' sums over `seconds`."""
    seconds = max(seconds, 1e-9)
    seqs = max(sums.sequences, 1.0)
    out = {"sequences_per_second": sums.sequences / seconds, "tokens_per_second": sums.tokens / seconds,
           "data_wait_fraction": min(1.0, wait_seconds / seconds)}
    if peak:
        per_seq = flops_per_sequence(config, round(sums.tokens / seqs), num_masked=sums.masked / seqs)
        out["mfu"] = per_seq * out["sequences_per_second"] / (peak * world)
    return out


class Window:
    """A logging window's clock, data wait and the sums of the steps that count for throughput.

    `exclude()` after a warm-up step (compilation) restarts the clock and remembers the sums so far (a device
    tensor copy, no sync): the throughput of the window then covers only the steps after it.
    """

    def __init__(self, wait_seconds: float) -> None:
        self.start, self.wait0, self.base = time.perf_counter(), wait_seconds, None

    def exclude(self, sums: MetricSums, wait_seconds: float) -> None:
        self.base = sums.values.clone()
        self.start, self.wait0 = time.perf_counter(), wait_seconds

    def pause(self, seconds: float) -> None:
        """Time spent on something else (evaluation) does not count."""
        self.start += seconds

    def counted(self, sums: MetricSums) -> MetricSums:
        return sums if self.base is None else MetricSums(sums.values - self.base.to(sums.values.device))
