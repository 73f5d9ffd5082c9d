"""The fused dropout + residual + LayerNorm op (bert_core.kernels.dropout_add_layer_norm) against the plain PyTorch
composition: forward and the gradients of x, residual, weight and bias, fp32 and bf16, dropout off and on (on: with
the kernel's own mask), the mask reused in backward, determinism, and torch.compile keeping it as one op.

"cpu" cases run Triton's interpreter, "cuda" cases the compiled kernels (tests/bert_core/_kernel_checks.py). Shapes
are tiny: the interpreter runs one program at a time in NumPy."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _kernel_checks import DEVICES
from torch._functorch.partitioners import min_cut_rematerialization_partition

from bert_core.kernels import dropout_add_layer_norm, keep_mask
from bert_core.kernels.dropout_layer_norm import draw_seed

EPS = 1e-12  # BERT's layer_norm_eps


def inputs(device, dtype, residual_dtype=None, shape=(3, 5, 44), seed=0):
    g = torch.Generator().manual_seed(seed)
    n = shape[-1]
    x = torch.randn(shape, generator=g).to(device, dtype).requires_grad_()
    r = torch.randn(shape, generator=g).to(device, residual_dtype or dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(device).requires_grad_()
    b = (0.1 * torch.randn(n, generator=g)).to(device).requires_grad_()
    return x, r, w, b


def composition(x, r, w, b, keep, p):
    """The reference, in fp32 from the same (upcast) inputs: LayerNorm(x * keep / (1 - p) + r)."""
    xs = [t.detach().float().requires_grad_() for t in (x, r, w, b)]
    dropped = xs[0] * keep / (1 - p) if keep is not None else xs[0]
    return F.layer_norm(dropped + xs[1], (x.shape[-1],), xs[2], xs[3], EPS), xs


def grads(out, tensors, dy):
    out.backward(dy)
    return [t.grad for t in tensors]


TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=4e-2, rtol=2e-2)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_forward_and_gradients_match_the_composition(device, dtype, p):
    x, r, w, b = inputs(device, dtype)
    seed = torch.tensor([987654321012], dtype=torch.int64, device=device)
    out = dropout_add_layer_norm(x, r, w, b, p=p, eps=EPS, seed=seed)
    assert out.dtype == dtype and out.shape == x.shape
    keep = keep_mask(seed, 15, 44, p).view(x.shape) if p else None
    ref, ref_inputs = composition(x, r, w, b, keep, p)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(device)
    got = grads(out, (x, r, w, b), dy.to(dtype))
    want = grads(ref, ref_inputs, dy.to(dtype).float())
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])
    for name, g, e, t in zip(("x", "residual", "weight", "bias"), got, want, (x, r, w, b), strict=False):
        assert g.dtype == t.dtype, name
        # dW/dB sum 15 rows of bf16 products: a looser bound than the per-element grads.
        tol = TOL[dtype] if name in ("x", "residual") or dtype == torch.float32 else dict(atol=1e-1, rtol=3e-2)
        torch.testing.assert_close(g.float(), e, **tol, msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_input_fp32_residual_keeps_the_fp32_stream_unless_asked(device):
    """Under autocast the sublayer output is bf16 and the residual fp32: the default output is fp32 (as autocast's
    fp32 LayerNorm gives), out_dtype=bf16 is the low-precision residual stream; statistics are fp32 in both."""
    x, r, w, b = inputs(device, torch.bfloat16, residual_dtype=torch.float32)
    out = dropout_add_layer_norm(x, r, w, b, eps=EPS)
    low = dropout_add_layer_norm(x, r, w, b, eps=EPS, out_dtype=torch.bfloat16)
    assert out.dtype == torch.float32 and low.dtype == torch.bfloat16
    ref, _ = composition(x, r, w, b, None, 0.0)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)  # exact up to fp32 rounding: x is bf16 already
    torch.testing.assert_close(low, ref.bfloat16())
    out.sum().backward()
    assert x.grad.dtype == torch.bfloat16 and r.grad.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_backward_recomputes_the_forward_mask(device):
    x, r, w, b = inputs(device, torch.float32, shape=(16, 40))
    seed = draw_seed(torch.device(device))
    out = dropout_add_layer_norm(x, r, w, b, p=0.5, eps=EPS, seed=seed, offset=9)
    out.backward(torch.randn_like(out))
    keep = keep_mask(seed, 16, 40, 0.5, offset=9)
    assert 0.3 < keep.float().mean().item() < 0.7
    assert (x.grad[~keep] == 0).all() and (x.grad[keep] != 0).all()
    # The forward dropped exactly those elements too: changing them changes nothing.
    x2 = torch.where(keep, x.detach(), 1e3)
    torch.testing.assert_close(dropout_add_layer_norm(x2, r, w, b, p=0.5, eps=EPS, seed=seed, offset=9),
                               out.detach(), atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_and_seeded_by_torch_rng(device):
    x, r, w, b = inputs(device, torch.float32, shape=(8, 24))

    def run(manual_seed):
        torch.manual_seed(manual_seed)  # what the training loop does before every step
        for t in (x, r, w, b):
            t.grad = None
        out = dropout_add_layer_norm(x, r, w, b, p=0.2, eps=EPS)
        out.backward(torch.ones_like(out))
        return out.detach(), [t.grad.clone() for t in (x, r, w, b)]

    a, ga = run(3)
    b2, gb = run(3)
    c, _ = run(4)
    assert torch.equal(a, b2) and all(torch.equal(u, v) for u, v in zip(ga, gb, strict=False))  # bitwise, run to run
    assert not torch.equal(a, c)
    # Eval mode / p = 0: no dropout, no seed drawn.
    rng_state = torch.cuda.get_rng_state if device == "cuda" else torch.random.get_rng_state
    torch.manual_seed(0)
    state = rng_state()
    dropout_add_layer_norm(x, r, w, b, p=0.2, eps=EPS, training=False)
    assert torch.equal(rng_state(), state)
    dropout_add_layer_norm(x, r, w, b, p=0.2, eps=EPS)
    assert not torch.equal(rng_state(), state)  # the seed came from this device's generator


@pytest.mark.parametrize("device", DEVICES)
def test_bad_shapes_fail_with_the_fix(device):
    x, r, w, b = inputs(device, torch.float32, shape=(2, 8))
    with pytest.raises(ValueError, match="same shape"):
        dropout_add_layer_norm(x, r[:1], w, b)
    with pytest.raises(ValueError, match=r"must be \(8,\)"):
        dropout_add_layer_norm(x, r, w[:4], b)
    with pytest.raises(ValueError, match="dropout probability"):
        dropout_add_layer_norm(x, r, w, b, p=1.0)
    with pytest.raises(ValueError, match="one-element int64 tensor"):
        dropout_add_layer_norm(x, r, w, b, p=0.1, seed=torch.tensor([1, 2], device=device))


def test_cpu_without_the_interpreter_is_refused(monkeypatch):
    x = torch.randn(2, 8)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="run on CUDA tensors.*TRITON_INTERPRET=1"):
        dropout_add_layer_norm(x, x, torch.ones(8), torch.zeros(8))


def _capture_graphs():
    """An aot_autograd backend with Inductor's partitioner (min-cut, which decides what to recompute in backward)
    that runs the graphs eagerly and keeps them for inspection."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = {}

    def keep(name):
        def compiler(gm, _example_inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)
        return compiler

    return graphs, aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                                partition_fn=min_cut_rematerialization_partition)


