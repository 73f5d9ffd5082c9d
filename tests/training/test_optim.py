"""Optimisers and schedules: parameter groups, LAMB on a hand-computed case, schedule values."""
from __future__ import annotations

import math

import pytest
import torch

import bert_core
from training.optim import Lamb, build_optimizer, build_scheduler


def test_no_decay_on_bias_and_layernorm():
    m = bert_core.BertForPreTraining(bert_core.bert_tiny(vocab_size=100, max_position_embeddings=32))
    opt = build_optimizer(m, "adamw", lr=1e-3, weight_decay=0.01)
    decay, no_decay = opt.param_groups
    names = {id(p): n for n, p in m.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(names[id(p)].endswith("weight") and "LayerNorm" not in names[id(p)] for p in decay["params"])
    assert all(names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)] for p in no_decay["params"])
    # Every trainable parameter appears exactly once (the tied embedding/decoder matrix too).
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(m.parameters()))
    assert isinstance(build_optimizer(m, "lamb"), Lamb)
    with pytest.raises(ValueError, match="adamw"):
        build_optimizer(m, "sgd")


def test_lamb_trust_ratio_hand_computed():
    # One step on w = [3, 4] (||w|| = 5), g = [0.6, 0.8], lr 0.1, betas (0.9, 0.999), eps 0, weight decay 0.1.
    # Step 1 with bias correction: m_hat = g, v_hat = g^2, so adam = g / |g| = [1, 1].
    # update = adam + wd * w = [1 + 0.3, 1 + 0.4] = [1.3, 1.4]; ||update|| = sqrt(1.69 + 1.96) = sqrt(3.65).
    # trust = 5 / sqrt(3.65) = 5 / 1.910497 = 2.617124; w_new = w - 0.1 * 2.617124 * [1.3, 1.4]
    #       = [3 - 0.340226, 4 - 0.366397] = [2.659774, 3.633603].
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = Lamb([w], lr=0.1, betas=(0.9, 0.999), eps=0.0, weight_decay=0.1)
    w.grad = torch.tensor([0.6, 0.8])
    opt.step()
    trust = 5 / math.sqrt(3.65)
    expected = [3.0 - 0.1 * trust * 1.3, 4.0 - 0.1 * trust * 1.4]
    assert expected == pytest.approx([2.659774, 3.633603], abs=1e-6)
    assert w.detach().tolist() == pytest.approx(expected, abs=1e-6)


def test_lamb_trust_ratio_is_one_for_zero_weights_and_no_decay_groups():
    # ||w|| = 0: trust 1, so the step is plain Adam: w = 0 - lr * sign(g).
    w = torch.nn.Parameter(torch.zeros(3))
    opt = Lamb([w], lr=0.5, eps=0.0, weight_decay=0.01)
    w.grad = torch.tensor([2.0, -1.0, 0.5])
    opt.step()
    assert w.detach().tolist() == pytest.approx([-0.5, 0.5, -0.5], abs=1e-6)
    # weight_decay 0 (biases, LayerNorm): no layer adaptation, as in apex / the reference LAMB.
    b = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = Lamb([b], lr=0.1, eps=0.0, weight_decay=0.0)
    b.grad = torch.tensor([0.6, 0.8])
    opt.step()
    assert b.detach().tolist() == pytest.approx([2.9, 3.9], abs=1e-6)


def test_lamb_state_round_trips():
    w = torch.nn.Parameter(torch.randn(4, 4))
    opt = Lamb([w], lr=0.01)
    for _ in range(3):
        w.grad = torch.randn(4, 4)
        opt.step()
    opt2 = Lamb([w], lr=0.01)
    opt2.load_state_dict(opt.state_dict())
    assert opt2.state[w]["step"].item() == 3


def test_linear_warmup_then_linear_decay():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = build_scheduler(opt, warmup_steps=10, total_steps=110)
    lrs = []
    for _ in range(120):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == 0.0 and lrs[5] == pytest.approx(0.5) and lrs[10] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.5) and lrs[110] == pytest.approx(0.0) and lrs[119] == pytest.approx(0.0)


def test_poly_decay_and_end_ratio_and_state_dict():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    sched = build_scheduler(opt, warmup_steps=0, total_steps=100, decay="poly", power=2.0, end_lr_ratio=0.1)
    for _ in range(50):
        opt.step()
        sched.step()
    # 2.0 * (0.1 + 0.9 * (1 - 0.5)^2) = 2.0 * 0.325
    assert opt.param_groups[0]["lr"] == pytest.approx(0.65)
    state = sched.state_dict()
    opt2 = torch.optim.SGD([p], lr=2.0)
    sched2 = build_scheduler(opt2, warmup_steps=0, total_steps=100, decay="poly", power=2.0, end_lr_ratio=0.1)
    sched2.load_state_dict(state)
    opt2.step()
    sched2.step()
    sched.step()
    assert sched2.get_last_lr() == pytest.approx(sched.get_last_lr())


@pytest.mark.parametrize("kw", [dict(warmup_steps=20, total_steps=10), dict(warmup_steps=0, total_steps=0),
                                dict(warmup_steps=1, total_steps=10, decay="cosine")])
def test_scheduler_validation(kw):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError):
        build_scheduler(opt, **kw)


def test_flops_bert_base_matches_the_spec_anchor():
    # SPEC: BERT-base at seq 128 with the MLM head at masked positions is ~70 GFLOP per sequence.
    f = bert_core.flops_per_sequence(bert_core.bert_base(), seq_len=128, num_masked=20)
    assert 65e9 < f < 75e9
    assert bert_core.mfu(bert_core.bert_base(), 128, 5600, 989e12, num_masked=20) == pytest.approx(f * 5600 / 989e12)
