"""The fused LayerNorm site's boundary (issue 24): under autocast the op also writes the bf16 copy the next GEMM
reads, and its backward takes the two incoming gradients (the residual path's and the GEMM's) and adds them in
the kernel. Checked against the PyTorch composition: the op alone (forward, copy, both gradients, the multi-row
backward loop), the whole model under autocast (no fp32 -> bf16 cast of a residual-sized tensor left, no gradient
add), and the whole model compiled by Inductor on CPU against eager.

"cpu" cases run Triton's interpreter, "cuda" ones the compiled kernels (tests/bert_core/_kernel_checks.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _kernel_checks import DEVICES
from torch.utils._python_dispatch import TorchDispatchMode

import bert_core
from bert_core import BertForPreTraining
from bert_core.kernels import KernelOptions, dropout_add_layer_norm_and_copy, keep_mask, set_kernel_options
from bert_core.kernels.dropout_layer_norm import _rows_per_program

EPS = 1e-12
V = 300


def site_inputs(device, rows, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g).to(device, torch.bfloat16).requires_grad_()
    r = torch.randn(rows, n, generator=g).to(device).requires_grad_()
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(device).requires_grad_()
    b = (0.1 * torch.randn(n, generator=g)).to(device).requires_grad_()
    dy = torch.randn(rows, n, generator=g).to(device)
    dcopy = torch.randn(rows, n, generator=g).to(device, torch.bfloat16)
    return (x, r, w, b), dy, dcopy


def truncate_to_bf16(t: torch.Tensor) -> torch.Tensor:
    return (t.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def check_site(device, rows, n, p):
    (x, r, w, b), dy, dcopy = site_inputs(device, rows, n)
    seed = torch.tensor([1234567], dtype=torch.int64, device=device)
    out, copy = dropout_add_layer_norm_and_copy(x, r, w, b, p=p, eps=EPS, copy_dtype=torch.bfloat16, seed=seed)
    assert out.dtype == torch.float32 and copy.dtype == torch.bfloat16
    torch.autograd.backward([out, copy], [dy, dcopy])
    # The composition under autocast: fp32 LayerNorm, autocast's cast for the GEMM, autograd's add of the two grads.
    ref_in = [t.detach().clone().requires_grad_() for t in (x, r, w, b)]
    keep = keep_mask(seed, rows, n, p) if p else None
    dropped = ref_in[0].float() * keep / (1 - p) if p else ref_in[0].float()
    ref = F.layer_norm(dropped + ref_in[1], (n,), ref_in[2], ref_in[3], EPS)
    ref_copy = ref.to(torch.bfloat16)
    torch.autograd.backward([ref, ref_copy], [dy, dcopy])
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    # The copy is the op's own fp32 output rounded as autocast rounds it (to nearest even); Triton's interpreter
    # truncates fp32 -> bf16, so on CPU it is the truncation, one bf16 step at most from autocast's.
    exact = out.detach().to(torch.bfloat16) if device == "cuda" else truncate_to_bf16(out.detach())
    torch.testing.assert_close(copy, exact, atol=0.0, rtol=0.0)
    torch.testing.assert_close(copy, ref_copy, atol=1e-6, rtol=2**-7)
    for name, got, want in zip(("x", "residual", "weight", "bias"), (x, r, w, b), ref_in, strict=False):
        assert got.grad.dtype == got.dtype, name
        tol = dict(atol=4e-2, rtol=2e-2) if name == "x" else dict(atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.grad, want.grad, **tol, msg=name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [0.0, 0.25])
def test_copy_and_both_gradients_match_the_composition(device, p):
    check_site(device, rows=12, n=40, p=p)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_loop_over_several_rows_per_program(device):
    """Training shapes run 8-32 rows per backward program; here 200 rows on CPU's 4 programs = 64 rows each, the
    last program partly past the end (its extra rows must add nothing to dW / dB)."""
    rows, n = 200, 96
    per_program = _rows_per_program(torch.device(device), rows)
    if device == "cpu":
        assert per_program == 64 and -(-rows // per_program) == 4 and rows % per_program
    check_site(device, rows=rows, n=n, p=0.1)


def cfg(dropout: float = 0.0):
    return bert_core.bert_tiny(vocab_size=V, max_position_embeddings=64, hidden_dropout_prob=dropout,
                               attention_probs_dropout_prob=dropout)


def batch(device, b=2, t=12, p=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, t - 4:] = 0
    out = dict(input_ids=torch.randint(5, V, (b, t), generator=g), attention_mask=mask,
               token_type_ids=(torch.arange(t) >= t // 2).long().expand(b, t),
               masked_lm_positions=torch.stack([torch.randperm(t - 5, generator=g)[:p] + 1 for _ in range(b)]),
               masked_lm_labels=torch.randint(5, V, (b, p), generator=g),
               next_sentence_label=torch.randint(0, 2, (b,), generator=g))
    return {k: v.to(device) for k, v in out.items()}


class CountResidualPasses(TorchDispatchMode):
    """Counts what the fused boundary takes over, on tensors of the residual stream's shape: casts of fp32 to bf16
    (autocast's, for a GEMM) and adds of two such tensors (autograd summing an output's gradients)."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.casts, self.adds = tuple(shape), 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and tuple(first.shape) == self.shape:
            if func in (torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype) and \
                    first.dtype == torch.float32 and out.dtype == torch.bfloat16:
                self.casts += 1
            if func in (torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor) and \
                    isinstance(args[1], torch.Tensor) and tuple(args[1].shape) == self.shape:
                self.adds += 1
        return out


