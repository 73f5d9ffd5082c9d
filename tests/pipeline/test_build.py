"""pipeline as a plain loop: exact balance, shuffled shards, a complete manifest written last, output that
does not depend on the unit size, reruns that do nothing, and a different config refused."""
from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter

import pyarrow.parquet as pq
import pytest

from corpus.create_instances import InstanceConfig
from corpus.readers import ReadOptions
from corpus.schema import REQUIRED_MANIFEST_KEYS, instance_schema, read_manifest
from pipeline import BuildConfig, build

# One distinct, single-piece word per document: a row's document is the most common word of its segment A.
WORDS = ("apple river house music water garden silver winter doctor castle forest engine market summer "
         "window letter island mother soldier church captain morning village animal bridge").split()


N_WORDS = len(WORDS)


def write_corpus(path, n_docs=N_WORDS, sentences=12):
    with open(path, "w") as f:
        for i in range(n_docs):
            w = WORDS[i % len(WORDS)]
            text = " ".join(f"The {w} {w} and the {w} number {j}." for j in range(sentences))
            f.write(json.dumps({"text": text}) + "\n")
    return str(path)


def config(tmp_path, corpus, name="out", **kw):
    base = dict(inputs=(corpus,), output=str(tmp_path / name), vocab=os.environ["BERT_TEST_VOCAB"],
                dupe_factor=3, num_shards=5, instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10))
    base.update(kw)
    return BuildConfig(**base)


@pytest.fixture(autouse=True)
def _vocab(sample_dir, monkeypatch):
    monkeypatch.setenv("BERT_TEST_VOCAB", str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"))


def shard_tables(out):
    m = json.load(open(os.path.join(out, "manifest.json")))
    return m, [pq.read_table(os.path.join(out, s["file"])) for s in m["shards"]]


def test_balanced_shards_and_complete_manifest(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl")
    m = build(config(tmp_path, corpus, num_shards=7))
    out = tmp_path / "out"
    written, tables = shard_tables(out)
    assert m == read_manifest(str(out)) and set(REQUIRED_MANIFEST_KEYS) <= set(written)  # what a reader sees
    rows = [t.num_rows for t in tables]
    assert max(rows) - min(rows) <= 1 and sum(rows) == m.totals.instances > 50
    assert list(m.shard_rows) == rows
    assert all(t.schema.equals(instance_schema(30522)) for t in tables)
    t = m.totals
    assert (t.documents, m.dropped) == (len(WORDS), {})
    assert t.sentences == 12 * len(WORDS) and t.tokens > 0
    assert sum(n for _, n in m.seq_len_histogram) == t.instances
    assert max(m.seq_lengths) <= 64
    assert m.inputs[0]["path"] == corpus and m.input_bytes == os.path.getsize(corpus)
    assert m.vocab.size == 30522 and len(m.vocab.sha256) == 64
    assert (out / "vocab.txt").read_bytes() == open(os.environ["BERT_TEST_VOCAB"], "rb").read()
    assert not (out / "_work").exists()
    # Manifest written last: nothing in the output is newer (but the writer lease's record, released after it).
    newest = max(os.stat(os.path.join(d, f)).st_mtime_ns for d, _, fs in os.walk(out) for f in fs
                 if "_writer.lease.json" not in d)
    assert os.stat(out / "manifest.json").st_mtime_ns == newest
    row = tables[0].slice(0, 1).to_pylist()[0]
    ids, a = row["input_ids"], row["a_length"]
    assert ids[0] == 101 and ids[a + 1] == 102 and ids[-1] == 102  # [CLS] A [SEP] B [SEP]
    assert all(ids[p] != 101 and ids[p] != 102 for p in row["masked_lm_positions"])


def test_rows_are_shuffled_across_documents(tmp_path, sample_dir):
    corpus = write_corpus(tmp_path / "c.jsonl")
    build(config(tmp_path, corpus, num_shards=2))
    from corpus.tokenize import read_vocab

    vocab = {t: i for i, t in enumerate(read_vocab(os.environ["BERT_TEST_VOCAB"]))}
    doc_of = {vocab[w]: i for i, w in enumerate(WORDS)}
    _, tables = shard_tables(tmp_path / "out")
    for t in tables:
        docs = []
        for ids, a in zip(t.column("input_ids").to_pylist(), t.column("a_length").to_pylist(), strict=False):
            common = Counter(x for x in ids[1:a + 1] if x in doc_of).most_common(1)
            docs.append(doc_of[common[0][0]] if common else None)
        longest = run = 1
        for x, y in zip(docs, docs[1:], strict=False):
            run = run + 1 if x == y else 1
            longest = max(longest, run)
        assert longest <= 4, docs[:40]
        assert len(set(docs)) > len(WORDS) // 2


def rows_of(tables):
    """Every row as a hashable tuple, in a canonical order: the dataset's content whatever its placement."""
    out = []
    for t in tables:
        for r in t.to_pylist():
            out.append((tuple(r["input_ids"]), r["a_length"], tuple(r["masked_lm_positions"]),
                        tuple(r["masked_lm_ids"]), r["next_sentence_label"]))
    return sorted(out)


def test_instances_do_not_depend_on_unit_size(tmp_path):
    # The rows are the same; where they land depends on the units (unit_bytes is part of the config hash).
    corpus = write_corpus(tmp_path / "c.jsonl")
    build(config(tmp_path, corpus, name="a"))
    build(config(tmp_path, corpus, name="b", unit_bytes=2048))
    ma, ta = shard_tables(tmp_path / "a")
    mb, tb = shard_tables(tmp_path / "b")
    assert ma["totals"] == mb["totals"] and ma["random_pool"] == mb["random_pool"]
    assert rows_of(ta) == rows_of(tb)
    assert [t.num_rows for t in ta] == [t.num_rows for t in tb]


def test_rerun_does_nothing_and_other_config_is_refused(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl")
    cfg = config(tmp_path, corpus)
    first = build(cfg)
    out = tmp_path / "out"
    stamps = {f: os.stat(out / "shards" / f).st_mtime_ns for f in os.listdir(out / "shards")}
    assert build(cfg) == first
    assert stamps == {f: os.stat(out / "shards" / f).st_mtime_ns for f in os.listdir(out / "shards")}
    other = dataclasses.replace(cfg, instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, seed=1))
    with pytest.raises(ValueError, match="different config"):
        build(other)


def test_presplit_text_input_and_trained_vocab(tmp_path):
    p = tmp_path / "docs.txt"
    p.write_text("\n\n".join("\n".join(f"The {w} sat by the {w} on day {j}." for j in range(8)) for w in WORDS) + "\n")
    cfg = config(tmp_path, str(p), vocab=None, vocab_size=200, read=ReadOptions(presplit=True))
    m = build(cfg)
    assert m.vocab.trained and 100 < m.vocab.size <= 200
    assert m.totals.documents == len(WORDS) and m.totals.sentences == 8 * len(WORDS)
    vocab = (tmp_path / "out" / "vocab.txt").read_text().split("\n")
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert build(cfg).config_hash == m.config_hash  # a trained vocab is part of a resumable, stable build
