"""The CPU dropout mask and the dropout attention path (bert_core.dropout)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bert_core.dropout import Dropout, attention, dropout, keep_mask


def test_keep_mask_rate_and_reproducibility():
    torch.manual_seed(0)
    a = keep_mask((1000, 1000), 0.1)
    b = keep_mask((1000, 1000), 0.1)
    torch.manual_seed(0)
    a2 = keep_mask((1000, 1000), 0.1)
    assert a.dtype == torch.bool and a.shape == (1000, 1000)
    assert torch.equal(a, a2)  # torch.manual_seed decides the mask
    assert not torch.equal(a, b)  # each call draws a new one
    # 1 - 6554/65536 kept; the standard error at n = 1e6 is 3e-4
    assert a.float().mean().item() == pytest.approx(1 - 6554 / 65536, abs=2e-3)
    assert keep_mask((5, 7), 0.5).shape == (5, 7)
    assert keep_mask((100_000,), 0.0).all()  # p = 0 keeps everything
    # No structure across the four 16-bit slices of a word: each slice position keeps at the same rate.
    flat = keep_mask((400_000,), 0.3).view(-1, 4).float().mean(0)
    assert torch.allclose(flat, torch.full((4,), 0.7), atol=5e-3)


def test_dropout_scales_kept_values_and_backward_uses_the_same_mask():
    torch.manual_seed(1)
    x = torch.randn(64, 300, requires_grad=True)
    y = dropout(x, 0.25)
    kept = y != 0
    assert 0.70 < kept.float().mean().item() < 0.80
    assert torch.allclose(y[kept], x.detach()[kept] / 0.75)
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.allclose(x.grad, torch.where(kept, g / 0.75, torch.zeros_like(g)))
    assert dropout(x, 0.25, training=False) is x
    with pytest.raises(ValueError, match="dropout probability"):
        dropout(x, 1.0)


def test_dropout_module_is_parameter_free_and_follows_train_eval():
    m = Dropout(0.1)
    assert list(m.state_dict()) == [] and "p=0.1" in repr(m)
    x = torch.ones(1000)
    assert torch.equal(m.eval()(x), x)
    assert (m.train()(x) == 0).any()


def _reference_attention(q, k, v, mask, keep, p):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, -1) * keep / (1 - p)
    return probs @ v


def test_dropout_attention_is_sdpa_math_with_the_drawn_mask():
    torch.manual_seed(2)
    b, h, t, d = 3, 2, 9, 8
    q, k, v = (torch.randn(b, h, t, d) for _ in range(3))
    lengths = torch.tensor([9, 5, 1])
    mask = (torch.arange(t)[None, :] < lengths[:, None])[:, None, None, :]  # keys only, as the model builds it
    torch.manual_seed(7)
    out = attention(q, k, v, mask, 0.2)
    torch.manual_seed(7)
    keep = keep_mask((b, h, t, t), 0.2)
    assert torch.allclose(out, _reference_attention(q, k, v, mask, keep, 0.2), atol=1e-6)
    # Padding keys never contribute: changing their values leaves every output unchanged.
    v2 = v.clone()
    v2[1, :, 5:] = 1e3
    v2[2, :, 1:] = -1e3
    torch.manual_seed(7)
    assert torch.allclose(attention(q, k, v2, mask, 0.2), out, atol=1e-6)
    # Without dropout it is SDPA itself.
    assert torch.allclose(attention(q, k, v, mask, 0.0), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_dropout_attention_averages_to_sdpa_and_gradients_flow():
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 1, 6, 4, requires_grad=True) for _ in range(3))
    mean = sum(attention(q, k, v, None, 0.3) for _ in range(3000)) / 3000
    exact = F.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(mean, exact, atol=0.06)
    mean.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_off_cpu_dropout_and_attention_use_torch_kernels():
    """The PCG64 mask is CPU-only: on another device (meta here, CUDA in use) dropout and the dropout attention go
    to torch's own kernels (the CPU mask multiplied into a meta tensor would raise)."""
    x = torch.empty(4, 8, device="meta")
    assert dropout(x, 0.1).device.type == "meta"
    q = torch.empty(2, 2, 5, 4, device="meta")
    assert attention(q, q, q, None, 0.1).shape == (2, 2, 5, 4)
