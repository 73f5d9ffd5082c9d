"""How long and how fast a fine-tuning run trains: `ScheduleConfig`, read by the loop (`finetuning.loop`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleConfig:
    """How long and how fast: epochs, the global batch, the optimizer's rate and decay, evaluation batch size."""

    epochs: int = 3
    batch_size: int = 32  # global: split over the workers
    eval_batch_size: int = 64
    lr: float = 5e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_answer_length: int = 30  # QA: the longest answer span scored, in word pieces

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_batch_size", "max_answer_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        if not self.lr > 0 or not 0 <= self.warmup_ratio <= 1 or self.weight_decay < 0:
            raise ValueError("need --lr > 0, 0 <= --warmup-ratio <= 1 and --weight-decay >= 0")
