"""Fine-tuning heads: shapes, losses (classification, pairs, regression, multi-label, tagging, QA), HF layout."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import bert_core
from bert_core import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification

V = 200


def cfg(**kw):
    return bert_core.bert_tiny(vocab_size=V, max_position_embeddings=64, **kw)


def batch(b=3, t=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[2, 9:] = 0
    types = torch.zeros(b, t, dtype=torch.long)
    types[:, 6:] = 1
    return ids, mask, types


def test_sequence_classification_single_and_pair():
    torch.manual_seed(0)
    m = BertForSequenceClassification(cfg(num_labels=3)).eval()
    ids, mask, types = batch()
    labels = torch.tensor([0, 2, 1])
    out = m(ids, attention_mask=mask, token_type_ids=types, labels=labels)
    assert out.logits.shape == (3, 3)
    assert out.loss.item() == pytest.approx(F.cross_entropy(out.logits, labels).item(), abs=1e-6)
    # The segment ids reach the model: a pair encodes differently from the same tokens as one segment.
    single = m(ids, attention_mask=mask).logits
    assert not torch.allclose(single, out.logits)
    out.loss.backward()
    assert m.classifier.weight.grad is not None and m.bert.embeddings.token_type_embeddings.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kw", [dict(num_labels=1), dict(num_labels=2, problem_type="regression")])
def test_sequence_regression_uses_mse(kw):
    torch.manual_seed(0)
    m = BertForSequenceClassification(cfg(**kw)).eval()
    ids, mask, types = batch()
    n = kw["num_labels"]
    labels = torch.tensor([0.5, 3.0, -1.0]) if n == 1 else torch.randn(3, 2)
    out = m(ids, attention_mask=mask, labels=labels)
    expected = F.mse_loss(out.logits.squeeze(-1), labels) if n == 1 else F.mse_loss(out.logits, labels)
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_multi_label_uses_bce():
    torch.manual_seed(0)
    m = BertForSequenceClassification(cfg(num_labels=4)).eval()
    ids, mask, _ = batch()
    labels = torch.tensor([[1.0, 0, 1, 0], [0, 0, 0, 1], [1, 1, 1, 1]])
    out = m(ids, attention_mask=mask, labels=labels)
    assert out.loss.item() == pytest.approx(F.binary_cross_entropy_with_logits(out.logits, labels).item(), rel=1e-6)


def test_token_classification_ignores_minus_100():
    torch.manual_seed(0)
    m = BertForTokenClassification(cfg(num_labels=5)).eval()
    ids, mask, _ = batch()
    labels = torch.randint(0, 5, ids.shape)
    labels[:, 0] = -100
    labels[2, 9:] = -100
    out = m(ids, attention_mask=mask, labels=labels)
    assert out.logits.shape == (3, 12, 5)
    keep = labels != -100
    assert out.loss.item() == pytest.approx(F.cross_entropy(out.logits[keep], labels[keep]).item(), abs=1e-6)
    assert m.bert.pooler is None


def test_question_answering_loss_and_out_of_range_positions():
    torch.manual_seed(0)
    m = BertForQuestionAnswering(cfg()).eval()
    ids, mask, types = batch()
    start, end = torch.tensor([3, 7, 50]), torch.tensor([4, 9, 60])  # row 2's answer was truncated away
    out = m(ids, attention_mask=mask, token_type_ids=types, start_positions=start, end_positions=end)
    assert out.start_logits.shape == out.end_logits.shape == (3, 12)
    assert out.logits.shape == (3, 12, 2)
    s = F.cross_entropy(out.start_logits[:2], start[:2])
    e = F.cross_entropy(out.end_logits[:2], end[:2])
    assert out.loss.item() == pytest.approx(((s + e) / 2).item(), abs=1e-6)


def test_heads_save_in_hf_layout_and_load_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    ids, mask, types = batch()
    for ours_cls, name, kw in [(BertForSequenceClassification, "BertForSequenceClassification", dict(num_labels=3)),
                               (BertForTokenClassification, "BertForTokenClassification", dict(num_labels=4)),
                               (BertForQuestionAnswering, "BertForQuestionAnswering", {})]:
        torch.manual_seed(0)
        ours = ours_cls(cfg(**kw)).eval()
        d = tmp_path / name
        ours.save_pretrained(d)
        theirs, info = getattr(transformers, name).from_pretrained(d, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], (name, info)
        with torch.no_grad():
            a = ours(ids, attention_mask=mask, token_type_ids=types)
            b = theirs.eval()(input_ids=ids, attention_mask=mask, token_type_ids=types)
        if name == "BertForQuestionAnswering":
            assert torch.allclose(a.start_logits, b.start_logits, atol=1e-5)
        elif name == "BertForTokenClassification":
            assert torch.allclose(a.logits[mask.bool()], b.logits[mask.bool()], atol=1e-5)
        else:
            assert torch.allclose(a.logits, b.logits, atol=1e-5)
        # And back, into ours, with the same outputs.
        again = ours_cls.from_pretrained(d)
        assert torch.equal(again.state_dict()[next(iter(again.state_dict()))],
                           ours.state_dict()[next(iter(ours.state_dict()))])


def test_pretraining_checkpoint_into_heads(tmp_path, caplog):
    torch.manual_seed(0)
    pre = bert_core.BertForPreTraining(cfg())
    pre.save_pretrained(tmp_path / "ckpt" / "model")  # our pre-training checkpoint layout: DIR/model/
    m, info = BertForTokenClassification.from_pretrained(tmp_path / "ckpt", num_labels=7, output_loading_info=True)
    assert sorted(info["missing_keys"]) == ["classifier.bias", "classifier.weight"]
    assert all(k.startswith("cls.") for k in info["unexpected_keys"])  # pre-training heads, not needed here
    assert torch.equal(m.bert.embeddings.word_embeddings.weight, pre.bert.embeddings.word_embeddings.weight)
    assert m.config.num_labels == 7
    assert "newly initialised" in caplog.text


def test_shape_mismatch_is_a_clear_error(tmp_path):
    BertForSequenceClassification(cfg(num_labels=3)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="ignore_mismatched_sizes"):
        BertForSequenceClassification.from_pretrained(tmp_path, config=cfg(num_labels=5))
    m, info = BertForSequenceClassification.from_pretrained(tmp_path, config=cfg(num_labels=5),
                                                            ignore_mismatched_sizes=True, output_loading_info=True)
    assert {k for k, _, _ in info["mismatched_keys"]} == {"classifier.weight", "classifier.bias"}
    assert m.classifier.weight.shape == (5, 128)


def test_loads_legacy_names_and_refuses_pickled_weights(tmp_path):
    """Old checkpoints: gamma/beta LayerNorm names, no prefix, a stray position_ids buffer load; pytorch_model.bin
    (a pickle) is refused with the conversion to run, never unpickled."""
    torch.manual_seed(0)
    ref = bert_core.BertModel(cfg()).eval()
    sd = bert_core.hf.to_hf_state_dict(ref.state_dict())
    sd = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
          for k, v in sd.items()}
    sd["embeddings.position_ids"] = torch.arange(64)[None]
    ref.config.to_json_file(tmp_path / "config.json")
    torch.save(sd, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="pytorch_model.bin: pickled weights are not loaded .*save_pretrained"):
        bert_core.BertModel.from_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").unlink()
    bert_core.hf.save_weights({k: v.contiguous() for k, v in sd.items()}, tmp_path / "model.safetensors")
    m, info = bert_core.BertModel.from_pretrained(tmp_path, output_loading_info=True)
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}
    ids, mask, _ = batch()
    assert torch.equal(m(ids, attention_mask=mask).last_hidden_state, ref(ids, attention_mask=mask).last_hidden_state)


def test_missing_directory_errors(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        bert_core.BertModel.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        bert_core.BertModel.from_pretrained(tmp_path / "nope")


def test_compiled_submodule_keys_are_saved_under_hf_names():
    sd = {"bert._orig_mod.encoder.layer.0.attention.self.qkv.weight": torch.zeros(6, 2),
          "cls._orig_mod.seq_relationship.bias": torch.zeros(2)}
    out = bert_core.hf.to_hf_state_dict(sd)
    assert set(out) == {"bert.encoder.layer.0.attention.self.query.weight",
                        "bert.encoder.layer.0.attention.self.key.weight",
                        "bert.encoder.layer.0.attention.self.value.weight", "cls.seq_relationship.bias"}
