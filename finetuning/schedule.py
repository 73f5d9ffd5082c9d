"""How long and how fast a fine-tuning run trains: `ScheduleConfig`, read by the loop (`finetuning.loop`)."""
from __future__ import annotations

from dataclasses import dataclass

from training.defaults import WARMUP_FRACTION


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """How long and how fast: epochs, the global batch, the optimizer's rate and decay, evaluation batch size."""

    epochs: int = 3
    """Passes over the training data, each one evaluated; the best epoch's model is kept. 3: the reference
    run_classifier.py's default."""
    batch_size: int = 32
    """The global batch, in examples, split evenly over the workers (it must divide by their number); 32: the
    reference's, in the paper's grid of 16 and 32."""
    eval_batch_size: int = 64
    """Examples per forward pass at evaluation, on each worker."""
    lr: float = 5e-5
    """Peak learning rate of AdamW (linear warm-up, then linear decay to 0). 5e-5: the top of the BERT paper's grid;
    jobs/finetune.py without --lr passes the default for the model's width instead (training/defaults.py)."""
    warmup_ratio: float = WARMUP_FRACTION
    """Fraction of the optimizer steps over which the rate ramps up from 0; 0.1 is
    `training.defaults.WARMUP_FRACTION`, the reference's warmup_proportion."""
    weight_decay: float = 0.01
    """AdamW's weight decay on the weight matrices (biases and LayerNorm are exempt, as in the reference); 0.01 is
    the reference's."""
    max_answer_length: int = 30
    """QA: the longest answer span considered at prediction, in word pieces; 30, as in the reference run_squad.py."""

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_batch_size", "max_answer_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        if not self.lr > 0 or not 0 <= self.warmup_ratio <= 1 or self.weight_decay < 0:
            raise ValueError("need --lr > 0, 0 <= --warmup-ratio <= 1 and --weight-decay >= 0")
