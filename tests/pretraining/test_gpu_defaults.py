"""GPU defaults that would pass silently if wrong (issue 24). Skipped without a GPU.

- CUDA graphs (`--cuda-graphs`): Inductor may skip recording a graph (a CPU tensor, a mutated input, dynamic
  shapes) and run the step without it, training the same: the test counts Inductor's `cudagraph_skips` and wants 0.
- The compiled packed step with dropout against the padded one: tests/bert_core/test_packed_model_gpu.py."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from bert_core import bert_tiny
from pipeline.schema import read_manifest
from pretraining.config import ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
from pretraining.loader import DataConfig
from pretraining.loop import fit
from tracking.config import TrackingConfig

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _config(data: str, dropout: float, steps: int, **runtime) -> PretrainConfig:
    vocab = Path(data, "vocab.txt").read_text().splitlines()
    return PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=len(vocab), max_position_embeddings=128,
                                         hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)),
        data=DataConfig(train=read_manifest(data), micro_batch_size=32, mask_id=vocab.index("[MASK]")),
        max_steps=steps, optimizer=OptimizerConfig(lr=1e-3), tracking=TrackingConfig(log_every=1),
        runtime=RuntimeConfig(device="cuda", compile_warmup_steps=2, peak_flops=989e12, **runtime),
    )


def test_cuda_graphs_are_recorded_not_skipped(varied_pretrain_data):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    result = fit(_config(varied_pretrain_data, 0.1, 6, cuda_graphs=True))
    assert result.step == 6 and all(math.isfinite(m["loss"]) for _, m in result.history)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
