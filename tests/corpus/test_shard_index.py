"""The shard's sidecar index (corpus/shard_index.py) and the manifest keys that vouch for it."""
from __future__ import annotations

import hashlib
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus.schema import Manifest, instance_schema, parse_manifest, validate_manifest
from corpus.shard_index import ShardIndex, index_name, index_parquet, verify_span
from tests.corpus.test_schema import _manifest

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "whale", "ship"]


def _shard(path, rows: int, row_group: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 128, rows)
    table = pa.table({
        "input_ids": pa.array([rng.integers(0, 7, n).astype(np.uint16) for n in lengths], pa.list_(pa.uint16())),
        "a_length": pa.array(lengths // 2, pa.int16()),
        "masked_lm_positions": pa.array([[1, 2]] * rows, pa.list_(pa.uint16())),
        "masked_lm_ids": pa.array([[5, 6]] * rows, pa.list_(pa.uint16())),
        "next_sentence_label": pa.array(rng.integers(0, 2, rows), pa.int8()),
    }, schema=instance_schema(7))
    pq.write_table(table, path, row_group_size=row_group, compression="zstd")
    return lengths


def test_each_row_group_is_read_from_its_span_alone_and_verified(tmp_path):
    path = str(tmp_path / "part-00000-of-00001.parquet")
    lengths = _shard(path, 1000, 300)
    idx = index_parquet(path, lengths)
    data = open(path, "rb").read()
    assert idx.file_bytes == len(data) and idx.file_sha256 == hashlib.sha256(data).hexdigest()
    assert idx.group_rows.tolist() == [300, 300, 300, 100] and idx.lengths.dtype == np.uint16
    assert idx.group_starts().tolist() == [0, 300, 600, 900, 1000]
    assert (idx.lengths == lengths).all()
    # A reader holding only the footer and one row group's span decodes exactly that group's rows.
    g = 2
    off, size = idx.group_spans[g]
    foff, fsize = idx.footer_span
    verify_span(data[off:off + size], idx.group_sha256[g], "group")
    verify_span(data[foff:], idx.footer_sha256, "footer")
    sparse = bytearray(len(data))
    sparse[off:off + size] = data[off:off + size]
    sparse[foff:] = data[foff:]
    got = pq.ParquetFile(io.BytesIO(bytes(sparse))).read_row_group(g, columns=["input_ids"])
    assert [len(x) for x in got.column("input_ids").to_pylist()] == lengths[600:900].tolist()
    # A replaced byte inside the span is refused, naming what was read.
    tampered = bytearray(data[off:off + size])
    tampered[size // 2] ^= 1
    with pytest.raises(ValueError, match="part-7.*replaced or damaged"):
        verify_span(bytes(tampered), idx.group_sha256[g], "part-7")


def test_the_index_round_trips_and_refuses_nonsense(tmp_path):
    path = str(tmp_path / "s.parquet")
    idx = index_parquet(path, _shard(path, 50, 16))
    blob = idx.to_bytes()
    back = ShardIndex.from_bytes(blob, hashlib.sha256(blob).hexdigest(), "idx")
    assert back.group_sha256 == idx.group_sha256 and (back.lengths == idx.lengths).all()
    assert back.footer_span == idx.footer_span and back.file_sha256 == idx.file_sha256
    with pytest.raises(ValueError, match="idx: sha256"):
        ShardIndex.from_bytes(blob, "0" * 64, "idx")
    with pytest.raises(ValueError, match="not a shard index"):
        ShardIndex.from_bytes(b"not an npz", None, "idx")
    # Well-formed npz whose row groups do not add up to the rows.
    buf = io.BytesIO()
    arrays = dict(np.load(io.BytesIO(blob), allow_pickle=False))
    arrays["group_rows"] = arrays["group_rows"] + 1
    np.savez(buf, **arrays)
    with pytest.raises(ValueError, match="group_rows"):
        ShardIndex.from_bytes(buf.getvalue(), None, "idx")
    # A pickled object array is data it refuses, never code it runs.
    buf = io.BytesIO()
    np.savez(buf, **(arrays | {"lengths": np.array([object()], dtype=object)}))
    with pytest.raises(ValueError, match="not a shard index"):
        ShardIndex.from_bytes(buf.getvalue(), None, "idx")
    with pytest.raises(ValueError, match="3 lengths for 50 rows"):
        index_parquet(path, np.ones(3))


def test_the_manifest_carries_the_digests_and_refuses_half_of_them(tmp_path):
    m = _manifest([2, 2], vocab_size=7)
    validate_manifest(m)  # a dataset built before: no keys, still read
    for s in m["shards"]:
        s |= {"sha256": "a" * 64, "bytes": 10, "index": index_name(s["file"]), "index_sha256": "b" * 64}
    validate_manifest(m)
    manifest = parse_manifest(m, str(tmp_path), "\n".join(TOKENS))
    assert isinstance(manifest, Manifest)
    s0 = manifest.shards[0]
    assert s0.index_url == str(tmp_path / "shards/part-00000-of-00002.index.npz") and s0.bytes == 10
    assert manifest.to_dict()["shards"] == m["shards"]  # the record gives the same entries back
    for key, value, why in (("sha256", "A" * 64, "not a sha256"), ("bytes", -1, "non-negative"),
                            ("index", "../x.index.npz", "is not"), ("index_sha256", None, "not a sha256")):
        bad = _manifest([2, 2], vocab_size=7)
        bad["shards"] = [dict(s) for s in m["shards"]]
        bad["shards"][1][key] = value
        with pytest.raises(ValueError, match=why):
            validate_manifest(bad)
    half = _manifest([2, 2], vocab_size=7)
    half["shards"][0]["sha256"] = "a" * 64
    with pytest.raises(ValueError, match="not all of"):
        validate_manifest(half)