def _targets(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_keeps_one_op_each_way_and_the_seed_is_saved_not_redrawn(device):
    torch._dynamo.reset()
    x, r, w, b = inputs(device, torch.float32, shape=(4, 6, 32))
    linear = torch.nn.Linear(32, 32).to(device)

    def site(h, residual):
        seed = draw_seed(h.device)
        return dropout_add_layer_norm(linear(h), residual, w, b, p=0.25, eps=EPS, seed=seed), seed

    graphs, backend = _capture_graphs()
    compiled = torch.compile(site, backend=backend, fullgraph=True)  # fullgraph: a graph break would raise
    out, seed = compiled(x, r)
    dy = torch.randn_like(out)
    out.backward(dy)
    fw, bw = _targets(graphs["forward"]), _targets(graphs["backward"])
    assert fw.count("bert_core.dropout_add_layer_norm_fwd.default") == 1
    assert bw.count("bert_core.dropout_add_layer_norm_bwd.default") == 1
    assert not any("rand" in t for t in bw), bw  # the seed is saved for backward, never drawn again
    # Forward and backward used the mask of the seed the graph returned.
    keep = keep_mask(seed, 24, 32, 0.25).view(out.shape)
    ref, (xr, rr, wr, br) = composition(linear(x), r, w, b, keep, 0.25)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    ref.backward(dy)
    torch.testing.assert_close(r.grad, rr.grad, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(w.grad, wr.grad, atol=2e-5, rtol=2e-5)
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_schema_fake_and_autograd_registration(device):
    """torch.library.opcheck: the schemas, the fake implementations against the real ones (shapes, dtypes,
    strides), the autograd registration, and AOT dispatch, for both ops; non-contiguous inputs included."""
    from bert_core.kernels.dropout_layer_norm import _backward, _forward

    x, r, w, b = inputs(device, torch.bfloat16, residual_dtype=torch.float32, shape=(4, 40))
    seed = torch.tensor([7], dtype=torch.int64, device=device)
    x_t = x.detach().t().contiguous().t().requires_grad_()  # a transposed layout, same values
    for args in [(x, r, w, b, seed, 0, 0.1, EPS, torch.float32, torch.bfloat16),
                 (x_t, r, w, b, None, 0, 0.0, EPS, torch.bfloat16, None)]:
        torch.library.opcheck(_forward, args)
    with torch.no_grad():  # the backward op has no autograd of its own (no double backward)
        out, copy, mean, rstd = _forward(x, r, w, b, seed, 0, 0.1, EPS, torch.float32, torch.bfloat16)
    dy = torch.randn_like(out)
    for grads in [(dy, torch.randn_like(copy)), (dy, None), (None, torch.randn_like(copy))]:
        torch.library.opcheck(_backward, (*grads, x.detach(), r.detach(), w.detach(), seed, mean, rstd, 0, 0.1))
