"""Packed rows on CUDA: FlashAttention-2's variable-length kernel (bf16) gives what the block-diagonal reference
gives, forward and backward, also for the last layer's picked queries; with attention dropout on, no sequence
reaches another; the packed step compiles as one graph. Skipped without a GPU."""
from __future__ import annotations

import pytest
import torch
from _packed_batches import LENGTHS, WIDTH, cfg, make_sequences, packed_batch, unpacked_batch

from bert_core import BertForPreTraining, packing
from bert_core.packing import PackedSequences, packed_attention

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_varlen_kernel_matches_the_block_mask_forward_and_backward():
    g = torch.Generator(device="cuda").manual_seed(0)
    segs = PackedSequences.from_lengths(torch.tensor(LENGTHS, device="cuda"), WIDTH).segments()
    q, k, v = (torch.randn(2, WIDTH, 2, 64, generator=g, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    positions = torch.tensor([[0, 9, 23, 3, 30, 0, 0], [0, 17, 23, 5, 20, 1, 0]], device="cuda")
    for picked in (False, True):
        s = segs.at(positions) if picked else segs
        qq = torch.gather(q, 1, positions[:, :, None, None].expand(-1, -1, 2, 64)) if picked else q
        assert packing._use_varlen(qq)
        out = packed_attention(qq, k, v, s, 0.0)
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
        mask = (s.keys if s.queries is None else s.queries)[:, :, None] == s.keys[:, None, :]
        ref = torch.nn.functional.scaled_dot_product_attention(
            qq.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),
            attn_mask=mask[:, None]).transpose(1, 2)
        ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
        for a, b in zip(grads, ref_grads, strict=False):
            torch.testing.assert_close(a.float(), b, atol=5e-2, rtol=5e-2)


def test_packed_equals_unpacked_on_cuda_and_dropout_stays_inside_sequences():
    torch.manual_seed(0)
    model = BertForPreTraining(cfg(attention_probs_dropout_prob=0.1)).cuda().train()
    seqs = make_sequences(1)
    batch = {k: v.cuda() for k, v in packed_batch(seqs, 8).items()}
    ids = batch["input_ids"].clone()
    ids[0, 9:23] = torch.randint(5, 300, (14,), device="cuda")  # another middle sequence in row 0
    hidden = []
    for input_ids in (batch["input_ids"], ids):
        torch.manual_seed(1)  # the same dropout masks
        with torch.autocast("cuda", torch.bfloat16):
            hidden.append(model.bert(input_ids, token_type_ids=batch["token_type_ids"],
                                     sequence_lengths=batch["sequence_lengths"]).last_hidden_state)
    torch.testing.assert_close(hidden[1][0, :9], hidden[0][0, :9], atol=0, rtol=0)
    torch.testing.assert_close(hidden[1][1], hidden[0][1], atol=0, rtol=0)
    model.eval()  # no dropout: packed losses are the unpacked ones
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        packed = model(**batch)
        ref = model(**{k: v.cuda() for k, v in unpacked_batch(seqs, 4).items()})
    torch.testing.assert_close(packed.mlm_loss, ref.mlm_loss, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(packed.nsp_loss, ref.nsp_loss, atol=2e-2, rtol=2e-2)


def test_packed_step_compiles_once_on_cuda():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = BertForPreTraining(cfg()).cuda().train()
    compiled = torch.compile(model, dynamic=False, fullgraph=True)
    before = counters["stats"]["unique_graphs"]
    for seed in (3, 4):
        batch = {k: v.cuda() for k, v in packed_batch(make_sequences(seed), 8).items()}
        with torch.autocast("cuda", torch.bfloat16):
            loss = compiled(**batch).loss
        loss.backward()
        assert torch.isfinite(loss)
    assert counters["stats"]["unique_graphs"] - before == 1


def test_compiled_packed_step_with_dropout_matches_the_padded_one():
    """The real phase-2 path (issue 24): compiled, dropout on (FlashAttention's varlen kernel with dropout, the fused
    LayerNorm kernels). Dropout masks differ between the two layouts, so the loss and the gradients are compared
    averaged over 16 steps' masks: the same expectation, up to dropout noise."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = BertForPreTraining(cfg(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)).cuda().train()
    seqs = make_sequences(5)
    batches = {"packed": {k: v.cuda() for k, v in packed_batch(seqs, 8).items()},
               "padded": {k: v.cuda() for k, v in unpacked_batch(seqs, 8).items()}}
    means = {}
    for name, batch in batches.items():
        compiled = torch.compile(model, dynamic=False, fullgraph=True)
        losses, grads = [], None
        for seed in range(16):
            torch.manual_seed(seed)
            model.zero_grad()
            with torch.autocast("cuda", torch.bfloat16):
                loss = compiled(**batch).loss
            loss.backward()
            losses.append(loss.item())
            flat = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
            grads = flat if grads is None else grads + flat
        assert all(torch.isfinite(torch.tensor(losses))), (name, losses)
        means[name] = (sum(losses) / len(losses), grads / 16)
    (packed_loss, packed_grad), (padded_loss, padded_grad) = means["packed"], means["padded"]
    assert packed_loss == pytest.approx(padded_loss, rel=0.05), (packed_loss, padded_loss)
    cosine = torch.nn.functional.cosine_similarity(packed_grad, padded_grad, dim=0).item()
    assert cosine > 0.9, cosine
