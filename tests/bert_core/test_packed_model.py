"""Packed rows are exact BERT per sequence: the packed forward (dropout off) equals the unpacked one sequence by
sequence (hidden states, pooled [CLS], MLM and NSP losses, gradients), no attention crosses sequences, positions
restart, and the variable-length layout handed to FlashAttention (cumulative lengths, queries grouped by block)
computes the same attention as the block-diagonal reference."""
from __future__ import annotations

import pytest
import torch
from _packed_batches import LENGTHS, WIDTH, V, cfg, make_sequences, packed_batch, spans, unpacked_batch

from bert_core import BertForPreTraining, BertModel, packing
from bert_core.packing import PackedSequences, SegmentIds, packed_attention


def test_positions_restart_and_blocks_by_hand():
    packed = PackedSequences.from_lengths(torch.tensor([[3, 2, 0]]), 7)
    assert packed.sequence_ids.tolist() == [[0, 0, 0, 1, 1, 3, 3]]  # 3 = padding's own block
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 0, 0]]
    assert packed.starts.tolist() == [[0, 3, 5]]
    with pytest.raises(ValueError, match="sum to at most the row width 7"):
        PackedSequences.from_lengths(torch.tensor([[5, 3]]), 7)


def test_packed_model_equals_unpacked_per_sequence():
    torch.manual_seed(0)
    model = BertModel(cfg()).eval()
    seqs = make_sequences()
    ref = model(**{k: unpacked_batch(seqs, 4)[k] for k in ("input_ids", "attention_mask", "token_type_ids")})
    b = packed_batch(seqs, 8)
    out = model(b["input_ids"], token_type_ids=b["token_type_ids"], sequence_lengths=b["sequence_lengths"])
    assert out.pooler_output.shape == (2, 3, 128)
    for i, (r, j, start, n) in enumerate(spans()):
        torch.testing.assert_close(out.last_hidden_state[r, start:start + n], ref.last_hidden_state[i, :n],
                                   atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(out.pooler_output[r, j], ref.pooler_output[i], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("static_mlm", [True, False])
def test_packed_losses_and_gradients_equal_unpacked(static_mlm):
    """Training mode (dropout probabilities 0), the CPU's chunked head on the valid-only path: the same loss and
    the same gradients as the unpacked batch of the same sequences."""
    torch.manual_seed(0)
    model = BertForPreTraining(cfg()).train()
    model.static_mlm = static_mlm
    seqs = make_sequences(1)
    results = []
    for batch in (unpacked_batch(seqs, 4), packed_batch(seqs, 8)):
        model.zero_grad()
        out = model(**batch)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((out, grads))
    (ref, ref_grads), (packed, grads) = results
    for name in ("mlm_loss", "nsp_loss", "mlm_count", "nsp_count", "mlm_correct", "nsp_correct"):
        torch.testing.assert_close(getattr(packed, name), getattr(ref, name), atol=1e-5, rtol=1e-5, msg=name)
    assert int(packed.nsp_count) == 5 and int(packed.mlm_count) == sum(len(s["pos"]) for s in seqs)
    assert ref_grads.keys() == grads.keys()
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_no_attention_crosses_sequences():
    torch.manual_seed(0)
    model = BertModel(cfg()).eval()
    b = packed_batch(make_sequences(2), 8)
    base = model(b["input_ids"], token_type_ids=b["token_type_ids"], sequence_lengths=b["sequence_lengths"])
    # Rewrite the middle sequence of row 0 (and the padding of row 1): the others do not move, the middle does.
    ids = b["input_ids"].clone()
    ids[0, 9:23] = torch.randint(5, V, (14,))
    ids[1, 23:] = torch.randint(5, V, (17,))
    out = model(ids, token_type_ids=b["token_type_ids"], sequence_lengths=b["sequence_lengths"]).last_hidden_state
    h = base.last_hidden_state
    torch.testing.assert_close(out[0, :9], h[0, :9], atol=0, rtol=0)
    torch.testing.assert_close(out[0, 23:34], h[0, 23:34], atol=0, rtol=0)
    torch.testing.assert_close(out[1, :23], h[1, :23], atol=0, rtol=0)
    assert not torch.allclose(out[0, 9:23], h[0, 9:23])
    # And no gradient flows from one sequence's outputs into another's inputs.
    emb = model.embeddings(b["input_ids"], b["token_type_ids"],
                           PackedSequences.from_lengths(b["sequence_lengths"], WIDTH).position_ids)
    emb = emb.detach().requires_grad_(True)
    segs = PackedSequences.from_lengths(b["sequence_lengths"], WIDTH).segments()
    model.encoder(emb, segs)[0, :9].sum().backward()
    assert emb.grad[0, :9].abs().sum() > 0
    assert emb.grad[0, 9:].abs().sum() == 0 and emb.grad[1].abs().sum() == 0


def reference_flash(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p):
    """What FlashAttention's variable-length kernel computes: softmax attention inside each block, flat tokens."""
    assert dropout_p == 0.0 and cu_q.dtype == cu_k.dtype == torch.int32 and cu_q.shape == cu_k.shape
    out = torch.zeros_like(q)
    for i in range(len(cu_q) - 1):
        qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        assert qs.stop - qs.start <= max_q and ks.stop - ks.start <= max_k
        if qs.stop > qs.start:
            att = torch.nn.functional.scaled_dot_product_attention(
                q[qs].transpose(0, 1), k[ks].transpose(0, 1), v[ks].transpose(0, 1))
            out[qs] = att.transpose(0, 1)
    return out


def test_varlen_layout_matches_the_block_mask(monkeypatch):
    """The cumulative lengths and the grouping of picked queries by block, as `_varlen` builds them for CUDA,
    run through a reference of the kernel: the same outputs as the block-diagonal mask, also for the last
    layer's queries at arbitrary positions (padding slots at position 0 included)."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor(LENGTHS)
    segs = PackedSequences.from_lengths(lengths, WIDTH).segments()
    q, k, v = (torch.randn(2, WIDTH, 2, 8, generator=g) for _ in range(3))
    full_ref = packed_attention(q, k, v, segs, 0.0)
    positions = torch.tensor([[0, 9, 23, 3, 30, 0, 0], [0, 17, 23, 5, 20, 1, 0]])
    picked = segs.at(positions)
    q_picked = torch.gather(q, 1, positions[:, :, None, None].expand(-1, -1, 2, 8))
    picked_ref = packed_attention(q_picked, k, v, picked, 0.0)
    monkeypatch.setattr(packing, "_use_varlen", lambda q: True)
    monkeypatch.setattr(packing, "_flash_varlen", reference_flash)
    torch.testing.assert_close(packed_attention(q, k, v, segs, 0.0), full_ref)
    torch.testing.assert_close(packed_attention(q_picked, k, v, picked, 0.0), picked_ref)


def test_packed_step_compiles_as_one_graph():
    """Static shapes all the way (lengths -> blocks, positions, [CLS] rows on the device): one graph, no break,
    the same loss as eager."""
    torch.manual_seed(0)
    model = BertForPreTraining(cfg()).train()
    model.static_mlm = True
    model.mlm_head = "gemm"
    batch = packed_batch(make_sequences(3), 8)
    eager = model(**batch).loss
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=False)
    loss = compiled(**batch).loss
    loss.backward()
    torch.testing.assert_close(loss, eager, atol=1e-5, rtol=1e-5)


def test_segment_ids_at_positions():
    segs = SegmentIds(torch.tensor([[0, 0, 1, 1, 2]]), 3)
    assert segs.at(torch.tensor([[4, 0, 2]])).queries.tolist() == [[2, 0, 1]]


def test_varlen_path_traces_forward_and_backward():
    """What AOTAutograd sees of the CUDA path, traced on meta tensors (no GPU here): FlashAttention's varlen forward
    with dropout and its backward, static shapes from the lengths, gradients of q, k and v of the right shapes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(q, k, v, lengths, positions):
        segs = PackedSequences.from_lengths(lengths, WIDTH).segments()
        full = packing._varlen(q, k, v, segs, 0.1)
        picked = packing._varlen(torch.gather(q, 1, positions[:, :, None, None].expand(-1, -1, 2, 64)), k, v,
                                 segs.at(positions), 0.1)
        return torch.autograd.grad(full.float().sum() + picked.float().sum(), (q, k, v))

    q, k, v = (torch.empty(2, WIDTH, 2, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    args = (q, k, v, torch.empty(2, 3, dtype=torch.long, device="meta"),
            torch.empty(2, 7, dtype=torch.long, device="meta"))
    graph = make_fx(step, tracing_mode="fake")(*args)
    ops = [str(n.target) for n in graph.graph.nodes if "flash" in str(n.target)]
    assert ops.count("aten._flash_attention_forward.default") == 2
    assert ops.count("aten._flash_attention_backward.default") == 2
    assert [tuple(g.shape) for g in step(*args)] == [(2, WIDTH, 2, 64)] * 3
