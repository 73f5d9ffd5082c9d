"""Learning rates and warm-up chosen for the model being trained, when the command line does not set them.

One place resolves every `None` default: `default_lr(preset_or_width, kind)` and `default_warmup_steps`. An
explicit --lr always wins; the jobs log the value resolved here (and it is in the run's MLflow params).

Where the numbers come from (docs/learning-rates.md has the table, the command, the machine and the date):
- At the narrow end, the sweep `benchmarks/lr_sweep.py` on this project's shared corpora and tasks: bert_tiny
  (hidden width 128) pre-trained 400 steps of 32 sequences at seq 128 with 10% warm-up (4 rates), and fine-tuned
  from it for 3 epochs on rt_sentiment (4 rates); seeds and the figures in docs/learning-rates.md.
- At BERT-base's width (768), the paper's rates: 1e-4 for pre-training (Devlin et al. 2019, batch 256, 10k warm-up
  steps) and 5e-5 for fine-tuning (the top of its 2e-5..5e-5 grid, the previous default here).
- Between and beyond them, log-linear in the width (rate ~ width^-p through the two anchors), clamped outside.
  That is a projection for bert_mini .. bert_medium, not a measurement: on the shared 2-core machine a bert_mini
  pre-training of 400 steps ran at 0.12 steps/s (about an hour) and was not swept.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

log = logging.getLogger(__name__)

KINDS = ("pretrain", "finetune")
# Warm-up on by default: this fraction of the run's optimizer steps ramps the rate linearly from 0 (pre-training's
# --warmup-steps, fine-tuning's --warmup-ratio). A small model at a high rate without it diverged or stalled early.
WARMUP_FRACTION = 0.1
# (hidden width, learning rate) anchors per kind, narrow to wide.
ANCHORS: dict[str, tuple[tuple[int, float], ...]] = {
    "pretrain": ((128, 2e-3), (768, 1e-4)),  # 128: measured (bert_tiny, docs/learning-rates.md); 768: BERT paper
    "finetune": ((128, 1e-3), (768, 5e-5)),  # 128: measured (from the sweep's bert_tiny); 768: BERT paper
}


def model_width(preset_or_width: str | int | Path) -> int:
    """The hidden width of a preset name, a model directory (its config.json) or a width given as a number."""
    if isinstance(preset_or_width, int):
        return preset_or_width
    from bert_core import PRESETS

    name = str(preset_or_width)
    if name in PRESETS:
        return PRESETS[name]().hidden_size
    config = Path(name) / "config.json"
    if not config.is_file():
        config = Path(name) / "model" / "config.json"  # a checkpoint directory
    if config.is_file():
        return int(json.loads(config.read_text())["hidden_size"])
    raise ValueError(f"{name!r} is neither a preset ({', '.join(PRESETS)}) nor a model directory with a config.json: "
                     "pass --lr explicitly")


def default_lr(preset_or_width: str | int | Path, kind: str) -> float:
    """The learning rate for a model of this preset / width, `kind` "pretrain" or "finetune" (AdamW, linear decay,
    warm-up WARMUP_FRACTION), rounded to two significant digits."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: use one of {', '.join(KINDS)}")
    width = model_width(preset_or_width)
    (w0, lr0), (w1, lr1) = ANCHORS[kind]
    t = min(1.0, max(0.0, (math.log(width) - math.log(w0)) / (math.log(w1) - math.log(w0))))
    lr = math.exp(math.log(lr0) + t * (math.log(lr1) - math.log(lr0)))
    return float(f"{lr:.2g}")


def default_warmup_steps(max_steps: int) -> int:
    """Pre-training's warm-up: WARMUP_FRACTION of the steps."""
    return round(WARMUP_FRACTION * max_steps)


def lr_or_default(lr: float | None, width: int, kind: str) -> float:
    """--lr as given, else `default_lr` for the model's width, said in the log (the jobs' one resolution)."""
    if lr is not None:
        return lr
    value = default_lr(width, kind)
    log.info("--lr %g: the default for a model of hidden width %d (pass --lr to choose; docs/learning-rates.md)",
             value, width)
    return value


def warmup_or_default(steps: int | None, max_steps: int) -> int:
    """--warmup-steps as given, else `default_warmup_steps`, said in the log."""
    if steps is not None:
        return steps
    value = default_warmup_steps(max_steps)
    log.info("--warmup-steps %d: %.0f%% of --max-steps %d (pass --warmup-steps to choose, 0 for none)", value,
             100 * WARMUP_FRACTION, max_steps)
    return value


EVAL_POINTS = 5  # a pre-training run's evaluations by default: enough for a curve of held-out accuracy, at little cost


def eval_every_or_default(every: int | None, max_steps: int, log_every: int) -> int:
    """--eval-every as given, else about EVAL_POINTS evaluations over the run, on logging steps (and one at the
    end), said in the log."""
    if every is not None:
        return every
    value = max(1, -(-max_steps // EVAL_POINTS))
    if log_every < value:  # on a logging step: each held-out point beside a training one
        value = -(-value // log_every) * log_every
    log.info("--eval-every %d: %d evaluations over --max-steps %d (pass --eval-every to choose, 0 for the end only)",
             value, -(-max_steps // value), max_steps)
    return value
