"""configs/quickstart.yaml as the workflow plans it: the pre-training stage evaluates on the held-out book during
training (several points under the step and time budgets), so the quickstart's eval_* charts are curves."""
from __future__ import annotations

from pathlib import Path

from jobs import pretrain
from workflows.config import load_config
from workflows.plan import plan

REPO = Path(__file__).resolve().parents[2]


def test_quickstart_pretraining_evaluates_during_training(tmp_path):
    stages = {s.name: s for s in plan(load_config(REPO / "configs" / "quickstart.yaml"), str(tmp_path))}
    args = pretrain.parse_args(stages["pretrain phase1"].argv)
    assert args.eval_data and args.eval_every > 0
    assert args.max_steps // args.eval_every >= 5  # a curve, not a dot: 5+ held-out points over the full --max-steps
    assert args.eval_every % args.log_every == 0  # each eval point lands beside a training point


def test_quickstart_trains_with_the_measured_defaults(tmp_path):
    """No --lr or --warm-up pinned (the quickstart once pinned 5e-4, a rate docs/learning-rates.md measured below the
    default): the jobs choose them for the model's width, as for any user who leaves them out."""
    from jobs import finetune
    from training.defaults import WARMUP_FRACTION

    stages = {s.name: s for s in plan(load_config(REPO / "configs" / "quickstart.yaml"), str(tmp_path))}
    args = pretrain.parse_args(stages["pretrain phase1"].argv)
    assert args.lr is None and args.warmup_steps is None
    tune = finetune.parse_args(stages["finetune rt_sentiment"].argv)
    assert tune.lr is None and tune.warmup_ratio == WARMUP_FRACTION


def test_quickstart_is_bounded_by_work_not_time(tmp_path):
    """A fixed number of steps and no wall-clock budget: a busy machine trains the same model, only later (issue 44:
    under load a 3-minute --max-minutes trained 50 of 1,500 steps and the fine-tune fell to one class)."""
    stages = {s.name: s for s in plan(load_config(REPO / "configs" / "quickstart.yaml"), str(tmp_path))}
    args = pretrain.parse_args(stages["pretrain phase1"].argv)
    assert args.max_minutes is None and args.max_steps == 1000
