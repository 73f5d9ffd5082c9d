"""BertConfig: presets, validation messages, HF config.json round trip."""
from __future__ import annotations

import dataclasses
import json

import pytest

import bert_core
from bert_core import PRESETS, BertConfig


@pytest.mark.parametrize("name,layers,hidden", [("bert_tiny", 2, 128), ("bert_mini", 4, 256), ("bert_small", 4, 512),
                                                ("bert_medium", 8, 512), ("bert_base", 12, 768),
                                                ("bert_large", 24, 1024)])
def test_presets(name, layers, hidden):
    cfg = PRESETS[name]()
    assert (cfg.num_hidden_layers, cfg.hidden_size) == (layers, hidden)
    assert cfg.num_attention_heads == hidden // 64 and cfg.intermediate_size == 4 * hidden
    assert getattr(bert_core, name) is PRESETS[name]
    assert PRESETS[name](vocab_size=8000).vocab_size == 8000


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(hidden_size=100, num_attention_heads=3), "multiple of num_attention_heads"),
    (dict(vocab_size=0), "vocab_size must be a positive int"),
    (dict(hidden_dropout_prob=1.0), "hidden_dropout_prob"),
    (dict(hidden_act="swish"), "hidden_act"),
    (dict(pad_token_id=40000), "pad_token_id"),
    (dict(problem_type="ranking"), "problem_type"),
    (dict(num_labels=3, id2label={0: "a", 1: "b"}), "disagrees with id2label"),
    (dict(num_labels=1, problem_type="single_label_classification"), "regression"),
])
def test_validation_errors_say_how_to_fix(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        BertConfig(**kwargs)


def test_frozen_and_replace():
    cfg = bert_core.bert_tiny()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hidden_size = 3  # type: ignore[misc]
    assert cfg.replace(num_labels=5).id2label == {i: f"LABEL_{i}" for i in range(5)}


def test_labels_derived_like_hf():
    cfg = BertConfig(id2label={"0": "neg", "1": "neu", "2": "pos"})
    assert cfg.num_labels == 3 and cfg.label2id == {"neg": 0, "neu": 1, "pos": 2}
    assert BertConfig().num_labels == 2


def test_json_roundtrip_and_hf_extra_keys(tmp_path):
    cfg = bert_core.bert_mini(vocab_size=8000, id2label={0: "x", 1: "y", 2: "z"}, problem_type=None)
    cfg.to_json_file(tmp_path / "config.json")
    d = json.loads((tmp_path / "config.json").read_text())
    assert d["model_type"] == "bert" and d["id2label"] == {"0": "x", "1": "y", "2": "z"}
    assert BertConfig.from_json_file(tmp_path / "config.json") == cfg
    d.update(transformers_version="4.8.2", gradient_checkpointing=False, use_cache=True, _name_or_path="x")
    assert BertConfig.from_dict(d) == cfg
    assert BertConfig.from_dict(d, num_labels=2).num_labels == 2  # a new head size replaces the stored labels


def test_transformers_reads_our_config(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = bert_core.bert_tiny(vocab_size=1000, id2label={0: "O", 1: "B-PER", 2: "I-PER"})
    cfg.to_json_file(tmp_path / "config.json")
    theirs = transformers.BertConfig.from_pretrained(tmp_path)
    assert theirs.num_labels == 3 and theirs.id2label[1] == "B-PER"
    assert theirs.hidden_size == 128 and theirs.num_hidden_layers == 2 and theirs.vocab_size == 1000


@pytest.mark.parametrize("bad", [{"model_type": "roberta"}, {"position_embedding_type": "relative_key"},
                                 {"is_decoder": True}])
def test_unsupported_hf_configs_are_rejected(bad):
    with pytest.raises(ValueError):
        BertConfig.from_dict({**bert_core.bert_tiny().to_dict(), **bad})
