"""torch.compile on real shards, CPU: the loader's fixed widths and padded masked slots keep Dynamo to one graph
per length bucket, all compiled before the first step and never again; compiled and eager runs train alike.

Dynamo decides what to (re)compile before any backend runs, so `aot_eager` (Dynamo + AOTAutograd, no code
generation) sees exactly the graphs and recompiles that inductor would, in a fraction of the time on a small CPU.
"""
from __future__ import annotations

import pytest
import torch

from bert_core import bert_tiny
from corpus.schema import read_manifest
from pretraining.config import ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
from pretraining.loader import DataConfig, train_batches
from pretraining.loop import fit
from tracking.config import TrackingConfig
from tracking.tracker import NullTracker
from training.worker import Worker

pytestmark = pytest.mark.timeout(600)
STEPS = 32  # one bucketing window of 32 micro-batches: its shortest batch is among them
BUCKETS = (32, 48, 56, 64)


class GraphCounter(NullTracker):
    """A tracker that also notes, at each logged step, how many graphs Dynamo has compiled so far."""

    def __init__(self) -> None:
        from torch._dynamo.utils import counters

        super().__init__()
        self.graphs: dict[int, int] = {}
        # Dynamo's counters are per process and torch._dynamo.reset() keeps them: count from here.
        self._base = int(counters["stats"]["unique_graphs"])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from torch._dynamo.utils import counters

        super().log(metrics, step)
        self.graphs[step] = int(counters["stats"]["unique_graphs"]) - self._base


def config_for(data: str, compile_model: bool, steps: int = STEPS, seed: int = 3) -> PretrainConfig:
    from pathlib import Path

    vocab = Path(data, "vocab.txt").read_text().splitlines()
    return PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=len(vocab), max_position_embeddings=64,
                                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
        data=DataConfig(train=read_manifest(data), micro_batch_size=4, bucket_window=32,
                        length_buckets=BUCKETS, mask_id=vocab.index("[MASK]")),
        max_steps=steps, optimizer=OptimizerConfig(lr=1e-3),
        tracking=TrackingConfig(log_every=1),
        runtime=RuntimeConfig(device="cpu", threads=1, compile=compile_model, compile_backend="aot_eager", seed=seed),
    )


def widths_per_step(config: PretrainConfig) -> list[int]:
    """The padded width of each step's batch (accum = 1), read from the same deterministic stream fit reads."""
    batches = train_batches(config.data, config.model.bert.vocab_size, config.runtime.seed, 0, 1, 0)
    try:
        return [int(next(batches)["input_ids"].shape[1]) for _ in range(config.max_steps)]
    finally:
        batches.close()


def several_widths(data: str) -> tuple[PretrainConfig, list[int]]:
    """The first seed whose first STEPS batches land in several length buckets (about 6% of the fixture's rows are
    short: a seed's first window can hold too few of them for a short batch), and its widths per step."""
    for seed in range(3, 13):
        config = config_for(data, compile_model=True, seed=seed)
        per_step = widths_per_step(config)
        if len(set(per_step)) >= 2:
            return config, per_step
    raise AssertionError("no seed of 3..12 exercises several length buckets: the fixture's rows are too uniform")


def test_compiled_fit_stops_compiling_after_warmup(varied_pretrain_data):
    torch._dynamo.reset()
    config, per_step = several_widths(varied_pretrain_data)
    widths = set(per_step)
    assert widths <= set(BUCKETS)
    counter = GraphCounter()
    fit(config, Worker(tracker=counter))
    graphs = [counter.graphs[s] for s in range(1, STEPS + 1)]
    # fit compiles every bucket before step 1 (RuntimeConfig.precompile_buckets): one graph per bucket, then none.
    assert graphs[-1] <= len(BUCKETS), f"more graphs than length buckets: {graphs} for widths {per_step}"
    assert graphs[0] == graphs[-1], f"still compiling after the first step: {graphs} for widths {per_step}"


def test_compiled_and_eager_losses_agree(varied_pretrain_data):
    torch._dynamo.reset()
    eager = fit(config_for(varied_pretrain_data, compile_model=False, steps=4))
    compiled = fit(config_for(varied_pretrain_data, compile_model=True, steps=4))
    for (s1, a), (s2, b) in zip(eager.history, compiled.history, strict=False):
        assert s1 == s2
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), s1
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3), s1
    assert len(eager.history) == len(compiled.history) == 4
