"""GPU defaults that would pass silently if wrong (issue 24). Skipped without a GPU.

- CUDA graphs (`--cuda-graphs`): Inductor may skip recording a graph (a CPU tensor, a mutated input, dynamic
  shapes) and run the step without it, training the same: the test counts Inductor's `cudagraph_skips` and wants 0,
  and counts, step by step, the graphs captured and replayed (`torch.cuda.CUDAGraph.capture_begin` / `replay`,
  which Inductor's CUDA graph trees call): steps must run from replays, not only have nothing skipped.
- The compiled packed step with dropout against the padded one: tests/bert_core/test_packed_model_gpu.py."""
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


def _config(data: str, dropout: float, steps: int, **runtime) -> PretrainConfig:
    vocab = Path(data, "vocab.txt").read_text().splitlines()
    return PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=len(vocab), max_position_embeddings=128,
                                         hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)),
        data=DataConfig(train=read_manifest(data), micro_batch_size=32, mask_id=vocab.index("[MASK]")),
        max_steps=steps, optimizer=OptimizerConfig(lr=1e-3), tracking=TrackingConfig(log_every=1),
        runtime=RuntimeConfig(device="cuda", compile_warmup_steps=2, peak_flops=989e12, **runtime),
    )


class GraphCounts:
    """Captures and replays of CUDA graphs in this process, per training step (`pretraining.loop._train_step`)."""

    def __init__(self, monkeypatch):
        from pretraining import loop

        self.captures = self.replays = 0
        self.per_step: list[tuple[int, int]] = []  # (replays, captures) of each step
        graph, step = torch.cuda.CUDAGraph, loop._train_step
        capture_begin, replay = graph.capture_begin, graph.replay

        def counted_capture(g, *args, **kwargs):
            self.captures += 1
            return capture_begin(g, *args, **kwargs)

        def counted_replay(g, *args, **kwargs):
            self.replays += 1
            return replay(g, *args, **kwargs)

        def counted_step(run):
            before = (self.replays, self.captures)
            out = step(run)
            self.per_step.append((self.replays - before[0], self.captures - before[1]))
            return out

        monkeypatch.setattr(graph, "capture_begin", counted_capture)
        monkeypatch.setattr(graph, "replay", counted_replay)
        monkeypatch.setattr(loop, "_train_step", counted_step)


def test_cuda_graphs_are_recorded_and_replayed(varied_pretrain_data, monkeypatch):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    graphs = GraphCounts(monkeypatch)
    result = fit(_config(varied_pretrain_data, 0.1, 8, cuda_graphs=True))
    assert result.step == 8 and all(math.isfinite(m["loss"]) for _, m in result.history)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert len(graphs.per_step) == 8 and graphs.captures > 0, graphs.per_step
    # A width's graphs are recorded once, then replayed: with at most 4 widths in 8 steps, some steps run from
    # replays alone (forward and backward each a graph: >= 2 replays, nothing captured).
    replayed = [r for r, c in graphs.per_step if r >= 2 and c == 0]
    assert len(replayed) >= 2, graphs.per_step
