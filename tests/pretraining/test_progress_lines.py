"""The pre-training loop speaks at least once a (shortened) minute while a step is slower than that, and states the
run's estimated length with the CPU advice: a slow step stands in for a bert_base step on 2 CPUs (minutes)."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch

from bert_core import bert_tiny
from corpus.schema import read_manifest
from pretraining import loop
from pretraining.config import ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
from pretraining.loader import DataConfig
from tracking.config import TrackingConfig
from training import progress

pytestmark = pytest.mark.timeout(300)


def test_a_slow_step_gets_a_line_every_heartbeat_and_an_estimate_with_advice(tiny_pretrain_data, monkeypatch,
                                                                             caplog):
    torch.set_num_threads(1)
    monkeypatch.setattr(progress, "HEARTBEAT", 0.3)  # a minute, shrunk with the step
    monkeypatch.setattr(progress, "HOURS", 1.0)  # "hours", shrunk the same way
    real_step = loop.train_step

    def slow_step(*args, **kwargs):
        time.sleep(0.8)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", slow_step)
    shards = read_manifest(tiny_pretrain_data["train"])
    vocab = Path(tiny_pretrain_data["train"], "vocab.txt").read_text().splitlines()
    config = PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=len(vocab), max_position_embeddings=64)),
        data=DataConfig(train=shards, micro_batch_size=4, accum=1, mask_id=vocab.index("[MASK]")),
        max_steps=4, optimizer=OptimizerConfig(lr=1e-3, warmup_steps=1),
        tracking=TrackingConfig(log_every=100), runtime=RuntimeConfig(device="cpu", threads=1, seed=1))
    with caplog.at_level(logging.INFO, logger="pretraining.loop"):
        loop.fit(config)
    lines = [r.getMessage() for r in caplog.records if r.name == "pretraining.loop"]
    assert any(m.startswith("step 1/4 has been running for") and "the run will take at least" in m
               and "--use-gpu" in m for m in lines), lines
    assert any("estimated run length" in m and "hours on CPU" in m and "smaller --preset" in m for m in lines), lines
