"""The MLM head's paths: static slots vs valid-only, chunked CE vs one GEMM, compiled once for any number of masked
tokens, bf16 GEMMs only. The GPU path is forced by flags so its logic runs here on CPU; tests marked `gpu` run it
on CUDA (skipped without one)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.registry import lookup_backend
from torch._dynamo.testing import CompileCounterWithBackend
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils._python_dispatch import TorchDispatchMode

import bert_core
from bert_core import BertForPreTraining
from bert_core.fused_ce import linear_cross_entropy

V = 300


def cfg(dropout: float = 0.0, **kw):
    return bert_core.bert_tiny(vocab_size=V, max_position_embeddings=64, hidden_dropout_prob=dropout,
                               attention_probs_dropout_prob=dropout, **kw)


def batch(n_valid, b=4, t=32, p=6, seed=0, device="cpu"):
    """A collated batch as pretraining/loader.py pads it: (B, P) slots, the first n_valid[i] real, the rest
    position 0 / label -100. Some rows are also padded (attention_mask 0)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, t - 5:] = 0
    positions = torch.stack([torch.randperm(t - 6, generator=g)[:p].sort().values + 1 for _ in range(b)])
    labels = torch.randint(5, V, (b, p), generator=g)
    for i, n in enumerate(n_valid):
        positions[i, n:], labels[i, n:] = 0, -100
    out = dict(input_ids=ids, attention_mask=mask, token_type_ids=(torch.arange(t) >= t // 2).long().expand(b, t),
               masked_lm_positions=positions, masked_lm_labels=labels,
               next_sentence_label=torch.randint(0, 2, (b,), generator=g))
    return {k: v.to(device) for k, v in out.items()}


def grads(model, loss):
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_fused_ce_skips_ignored_rows():
    torch.manual_seed(0)
    h = torch.randn(10, 16, requires_grad=True)
    w = torch.randn(V, 16, requires_grad=True)
    bias = torch.randn(V, requires_grad=True)
    labels = torch.randint(0, V, (10,))
    labels[[1, 4, 5]] = -100
    loss, correct, count = linear_cross_entropy(h, w, bias, labels, chunk_rows=4)
    logits = F.linear(h, w, bias)
    ref = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert count.item() == 7
    keep = labels != -100
    assert correct.item() == (logits.argmax(1)[keep] == labels[keep]).sum().item()
    got = torch.autograd.grad(loss, (h, w, bias))
    want = torch.autograd.grad(ref, (h, w, bias))
    for a, b in zip(got, want, strict=False):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert got[0][1].abs().max().item() == 0.0  # an ignored row gets no gradient


@pytest.mark.parametrize("head", ["chunked", "gemm"])
def test_static_slots_equal_valid_only(head):
    """All B*P slots with -100 ignored == only the valid slots: loss, counts and every gradient (fp32)."""
    torch.manual_seed(0)
    m = BertForPreTraining(cfg()).train()
    m.mlm_head = head
    data = batch([6, 2, 0, 4])
    results = {}
    for static in (True, False):
        m.static_mlm = static
        out = m(**data)
        results[static] = (out, grads(m, out.loss))
    (s, gs), (v, gv) = results[True], results[False]
    assert s.mlm_count.item() == v.mlm_count.item() == 12
    assert s.mlm_correct.item() == v.mlm_correct.item()
    torch.testing.assert_close(s.mlm_loss, v.mlm_loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(s.loss, v.loss, atol=1e-6, rtol=1e-6)
    assert gs.keys() == gv.keys()
    for name in gv:
        torch.testing.assert_close(gs[name], gv[name], atol=1e-6, rtol=1e-5, msg=name)


def test_gpu_head_equals_cpu_head_fp32():
    """The GPU choice (static + one GEMM) forced on CPU == the CPU eager default (valid-only + chunked)."""
    torch.manual_seed(0)
    m = BertForPreTraining(cfg()).train()
    data = batch([5, 6, 1, 3])
    assert not m.uses_static_mlm(torch.device("cpu"))  # the CPU eager default
    cpu_out = m(**data)
    g_cpu = grads(m, cpu_out.loss)
    m.static_mlm, m.mlm_head = True, "gemm"
    gpu_out = m(**data)
    g_gpu = grads(m, gpu_out.loss)
    torch.testing.assert_close(gpu_out.loss, cpu_out.loss, atol=1e-6, rtol=1e-6)
    assert gpu_out.mlm_correct.item() == cpu_out.mlm_correct.item()
    for name in g_cpu:
        torch.testing.assert_close(g_gpu[name], g_cpu[name], atol=1e-6, rtol=1e-5, msg=name)


def test_static_logits_keep_the_slot_layout():
    m = BertForPreTraining(cfg()).eval()
    m.static_mlm = True
    data = batch([6, 2, 0, 4])
    with torch.no_grad():
        out = m(**data)
        m.static_mlm = False
        ref = m(**data)
    assert out.mlm_logits.shape == (4, 6, V)
    valid = data["masked_lm_labels"] != -100
    torch.testing.assert_close(out.mlm_logits[valid], ref.mlm_logits, atol=1e-5, rtol=1e-5)


class _Graphs:
    """A torch.compile backend that keeps every graph Dynamo hands it and runs it with aot_eager (which traces the
    backward too, through AOTAutograd)."""

    def __init__(self):
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return lookup_backend("aot_eager")(gm, example_inputs)

    def data_dependent_nodes(self) -> list[str]:
        """Nodes whose shape depends on tensor values (unbacked symbols: boolean indexing, nonzero, .item()). Each
        costs a device-to-host sync and defeats static-shape kernels and CUDA graphs."""
        return [n.format_node() for gm in self.graphs for n in gm.graph.nodes
                if free_unbacked_symbols(n.meta.get("example_value"))]


def test_compiled_once_for_any_number_of_masked_tokens():
    """fullgraph=True: the forward + losses are one graph with static shapes only (no host reads, no boolean
    indexing), and batches with 24, 12, 4 or 0 masked tokens in the same padded shapes reuse it. Eager and
    compiled agree on losses, counts and gradients."""
    torch.manual_seed(0)
    m = BertForPreTraining(cfg()).train()
    backend = _Graphs()
    compiled = torch.compile(m, backend=backend, fullgraph=True)
    for seed, n_valid in enumerate(([6, 6, 6, 6], [3, 3, 3, 3], [1, 0, 2, 1], [0, 0, 0, 0])):
        data = batch(n_valid, seed=seed)
        out = compiled(**data)
        g_compiled = grads(m, out.loss)
        ref = m(**data)
        g_eager = grads(m, ref.loss)
        assert out.mlm_count.item() == ref.mlm_count.item() == sum(n_valid)
        torch.testing.assert_close(out.loss, ref.loss, atol=1e-5, rtol=1e-5)
        assert out.mlm_correct.item() == ref.mlm_correct.item()
        for name in g_eager:
            torch.testing.assert_close(g_compiled[name], g_eager[name], atol=1e-5, rtol=1e-4, msg=name)
    assert len(backend.graphs) == 1, f"recompiled: {len(backend.graphs)} graphs"
    assert not backend.data_dependent_nodes(), backend.data_dependent_nodes()[:3]


def test_valid_only_slots_are_data_dependent():
    """The check above can fail: forcing the valid-only slots into the compiled graph shows up as
    data-dependent nodes (torch may still compile them, with a host sync and dynamic shapes)."""
    m = BertForPreTraining(cfg()).train()
    m.static_mlm = False
    backend = _Graphs()
    try:
        torch.compile(m, backend=backend, fullgraph=True)(**batch([6, 2, 3, 1]))
    except torch._dynamo.exc.TorchDynamoException:
        return  # older torch refuses boolean indexing under fullgraph outright: just as good
    assert backend.data_dependent_nodes()


def test_compiles_as_one_graph_with_dropout():
    """With dropout on, the compiled path uses torch's dropout and SDPA (no CPU-only mask code, no break)."""
    m = BertForPreTraining(cfg(dropout=0.1)).train()
    explanation = torch._dynamo.explain(m)(**batch([6, 2, 3, 1]))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons


_MATMULS = {"mm", "addmm", "bmm", "baddbmm"}


class _MatmulDtypes(TorchDispatchMode):
    """Records (op, operand dtypes) of every matmul-family op dispatched: GEMMs and fused attention (its q, k, v and,
    in backward, the incoming gradient; not the fp32 softmax statistics the kernels keep on purpose)."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, tuple[torch.dtype, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        tensors = [a.dtype for a in args if isinstance(a, torch.Tensor)]
        if name in _MATMULS:
            self.seen.append((name, tuple(tensors)))
        elif name.startswith("_scaled_dot_product") and "attention" in name:
            self.seen.append((name, tuple(tensors[:4 if name.endswith("_backward") else 3])))
        return func(*args, **(kwargs or {}))


def _bf16_step_matmuls(device: str, dropout: float = 0.1) -> list[tuple[str, tuple[torch.dtype, ...]]]:
    torch.manual_seed(0)
    m = BertForPreTraining(cfg(dropout=dropout)).train().to(device)
    m.static_mlm, m.mlm_head = True, "gemm"
    data = batch([6, 2, 3, 1], device=device)
    with _MatmulDtypes() as rec:
        with torch.autocast(device, dtype=torch.bfloat16):
            out = m(**data)
        out.loss.backward()
    assert torch.isfinite(out.loss) and out.loss.dtype == torch.float32
    return rec.seen


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["sdpa", "cpu-dropout-attention"])
def test_bf16_step_has_no_fp32_matmul_on_the_gpu_path(dropout):
    seen = _bf16_step_matmuls("cpu", dropout)
    assert len(seen) > 20, seen  # forward and backward GEMMs were seen
    if dropout == 0.0:
        assert any(op.startswith("_scaled_dot_product") for op, _ in seen), seen
    fp32 = [(op, dt) for op, dt in seen if torch.float32 in dt]
    assert not fp32, fp32


# ---- on a CUDA GPU ------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_head_bf16_matches_cpu_head():
    """The default CUDA path (static slots, one bf16 GEMM + CE) vs the default CPU path (valid-only, chunked, fp32)
    on the same weights and batch: equal within bf16 tolerance, identical counts."""
    torch.manual_seed(0)
    cpu_model = BertForPreTraining(cfg()).train()
    gpu_model = copy.deepcopy(cpu_model).cuda()
    data = batch([6, 2, 0, 4])
    ref = cpu_model(**data)
    g_ref = grads(cpu_model, ref.loss)
    assert gpu_model.uses_static_mlm(torch.device("cuda"))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = gpu_model(**{k: v.cuda() for k, v in data.items()})
    g_out = grads(gpu_model, out.loss)
    assert out.mlm_count.item() == ref.mlm_count.item() == 12
    assert abs(out.mlm_loss.item() - ref.mlm_loss.item()) < 2e-2 * ref.mlm_loss.item()
    assert abs(out.nsp_loss.item() - ref.nsp_loss.item()) < 2e-2
    for name in ("cls.predictions.bias", "bert.embeddings.word_embeddings.weight",
                 "bert.encoder.layer.0.attention.self.qkv.weight"):
        cos = F.cosine_similarity(g_out[name].float().cpu().flatten(), g_ref[name].flatten(), dim=0)
        assert cos.item() > 0.99, (name, cos.item())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_step_on_cuda_has_no_fp32_matmul_and_learns():
    seen = _bf16_step_matmuls("cuda")
    assert len(seen) > 20 and not [(op, dt) for op, dt in seen if torch.float32 in dt], seen
    torch.manual_seed(0)
    m = BertForPreTraining(cfg(dropout=0.1)).train().cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
    data = batch([6, 5, 6, 4], device="cuda")
    losses = []
    for _ in range(20):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(**data).loss
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    losses = torch.stack(losses).tolist()
    assert all(map(lambda x: x == x, losses)) and losses[-1] < losses[0] - 1.0, losses


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_once_on_cuda_with_inductor():
    torch.manual_seed(0)
    m = BertForPreTraining(cfg()).train().cuda()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(m, backend=counter, fullgraph=True)
    for seed, n_valid in enumerate(([6, 6, 6, 6], [3, 1, 0, 2], [0, 0, 0, 0])):
        data = batch(n_valid, seed=seed, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = compiled(**data)
            ref = m(**data)
        out.loss.backward()
        assert out.mlm_count.item() == sum(n_valid)
        assert abs(out.loss.item() - ref.loss.item()) < 2e-2 * max(1.0, ref.loss.item())
    assert counter.frame_count == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_forward_never_waits_for_the_host():
    """No .item(), no boolean indexing, no host-side checks of device values in the forward: CUDA's sync debug
    mode turns any device-to-host synchronisation into an error. (Backward kernels are torch's own.)"""
    torch.manual_seed(0)
    m = BertForPreTraining(cfg(dropout=0.1)).train().cuda()
    data = batch([6, 2, 0, 4], device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = m(**data)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    out.loss.backward()
    assert out.mlm_count.item() == 12 and torch.isfinite(out.loss).item()
