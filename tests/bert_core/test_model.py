"""BertModel / BertForPreTraining: shapes, masking, tied weights, init statistics, sparse vs dense MLM loss."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import bert_core
from bert_core import BertForPreTraining, BertModel

V = 300


def cfg(**kw):
    return bert_core.bert_tiny(vocab_size=V, max_position_embeddings=64, **kw)


@pytest.fixture
def model():
    torch.manual_seed(0)
    return BertModel(cfg()).eval()


def test_shapes(model):
    ids = torch.randint(0, V, (3, 17))
    out = model(input_ids=ids)
    assert out.last_hidden_state.shape == (3, 17, 128) and out.pooler_output.shape == (3, 128)
    assert out[0] is out.last_hidden_state and out["pooler_output"] is out.pooler_output


def test_rejects_too_long_and_bad_shapes(model):
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="batch, seq_len"):
        model(torch.zeros(5, dtype=torch.long))


def test_padding_is_never_attended(model):
    torch.manual_seed(1)
    ids = torch.randint(5, V, (2, 10))
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    ref = model(ids, attention_mask=torch.ones_like(ids), token_type_ids=types).last_hidden_state
    # Append pads of arbitrary content and segment: the real positions must not change.
    for pad_len in (1, 6):
        pad = torch.randint(0, V, (2, pad_len))
        ids2 = torch.cat([ids, pad], 1)
        mask2 = torch.cat([torch.ones_like(ids), torch.zeros_like(pad)], 1)
        types2 = torch.cat([types, torch.randint(0, 2, pad.shape)], 1)
        out = model(ids2, attention_mask=mask2, token_type_ids=types2)
        assert torch.allclose(out.last_hidden_state[:, :10], ref, atol=1e-5)
    # Change the content under the padding mask inside the sequence: real tokens unaffected.
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    a = model(ids, attention_mask=mask).last_hidden_state
    ids_b = ids.clone()
    ids_b[0, 7:] = torch.randint(0, V, (3,))
    b = model(ids_b, attention_mask=mask).last_hidden_state
    assert torch.allclose(a[0, :7], b[0, :7], atol=1e-6)
    assert not torch.allclose(a[0, 7:], b[0, 7:])


def test_token_type_default_is_segment_zero(model):
    ids = torch.randint(0, V, (2, 8))
    a = model(ids).last_hidden_state
    b = model(ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state
    assert torch.equal(a, b)


def test_init_statistics():
    torch.manual_seed(0)
    m = BertForPreTraining(bert_core.bert_mini(vocab_size=2000))
    std = m.config.initializer_range
    w = m.bert.encoder.layer[0].intermediate.dense.weight
    assert w.abs().max() <= 2 * std + 1e-7  # truncated at two standard deviations
    # A normal truncated at +-2 sigma has std 0.8796 sigma.
    assert w.std().item() == pytest.approx(0.8796 * std, rel=0.03)
    assert abs(w.mean().item()) < 1e-3 * 5
    assert m.bert.embeddings.word_embeddings.weight.std().item() == pytest.approx(0.8796 * std, rel=0.03)
    for name, p in m.named_parameters():
        if name.endswith("bias"):
            assert torch.count_nonzero(p) == 0, name
        if "LayerNorm.weight" in name:
            assert torch.all(p == 1), name


def test_tied_weights_share_storage_and_survive_save_load(tmp_path):
    m = BertForPreTraining(cfg())
    dec, emb = m.cls.predictions.decoder.weight, m.bert.embeddings.word_embeddings.weight
    assert dec is emb and dec.data_ptr() == emb.data_ptr()
    # The optimiser sees the matrix once.
    assert sum(p is emb for p in m.parameters()) == 1
    with torch.no_grad():
        emb.add_(1.0)
    m.save_pretrained(tmp_path)
    m2 = BertForPreTraining.from_pretrained(tmp_path)
    assert m2.cls.predictions.decoder.weight is m2.bert.embeddings.word_embeddings.weight
    assert torch.equal(m2.bert.embeddings.word_embeddings.weight, emb)
    for k, v in m.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k]), k


def _pt_batch(b=4, t=20, p=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (b, t), generator=g)
    positions = torch.stack([torch.randperm(t - 2, generator=g)[:p] + 1 for _ in range(b)])
    labels = torch.randint(5, V, (b, p), generator=g)
    labels[1, 2:] = -100  # padding slots
    positions[1, 2:] = 0
    nsp = torch.randint(0, 2, (b,), generator=g)
    return ids, positions, labels, nsp


def _dense_labels(ids, positions, labels):
    dense = torch.full_like(ids, -100)
    for i in range(ids.shape[0]):
        for j in range(positions.shape[1]):
            if labels[i, j] != -100:
                dense[i, positions[i, j]] = labels[i, j]
    return dense


def _grads(m, loss):
    m.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("fused", [True, False])
def test_sparse_mlm_loss_equals_dense_loss(fused):
    """Sparse head (+ sparse last layer, + the fused loss or not) == full-vocabulary loss on the same positions,
    in value and in every parameter's gradient: it is an exact computation, not an approximation."""
    torch.manual_seed(0)
    m = BertForPreTraining(cfg()).eval()
    m.mlm_head = "chunked" if fused else "gemm"
    ids, positions, labels, nsp = _pt_batch()
    dense_labels = _dense_labels(ids, positions, labels)
    sparse = m(ids, masked_lm_positions=positions, masked_lm_labels=labels, next_sentence_label=nsp)
    dense = m(ids, masked_lm_labels=dense_labels, next_sentence_label=nsp)
    assert dense.mlm_logits.shape == (4, 20, V)
    if fused:
        assert sparse.mlm_logits is None  # never materialised while training
    else:
        assert sparse.mlm_logits.shape == ((labels != -100).sum().item(), V)
    ref = F.cross_entropy(dense.mlm_logits.reshape(-1, V), dense_labels.reshape(-1), ignore_index=-100)
    assert sparse.mlm_loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert dense.mlm_loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert sparse.nsp_loss.item() == pytest.approx(dense.nsp_loss.item(), abs=1e-6)
    assert sparse.loss.item() == pytest.approx(sparse.mlm_loss.item() + sparse.nsp_loss.item(), abs=1e-6)
    assert sparse.mlm_count.item() == (labels != -100).sum().item() == dense.mlm_count.item()
    assert sparse.mlm_correct.item() == dense.mlm_correct.item()
    g_sparse, g_dense = _grads(m, sparse.loss), _grads(m, dense.loss)
    assert g_sparse.keys() == g_dense.keys()
    for name in g_dense:
        assert torch.allclose(g_sparse[name], g_dense[name], atol=1e-6), name


