"""Pre-training's held-out evaluation flags (``jobs/pretrain.py``): --eval-data, --eval-sequences, --eval-every,
checked together (the last two need the first) and parsed into ``pretraining.loader.EvalConfig``. By default a
run with --eval-data evaluates at a few points (``training.defaults.eval_every_or_default``), so eval_* metrics
are curves."""
from __future__ import annotations

import argparse

from corpus.schema import read_manifest
from pretraining.loader import EvalConfig
from training.defaults import EVAL_POINTS, eval_every_or_default


def add_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("held-out evaluation")
    g.add_argument("--eval-data", help="held-out dataset (same vocabulary) for eval_* metrics")
    # --eval-sequences and --eval-every default to None, not to EvalConfig's values: check() refuses them without
    # --eval-data only when given, and eval_config() puts the defaults in (--eval-every's follows the run's length).
    g.add_argument("--eval-sequences", type=int,
                   help=f"eval on the first N sequences (0 = all) (default: {EvalConfig.sequences})")
    g.add_argument("--eval-every", type=int,
                   help=f"evaluate on --eval-data every N steps and at the end (0: only at the end). Default: "
                        f"{EVAL_POINTS} evaluations over the run, so eval_* metrics are curves")


def check(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """p.error (one line, exit 2) for a negative --eval-every, or --eval-every/--eval-sequences without --eval-data."""
    if a.eval_every is not None and a.eval_every < 0:
        p.error("--eval-every must be >= 0 (0: only at the end)")
    given = " and ".join(f for f, v in (("--eval-every", a.eval_every), ("--eval-sequences", a.eval_sequences))
                         if v is not None)
    if given and not a.eval_data:
        p.error(f"{given} without --eval-data: pass the held-out dataset to evaluate on, or drop {given}")


def eval_config(a: argparse.Namespace) -> EvalConfig | None:
    """The run's EvalConfig (None without --eval-data); its manifest read now, so a bad URL fails at start."""
    if not a.eval_data:
        return None
    return EvalConfig(data=read_manifest(a.eval_data, a.endpoint_url),
                      every=eval_every_or_default(a.eval_every, a.max_steps, a.log_every),
                      sequences=EvalConfig.sequences if a.eval_sequences is None else a.eval_sequences)
