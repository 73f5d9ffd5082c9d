"""pretraining.loop.fit on one CUDA GPU: bf16 autocast and torch.compile on by default, pinned asynchronous copies, and
the run's MFU of real tokens and data wait reported with the compile warm-up left out. Skipped without a GPU."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from bert_core import bert_tiny
from corpus.schema import read_manifest
from pretraining.config import ModelConfig, OptimizerConfig, PretrainConfig, RuntimeConfig
from pretraining.loader import DataConfig
from pretraining.loop import fit
from tracking.config import TrackingConfig

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_compiled_bf16_fit_reports_mfu_of_real_tokens(varied_pretrain_data):
    vocab = Path(varied_pretrain_data, "vocab.txt").read_text().splitlines()
    config = PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=len(vocab), max_position_embeddings=64)),
        data=DataConfig(train=read_manifest(varied_pretrain_data), micro_batch_size=32,
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


def _config(data: str, **runtime) -> PretrainConfig:
    vocab = Path(data, "vocab.txt").read_text().splitlines()
    return PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=len(vocab), max_position_embeddings=64, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0)),
        data=DataConfig(train=read_manifest(data), micro_batch_size=32, mask_id=vocab.index("[MASK]")),
        max_steps=6, optimizer=OptimizerConfig(lr=1e-3), tracking=TrackingConfig(log_every=1),
        runtime=RuntimeConfig(device="cuda", compile_warmup_steps=2, peak_flops=989e12, **runtime),
    )


def test_cuda_graphs_train_like_the_plain_compiled_step(varied_pretrain_data):
    """--cuda-graphs replays the same computation: the same losses (dropout off) as the compiled step without."""
    plain = fit(_config(varied_pretrain_data))
    graphs = fit(_config(varied_pretrain_data, cuda_graphs=True))
    for (s1, a), (s2, b) in zip(plain.history, graphs.history, strict=False):
        assert s1 == s2 and b["loss"] == pytest.approx(a["loss"], rel=1e-3), s1
    assert len(graphs.history) == 6


def test_packed_fit_on_cuda_reports_mfu_and_hfu(varied_pretrain_data):
    import dataclasses

    config = _config(varied_pretrain_data)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, packing=True, pack_width=128))
    result = fit(config)
    tp = result.throughput
    assert all(math.isfinite(m["loss"]) for _, m in result.history)
    assert tp["sequences"] > 4 * 32  # steps 3..6, more than one sequence per 128-wide packed row
    assert 0 < tp["mfu"] < 1 and 0 < tp["hfu"] < 1 and tp["padding_fraction"] < 0.2