def test_sparse_last_layer_is_exact_at_requested_rows(model):
    torch.manual_seed(3)
    ids = torch.randint(0, V, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    full = model(ids, attention_mask=mask)
    rows = torch.tensor([[0, 3, 9], [0, 11, 2]])
    part = model(ids, attention_mask=mask, output_positions=rows)
    assert part.last_hidden_state.shape == (2, 3, 128)
    expected = torch.gather(full.last_hidden_state, 1, rows.unsqueeze(-1).expand(-1, -1, 128))
    assert torch.allclose(part.last_hidden_state, expected, atol=1e-5)
    assert torch.allclose(part.pooler_output, full.pooler_output, atol=1e-5)


def test_logits_returned_without_gradients():
    m = BertForPreTraining(cfg()).eval()
    ids, positions, labels, nsp = _pt_batch()
    with torch.no_grad():
        out = m(ids, masked_lm_positions=positions, masked_lm_labels=labels, next_sentence_label=nsp)
    assert out.mlm_logits.shape == ((labels != -100).sum().item(), V)
    assert out.prediction_logits is out.mlm_logits and out.seq_relationship_logits.shape == (4, 2)


def test_accuracy_counts_exact():
    torch.manual_seed(0)
    m = BertForPreTraining(cfg()).eval()
    ids, positions, labels, nsp = _pt_batch()
    with torch.no_grad():
        out = m(ids, masked_lm_positions=positions, masked_lm_labels=labels, next_sentence_label=nsp)
    pred = out.mlm_logits.argmax(-1)
    assert out.mlm_correct.item() == (pred == labels[labels != -100]).sum().item()
    assert out.nsp_count.item() == 4
    assert out.nsp_correct.item() == (out.nsp_logits.argmax(-1) == nsp).sum().item()
    assert out.mlm_accuracy.item() == pytest.approx(out.mlm_correct.item() / out.mlm_count.item())
    # Make the model right on every slot: accuracy 1.
    labels2 = torch.where(labels == -100, labels, torch.zeros_like(labels))
    labels2[labels != -100] = pred
    assert m(ids, masked_lm_positions=positions, masked_lm_labels=labels2).mlm_accuracy.item() == 1.0


def test_no_valid_masked_positions_gives_zero_not_nan():
    m = BertForPreTraining(cfg())
    ids, positions, labels, nsp = _pt_batch()
    out = m(ids, masked_lm_positions=positions, masked_lm_labels=torch.full_like(labels, -100),
            next_sentence_label=nsp)
    assert out.mlm_loss.item() == 0.0 and out.mlm_count.item() == 0 and not math.isnan(out.loss.item())
    out.loss.backward()


def test_masked_lm_argument_shapes_are_checked():
    m = BertForPreTraining(cfg())
    ids, positions, labels, _ = _pt_batch()
    with pytest.raises(ValueError, match="same shape|shape of masked_lm_positions"):
        m(ids, masked_lm_positions=positions, masked_lm_labels=labels[:, :2])


def test_gradient_checkpointing_same_gradients():
    torch.manual_seed(0)
    m = BertForPreTraining(cfg(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).train()
    ids, positions, labels, nsp = _pt_batch()
    m(ids, masked_lm_positions=positions, masked_lm_labels=labels, next_sentence_label=nsp).loss.backward()
    g1 = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    m.bert.encoder.gradient_checkpointing = True
    m(ids, masked_lm_positions=positions, masked_lm_labels=labels, next_sentence_label=nsp).loss.backward()
    for n, p in m.named_parameters():
        assert torch.allclose(p.grad, g1[n], atol=1e-6), n
