"""pipeline.schema: token dtype, shard schema, manifest validation (what pre-training relies on)."""
from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.schema import (config_hash, instance_schema, read_manifest, shard_name, token_dtype,
                             validate_manifest)
from pipeline.storage import write_json_atomic


def test_uint16_when_the_vocab_fits():
    assert token_dtype(30522) == "uint16" and token_dtype(65536) == "uint16" and token_dtype(65537) == "uint32"
    assert instance_schema(30522).field("input_ids").type == pa.list_(pa.uint16())
    assert instance_schema(100_000).field("masked_lm_ids").type == pa.list_(pa.uint32())
    assert instance_schema(100_000).field("masked_lm_positions").type == pa.list_(pa.uint16())
    assert instance_schema(30522).names == ["input_ids", "a_length", "masked_lm_positions", "masked_lm_ids",
                                           "next_sentence_label"]


def test_config_hash_is_canonical():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1}) != config_hash({"a": 2, "b": [1, 2]})
    assert shard_name(3, 16) == "shards/part-00003-of-00016.parquet"


def _manifest(rows):
    return {"format": "bert-pretrain-dataset", "format_version": 1, "config": {}, "config_hash": "x",
            "vocab": {"file": "vocab.txt", "sha256": "y", "size": 30522, "do_lower_case": True},
            "token_dtype": "uint16", "max_seq_length": 128, "inputs": [],
            "shards": [{"file": shard_name(i, len(rows)), "rows": r} for i, r in enumerate(rows)],
            "totals": {"instances": sum(rows)}, "seq_len_histogram": {}}


def test_validate_and_read_manifest(tmp_path):
    validate_manifest(_manifest([3, 3, 2]))
    with pytest.raises(ValueError, match="not balanced"):
        validate_manifest(_manifest([4, 2]))
    bad = _manifest([1])
    del bad["totals"]
    with pytest.raises(ValueError, match="totals"):
        validate_manifest(bad)
    with pytest.raises(ValueError, match="did not finish"):
        read_manifest(str(tmp_path))
    write_json_atomic(str(tmp_path / "manifest.json"), _manifest([2, 2]))
    assert read_manifest(str(tmp_path))["totals"]["instances"] == 4
