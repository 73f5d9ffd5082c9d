"""corpus.schema: token dtype, shard schema, manifest validation and the typed manifest pre-training reads."""
from __future__ import annotations

import dataclasses
import hashlib
import json

import pyarrow as pa
import pytest

from corpus.schema import config_hash, instance_schema, read_manifest, shard_name, token_dtype, validate_manifest
from storage.fs import write_json_atomic


def test_uint16_when_the_vocab_fits():
    assert token_dtype(30522) == "uint16" and token_dtype(65536) == "uint16" and token_dtype(65537) == "uint32"
    assert instance_schema(30522).field("input_ids").type == pa.list_(pa.uint16())
    assert instance_schema(100_000).field("masked_lm_ids").type == pa.list_(pa.uint32())
    assert instance_schema(100_000).field("masked_lm_positions").type == pa.list_(pa.uint16())
    assert instance_schema(30522).names == ["input_ids", "a_length", "masked_lm_positions", "masked_lm_ids",
                                           "next_sentence_label"]


def test_config_hash_is_canonical():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1}) \
        != config_hash({"a": 2, "b": [1, 2]})
    assert shard_name(3, 16) == "shards/part-00003-of-00016.parquet"


def _manifest(rows, vocab_size=30522):
    return {"format": "bert-pretrain-dataset", "format_version": 1,
            "config": {"instances": {"max_predictions_per_seq": 12, "masked_lm_prob": 0.2}}, "config_hash": "x",
            "vocab": {"file": "vocab.txt", "sha256": "y", "size": vocab_size, "do_lower_case": True},
            "token_dtype": "uint16", "max_seq_length": 128, "inputs": [],
            "shards": [{"file": shard_name(i, len(rows)), "rows": r} for i, r in enumerate(rows)],
            "totals": {"instances": sum(rows)}, "seq_len_histogram": {"128": 3, "17": 1}}


def test_validate_manifest(tmp_path):
    validate_manifest(_manifest([3, 3, 2]))
    with pytest.raises(ValueError, match="not balanced"):
        validate_manifest(_manifest([4, 2]))
    bad = _manifest([1])
    del bad["totals"]
    with pytest.raises(ValueError, match="totals"):
        validate_manifest(bad)


def test_read_manifest_gives_one_frozen_object(tmp_path):
    with pytest.raises(ValueError, match="did not finish"):
        read_manifest(str(tmp_path))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "whale", "ship"]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n")
    write_json_atomic(str(tmp_path / "manifest.json"), _manifest([2, 2], vocab_size=7))
    m = read_manifest(str(tmp_path))
    assert read_manifest(str(tmp_path / "manifest.json")) == m  # the folder or its manifest.json
    assert m.url == str(tmp_path) and m.instances == 4 and m.shard_rows == (2, 2)
    assert m.shard_urls == (str(tmp_path / "shards/part-00000-of-00002.parquet"),
                            str(tmp_path / "shards/part-00001-of-00002.parquet"))
    assert (m.vocab.size, m.vocab.mask_id, m.vocab.sha256, m.vocab.url) == (7, 4, "y", str(tmp_path / "vocab.txt"))
    assert (m.max_seq_length, m.max_predictions, m.masked_lm_prob, m.config_hash) == (128, 12, 0.2, "x")
    assert m.seq_len_histogram == ((17, 1), (128, 3))  # by length, as numbers
    manifest_json = json.loads((tmp_path / "manifest.json").read_text())
    assert m.sha256 == hashlib.sha256(json.dumps(manifest_json, sort_keys=True).encode()).hexdigest()
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.max_seq_length = 64


def test_a_relative_dataset_path_is_read_as_an_absolute_one(tmp_path, monkeypatch):
    """Training workers (Ray Train's) run in another working directory than the job that read the manifest."""
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) + "\n")
    write_json_atomic(str(tmp_path / "ds" / "manifest.json"), _manifest([2], vocab_size=5))
    monkeypatch.chdir(tmp_path)
    m = read_manifest("ds")
    assert m.url == str(tmp_path / "ds") and m.vocab.url == str(tmp_path / "ds" / "vocab.txt")
    assert m.shard_urls == (str(tmp_path / "ds" / "shards/part-00000-of-00001.parquet"),)


def test_read_manifest_checks_the_vocabulary(tmp_path):
    write_json_atomic(str(tmp_path / "manifest.json"), _manifest([2, 2], vocab_size=7))
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    with pytest.raises(ValueError, match="has 2 entries, the manifest says 7"):
        read_manifest(str(tmp_path))
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b", "c"]) + "\n")
    with pytest.raises(ValueError, match=r"no \[MASK\] token"):
        read_manifest(str(tmp_path))