def autocast_loss_and_grads(model, data, device, run=None):
    model.zero_grad()
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = (model if run is None else run)(**data).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("device", DEVICES)
def test_model_under_autocast_hands_the_copy_to_the_gemms(device):
    torch.manual_seed(0)
    model = BertForPreTraining(cfg()).to(device).train()
    data = batch(device)
    b, t = data["input_ids"].shape
    counts = {}
    results = {}
    for fused in (False, True):
        set_kernel_options(model, KernelOptions(fused=fused))
        with CountResidualPasses((b, t, model.config.hidden_size)) as counter:
            results[fused] = autocast_loss_and_grads(model, data, device)
        counts[fused] = (counter.casts, counter.adds)
    layers = model.config.num_hidden_layers
    # What stays on the fused path is the embeddings' (not a fused site): their add in forward, the cast of their
    # LayerNorm output for the first QKV GEMM and the add of that output's two gradients.
    assert counts[True] == (1, 2), counts
    # The composition also casts every site output that feeds a GEMM for it (all but the last layer's) and adds
    # its two gradients in backward (plus the residual adds and their gradients' casts, also gone).
    sites_feeding_a_gemm = 2 * layers - 1
    assert counts[False][0] - counts[True][0] >= sites_feeding_a_gemm, counts
    assert counts[False][1] - counts[True][1] >= sites_feeding_a_gemm, counts
    (ref_loss, ref_grads), (loss, grads) = results[False], results[True]
    torch.testing.assert_close(loss, ref_loss, atol=2e-2, rtol=1e-2)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=2e-2, rtol=5e-2, msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_inductor_compiled_model_equals_eager(device):
    """The whole model under autocast with the fused sites, compiled by Inductor (its CPU backend here, calling
    the op as an external kernel), against the same model eager: one graph, same loss and gradients."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = BertForPreTraining(cfg()).to(device).train()
    set_kernel_options(model, KernelOptions(fused=True))
    data = batch(device)
    eager_loss, eager_grads = autocast_loss_and_grads(model, data, device)
    compiled = torch.compile(model, backend="inductor", fullgraph=True, dynamic=False)
    loss, grads = autocast_loss_and_grads(model, data, device, run=compiled)
    torch.testing.assert_close(loss, eager_loss, atol=1e-2, rtol=1e-2)
    assert grads.keys() == eager_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], eager_grads[name], atol=2e-2, rtol=5e-2, msg=name)
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_self_check_passes_the_real_kernels_and_checks_nothing_where_none_run(device):
    from bert_core.kernels.self_check import LIMIT, self_check

    options = KernelOptions(fused=True, fused_bias_gelu=True)
    results = self_check(rows=48, hidden=64, intermediate=256, device=torch.device(device), options=options)
    assert set(results) == {"dropout_layer_norm", "bias_gelu"}
    for name, result in results.items():
        assert result.ok, (name, result.figure)
        assert f"(limit {LIMIT:g})" in result.figure
    assert self_check(48, 64, 256, torch.device(device), KernelOptions(fused=False)) == {}
