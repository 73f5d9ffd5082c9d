"""Sizes that fit: the activation formula against what autograd really saves (a probe on CPU), the whole estimate
against a step's measured peak RSS, the planner's choices and messages, and `fit` failing in seconds, naming the
flag, when a micro-batch cannot fit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bert_core import BertForPreTraining, bert_mini, bert_small, bert_tiny
from pretraining import memory
from pretraining.memory import DoesNotFit, activation_bytes, estimate, parameter_count, plan_micro_batch
from pretraining.step import forward

REPO = Path(__file__).resolve().parents[2]


def _batch(vocab: int, b: int, t: int, p: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(5, vocab, (b, t), generator=g),
            "attention_mask": torch.ones(b, t, dtype=torch.int64),
            "token_type_ids": torch.zeros(b, t, dtype=torch.int64),
            "masked_lm_positions": (torch.arange(p) % (t - 1) + 1).expand(b, p).contiguous(),
            "masked_lm_labels": torch.randint(5, vocab, (b, p), generator=g),
            "next_sentence_label": torch.zeros(b, dtype=torch.int64)}


def saved_activation_bytes(config, b: int, t: int, p: int) -> int:
    """The probe: bytes of every distinct storage autograd saves for backward, the model's weights excluded."""
    torch.manual_seed(0)
    model = BertForPreTraining(config).train()
    weights = {w.untyped_storage().data_ptr() for w in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward(model, _batch(config.vocab_size, b, t, p))
    (out.mlm_loss + out.nsp_loss).backward()
    return sum(saved.values())


@pytest.mark.parametrize("config,b,t,p", [
    (bert_tiny(vocab_size=600), 8, 64, 10),
    (bert_tiny(vocab_size=3000), 4, 128, 20),
    (bert_mini(vocab_size=600), 4, 96, 16),
    # hidden, intermediate and heads apart from the presets' ratios, so no term hides behind another
    (bert_tiny(vocab_size=900).replace(num_hidden_layers=3, hidden_size=192, intermediate_size=320,
                                       num_attention_heads=6), 6, 80, 12),
], ids=["tiny", "tiny-vocab", "mini", "odd-shape"])
def test_activation_formula_matches_what_autograd_saves(config, b, t, p):
    measured = saved_activation_bytes(config, b, t, p)
    assert activation_bytes(config, b, t, p) == pytest.approx(measured, rel=0.03)


def test_parameter_count_is_exact():
    for config in (bert_tiny(vocab_size=600), bert_mini(), bert_tiny(vocab_size=77).replace(intermediate_size=300)):
        assert parameter_count(config) == sum(p.numel() for p in BertForPreTraining(config).parameters())


def test_estimate_covers_a_measured_step_peak():
    """Real AdamW steps of bert_small (30,522-entry vocab) in a fresh process: the estimate is at most 10% under
    the peak RSS (the planner keeps 20% of the free memory in reserve) and not far over it (an estimate 1.5x too
    high would shrink micro-batches for nothing). The allocator makes the peak vary by a few percent per run. The peak
is the process's own (VmHWM): getrusage's ru_maxrss survives exec, so it would report pytest's size."""
    code = (
        "import json, sys, torch\n"
        "sys.path.insert(0, '.')\n"
        "torch.set_num_threads(1)\n"
        "from bert_core import BertForPreTraining, bert_small\n"
        "from pretraining.memory import peak_rss\n"
        "from training.optim import build_optimizer\n"
        "from pretraining.step import train_step\n"
        "b, t, p, v = 16, 128, 20, 30522\n"
        "batch = {'input_ids': torch.randint(5, v, (b, t)), 'attention_mask': torch.ones(b, t, dtype=torch.int64),\n"
        "         'token_type_ids': torch.zeros(b, t, dtype=torch.int64),\n"
        "         'masked_lm_positions': (torch.arange(p) % (t - 1) + 1).expand(b, p).contiguous(),\n"
        "         'masked_lm_labels': torch.randint(5, v, (b, p)),\n"
        "         'next_sentence_label': torch.zeros(b, dtype=torch.int64)}\n"
        "model = BertForPreTraining(bert_small()).train()\n"
        "opt = build_optimizer(model)\n"
        "for _ in range(2):\n"
        "    train_step(model, opt, [batch])\n"
        "print(json.dumps(peak_rss()))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    peak = json.loads(out.stdout.strip().splitlines()[-1])
    total = estimate(bert_small(), 16, 128, 20).total
    assert 0.9 * peak <= total <= 1.5 * peak, (peak, total)


def test_plan_keeps_the_global_batch_and_picks_the_largest_that_fits():
    config = bert_tiny(vocab_size=600)
    per_rank = 96
    budget = int(estimate(config, 24, 64, 10).total / memory.HEADROOM) + 1
    chosen = plan_micro_batch(config, per_rank, 64, 10, budget)
    assert (chosen.micro_batch, chosen.accum) == (24, 4)  # 32 does not fit; 24 divides 96
    assert plan_micro_batch(config, per_rank, 64, 10, budget, requested_micro=12).micro_batch == 12
    assert plan_micro_batch(config, per_rank, 64, 10, 10**12).micro_batch == 96  # everything fits: no accumulation


def test_plan_names_the_flag_to_change():
    config = bert_tiny(vocab_size=600)
    budget = int(estimate(config, 24, 64, 10).total / memory.HEADROOM) + 1
    with pytest.raises(DoesNotFit, match=r"--micro-batch-size 96 needs ~.* use --micro-batch-size 24 \(gradient"):
        plan_micro_batch(config, 96, 64, 10, budget, requested_micro=96)
    with pytest.raises(DoesNotFit, match=r"even at a micro-batch of 1 .* smaller --preset than bert_tiny"):
        plan_micro_batch(config, 96, 64, 10, 10 * 2**20, model_name="bert_tiny")


def test_available_memory_is_known_on_this_machine():
    free = memory.available_bytes(torch.device("cpu"))
    assert 0 < free <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert memory.available_bytes(torch.device("cpu"), local_workers=4) == pytest.approx(free / 4, rel=0.2)


def test_fit_fails_in_seconds_when_the_micro_batch_cannot_fit(tiny_pretrain_data, tmp_path):
    from corpus.schema import read_manifest
    from pretraining.config import ModelConfig, PretrainConfig, RuntimeConfig
    from pretraining.loader import DataConfig
    from pretraining.loop import fit
    from pretraining.memory import MemoryConfig

    config = PretrainConfig(
        model=ModelConfig(bert=bert_tiny(vocab_size=600, max_position_embeddings=64)),
        data=DataConfig(train=read_manifest(tiny_pretrain_data["train"]), micro_batch_size=4096),
        max_steps=5, runtime=RuntimeConfig(device="cpu", threads=1), memory=MemoryConfig(budget_gb=1.0))
    with pytest.raises(DoesNotFit, match=r"a micro-batch of 4096 sequences of 64 tokens needs ~.* use "
                                         r"--micro-batch-size \d+ \(gradient accumulation keeps --batch-size\), "
                                         r"or give --memory-gb"):
        fit(config)  # checked at set-up, before the model is built or a batch is read


def test_gpu_estimate_is_within_the_measured_h100_peaks():
    """The GPU formula (derived from what each op saves, not fitted) against every measured GPU peak."""
    from bert_core import PRESETS

    assert len(memory.MEASURED_GPU) >= 2
    for m in memory.MEASURED_GPU:
        est = estimate(PRESETS[m.preset](vocab_size=30522), m.micro_batch, m.seq_len, m.predictions, "cuda",
                       m.compiled).total
        assert 0.8 <= est / (m.peak_gib * 2**30) <= 1.25, (m, est / 2**30)


def test_phase_2_on_one_gpu_is_planned_not_refused():
    """BERT-base at --batch-size 256 --max-seq-length 512 (80 slots) on one GPU, budget given explicitly: 80 GB
    takes the whole batch, 40 GB accumulates; the job's path (micro_batch_for, --use-gpu) plans the same."""
    from bert_core import bert_base

    bert = bert_base(vocab_size=30522)
    assert (plan_micro_batch(bert, 256, 512, 80, 80 * 10**9, device_type="cuda").micro_batch,
            plan_micro_batch(bert, 256, 512, 80, 80 * 10**9, device_type="cuda").accum) == (256, 1)
    chosen = plan_micro_batch(bert, 256, 512, 80, 40 * 10**9, device_type="cuda")
    assert (chosen.micro_batch, chosen.accum) == (128, 2)
    assert memory.micro_batch_for(bert, (256, 1), 512, 80, workers=1, use_gpu=True, budget_gb=40, requested=None,
                                  model_name="bert_base") == (128, 2)


def test_gpu_budget_is_read_here_when_the_workers_run_here(monkeypatch):
    """With --use-gpu and no cluster address the job reads the GPUs' free memory (None on this GPU-less machine,
    so each worker checks its own); with RAY_ADDRESS it cannot know and says so with None."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    expected = memory.gpu_free_bytes(1)
    assert memory.local_budget(True, 1, None) == expected
    if not torch.cuda.is_available():
        assert expected is None
    monkeypatch.setenv("RAY_ADDRESS", "ray://10.0.0.1:10001")
    assert memory.local_budget(True, 1, None) is None
    assert memory.local_budget(True, 1, 12.0) == 12 * 2**30
