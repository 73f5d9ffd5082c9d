"""The input is read once: a build's store (an http server with ETags and byte ranges, as object stores serve reads)
sends at most 1.2x the input's bytes, for plain and compressed inputs of several units."""
from __future__ import annotations

import gzip

import pytest
from _ranged_http import RangedStore, size_of

from corpus.create_instances import InstanceConfig
from pipeline import BuildConfig, build


@pytest.fixture(scope="module")
def store(tmp_path_factory, sample_dir):
    root = tmp_path_factory.mktemp("www")
    text = b"".join(gzip.open(p).read() for p in sorted((sample_dir / "corpus").glob("*.jsonl.gz")))
    (root / "corpus.jsonl").write_bytes(text)  # ~5 MB: three units of 2 MiB
    (root / "corpus.jsonl.gz").write_bytes(gzip.compress(text, compresslevel=1))
    with RangedStore(root) as s:
        yield s, root


@pytest.mark.parametrize("name", ["corpus.jsonl", "corpus.jsonl.gz"])
def test_the_store_sends_the_input_once(store, tmp_path, sample_dir, name):
    s, root = store
    s.sent.clear()
    m = build(BuildConfig(inputs=(s.url(name),), output=str(tmp_path / "out"), dupe_factor=1, num_shards=2,
                          unit_bytes=2 << 20, vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"),
                          instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10)))
    assert m.totals.documents > 300
    assert 1.0 <= s.sent[name] / size_of(root, name) <= 1.2, (s.sent[name], size_of(root, name))
