"""training.fit on one CUDA GPU: bf16 autocast and torch.compile on by default, pinned asynchronous copies, and the
run's MFU of real tokens and data wait reported with the compile warm-up left out. Skipped without a GPU."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from bert_core import bert_tiny
from training import DataConfig, ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig, TrackingConfig, fit
from pipeline.schema import read_manifest
from training.loader import ShardSet

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_compiled_bf16_fit_reports_mfu_of_real_tokens(varied_pretrain_data):
    vocab = Path(varied_pretrain_data, "vocab.txt").read_text().splitlines()
    config = PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=len(vocab), max_position_embeddings=64)),
        data=DataConfig(train=ShardSet.from_manifest(read_manifest(varied_pretrain_data)), micro_batch_size=32,
                        mask_id=vocab.index("[MASK]")),
        max_steps=12, optimizer=OptimizerConfig(lr=1e-3), tracking=TrackingConfig(log_every=4),
        runtime=RuntimeConfig(device="cuda", compile_warmup_steps=4, peak_flops=989e12),
    )
    result = fit(config)
    assert result.step == 12
    assert all(math.isfinite(m["loss"]) for _, m in result.history)
    tp = result.throughput
    assert tp["sequences"] == 8 * 32  # steps 5..12 counted, the 4 compile warm-up steps left out
    assert 0 < tp["mfu"] < 1 and 0 <= tp["data_wait_fraction"] <= 1
    assert "mfu" not in result.history[0][1]  # the first window (steps 1-4) is all warm-up
