"""Transform-level faithfulness: the reference's own input through a plain loop over our functions.

Input: Moby Dick in the reference contract (one sentence per line, blank line between documents), the bert-base-uncased
vocabulary, dupe factor 5, the reference's parameters; the random-document pool is every document, as the
reference's whole in-memory corpus. Expected: ``mobydick.reference_stats.json`` within the spread of the reference's
own seeds (7 and 99 gave instances 14,524 / 14,607; random-next 0.557 / 0.552; mean length 121.1 / 120.1; masked
18.00 / 17.85).
"""
from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest

from corpus.create_instances import COLUMNS, InstanceConfig, RandomDocPool, create_instances, create_instances_batch
from corpus.stats import instance_stats
from corpus.tokenize import WordPieceEncoder

DUPE_FACTOR = 5
# The reference's three seeds (12345 in the stats file; 7 and 99 in the data README), means of those three runs.
REFERENCE_3_SEED_MEAN = {
    "instances": (14596 + 14524 + 14607) / 3,
    "random_next_fraction": (0.5563853 + 0.557 + 0.552) / 3,
    "seq_len_mean": (120.595 + 121.1 + 120.1) / 3,
    "masked_per_seq_mean": (17.9227 + 18.00 + 17.85) / 3,
}


@pytest.fixture(scope="module")
def documents(sample_dir) -> tuple[list[tuple[str, list[np.ndarray]]], WordPieceEncoder]:
    ref = sample_dir / "reference"
    encoder = WordPieceEncoder(str(ref / "bert-base-uncased-vocab.txt"))
    docs: list[list[str]] = [[]]
    with gzip.open(ref / "mobydick.sentences.txt.gz", "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                docs.append([])  # blank line: next document, as the reference reads its input
            else:
                docs[-1].append(line)
    out = []
    for i, sentences in enumerate(docs):
        ids = [a for a in encoder.encode(sentences) if len(a)]  # lines with no tokens are dropped
        if ids:  # empty documents are removed
            out.append((f"mobydick-{i}", ids))
    return out, encoder


_BUILT: dict[tuple[int, int], dict[str, list]] = {}


def build(documents, seed: int) -> dict[str, list]:
    docs, encoder = documents
    key = (id(docs), seed)
    if key not in _BUILT:
        _BUILT[key] = _build(docs, encoder, seed)
    return _BUILT[key]


def _build(docs, encoder, seed: int) -> dict[str, list]:
    cfg = InstanceConfig(seed=seed)
    pool = RandomDocPool(docs)
    cols: dict[str, list] = {c: [] for c in COLUMNS}
    for pass_idx in range(DUPE_FACTOR):
        for doc_id, sentences in docs:
            out = create_instances(doc_id, sentences, pass_idx, cfg, pool, encoder)
            for c in COLUMNS:
                cols[c].extend(out[c])
    return cols


def check(stats: dict, ref: dict) -> None:
    assert abs(stats["instances"] / ref["instances"] - 1) < 0.02, (stats["instances"], ref["instances"])
    assert abs(stats["random_next_fraction"] - ref["random_next_fraction"]) < 0.015
    assert abs(stats["seq_len_mean"] - ref["seq_len_mean"]) < 1.5
    assert abs(stats["masked_per_seq_mean"] - ref["masked_per_seq_mean"]) < 0.3


def test_matches_reference_stats(documents, sample_dir) -> None:
    ref = json.loads((sample_dir / "reference" / "mobydick.reference_stats.json").read_text())
    assert ref["params"]["dupe_factor"] == DUPE_FACTOR and ref["params"]["random_seed"] == 12345
    cols = build(documents, seed=12345)
    stats = instance_stats(cols, mask_id=documents[1].mask_id, max_seq_length=128)
    want = ref["stats"]
    check(stats, want)
    for kind in ("mask", "same", "random"):
        assert abs(stats["mask_kind_fraction"][kind] - want["mask_kind_fraction"][kind]) < 0.01
    assert stats["masked_per_seq_max"] == want["masked_per_seq_max"] == 19  # round(128 * 0.15) = 19
    assert abs(stats["masked_token_fraction"] - want["masked_token_fraction"]) < 0.003
    assert abs(stats["a_len_mean"] - want["a_len_mean"]) < 1.5
    assert abs(stats["full_length_fraction"] - want["full_length_fraction"]) < 0.05  # seeds reach 0.82..0.87
    assert stats["seq_len_median"] == want["seq_len_median"] == 128


def test_three_seed_mean_matches_reference_mean(documents) -> None:
    # A single seed can hit a tolerance by luck; the mean over the reference's three seeds has a third of the spread.
    # The batched builder (tested equal to the per-document loop in test_instances.py) keeps this test fast.
    docs, enc = documents
    pool = RandomDocPool(docs)
    runs = [instance_stats(build(documents, 12345), mask_id=enc.mask_id)] + [
        instance_stats(create_instances_batch(docs, range(DUPE_FACTOR), InstanceConfig(seed=s), pool, enc), enc.mask_id)
        for s in (7, 99)
    ]
    mean = {k: float(np.mean([r[k] for r in runs])) for k in REFERENCE_3_SEED_MEAN}  # type: ignore[misc]
    check(mean, REFERENCE_3_SEED_MEAN)
    mean_full = np.mean([r["full_length_fraction"] for r in runs])
    assert abs(mean_full - (0.8345 + 0.827 + 0.853) / 3) < 0.02
    assert abs(mean["seq_len_mean"] - REFERENCE_3_SEED_MEAN["seq_len_mean"]) < 0.75
    assert abs(mean["instances"] / REFERENCE_3_SEED_MEAN["instances"] - 1) < 0.01


def test_every_sequence_is_well_formed(documents) -> None:
    docs, encoder = documents
    cols = build((docs[:20], encoder), seed=3)
    for ids, a_len, pos, orig in zip(cols["input_ids"], cols["a_length"], cols["masked_lm_positions"],
                                     cols["masked_lm_ids"], strict=False):
        assert len(ids) <= 128 and a_len >= 1 and len(ids) - a_len - 3 >= 1
        assert ids[0] == encoder.cls_id and ids[a_len + 1] == encoder.sep_id and ids[-1] == encoder.sep_id
        assert 1 <= len(pos) <= 20 and np.all(np.diff(pos.astype(int)) > 0)
        assert not np.isin(orig, [encoder.cls_id, encoder.sep_id]).any()


# --- The reference algorithm itself, ported line by line (create_instances_from_document, truncate_seq_pair,
# create_masked_lm_predictions; one random.Random, documents shuffled) to pin down our reading and tokenisation:
# fed our token ids it must reproduce the reference run's numbers exactly, not just statistically.


def _reference_run(docs: list[list[list[int]]], seed: int, cls: int, sep: int, mask: int, vocab_size: int) -> dict:
    rng = random.Random(seed)
    docs = list(docs)
    rng.shuffle(docs)
    max_num_tokens = 125
    rows: dict[str, list] = {c: [] for c in COLUMNS}
    for _ in range(DUPE_FACTOR):
        for di, document in enumerate(docs):
            target = max_num_tokens
            if rng.random() < 0.1:
                target = rng.randint(2, max_num_tokens)
            chunk: list[list[int]] = []
            length = 0
            i = 0
            while i < len(document):
                chunk.append(document[i])
                length += len(document[i])
                if i == len(document) - 1 or length >= target:
                    a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                    a = [t for s in chunk[:a_end] for t in s]
                    b: list[int] = []
                    if len(chunk) == 1 or rng.random() < 0.5:
                        is_random = 1
                        for _ in range(10):
                            rdi = rng.randint(0, len(docs) - 1)
                            if rdi != di:
                                break
                        rdoc = docs[rdi]
                        for j in range(rng.randint(0, len(rdoc) - 1), len(rdoc)):
                            b.extend(rdoc[j])
                            if len(b) >= target - len(a):
                                break
                        i -= len(chunk) - a_end
                    else:
                        is_random = 0
                        b = [t for s in chunk[a_end:] for t in s]
                    while len(a) + len(b) > max_num_tokens:
                        trunc = a if len(a) > len(b) else b
                        if rng.random() < 0.5:
                            del trunc[0]
                        else:
                            trunc.pop()
                    tokens = [cls, *a, sep, *b, sep]
                    cands = [[k] for k, t in enumerate(tokens) if t not in (cls, sep)]
                    rng.shuffle(cands)
                    out = list(tokens)
                    k_pred = min(20, max(1, int(round(len(tokens) * 0.15))))
                    picked = []
                    for (k,) in cands[:k_pred]:
                        if rng.random() < 0.8:
                            out[k] = mask
                        elif rng.random() < 0.5:
                            out[k] = tokens[k]
                        else:
                            out[k] = rng.randint(0, vocab_size - 1)
                        picked.append(k)
                    picked.sort()
                    rows["input_ids"].append(np.array(out))
                    rows["a_length"].append(len(a))
                    rows["masked_lm_positions"].append(np.array(picked))
                    rows["masked_lm_ids"].append(np.array([tokens[k] for k in picked]))
                    rows["next_sentence_label"].append(is_random)
                    chunk, length = [], 0
                i += 1
    return rows


def test_reference_port_reproduces_reference_run_exactly(documents, sample_dir) -> None:
    docs, enc = documents
    ref = json.loads((sample_dir / "reference" / "mobydick.reference_stats.json").read_text())["stats"]
    rows = _reference_run([[s.tolist() for s in sents] for _, sents in docs], 12345, enc.cls_id, enc.sep_id,
                          enc.mask_id, enc.vocab_size)
    stats = instance_stats(rows, mask_id=enc.mask_id)
    assert stats["instances"] == ref["instances"] and stats["tokens_total"] == ref["tokens_total"]
    for key in ("random_next_fraction", "seq_len_mean", "a_len_mean", "masked_per_seq_mean", "full_length_fraction"):
        assert stats[key] == pytest.approx(ref[key], abs=1e-9), key
    for kind in ("mask", "same", "random"):
        assert stats["mask_kind_fraction"][kind] == pytest.approx(ref["mask_kind_fraction"][kind], abs=1e-9)


# The reference script on the same input with its two other seeds (7, 99): ../shared/data/README.md.
REFERENCE_OTHER_SEEDS = {"instances": (14524, 14607), "random_next_fraction": (0.557, 0.552),
                         "seq_len_mean": (121.1, 120.1), "masked_per_seq_mean": (18.00, 17.85)}


def test_build_with_a_sampled_pool_matches_reference_stats(sample_dir, tmp_path) -> None:
    """The whole build (plain loop) on the reference input with the random-next pool a ~1/4 sample of the
    documents (the seeded hash threshold of a distributed build), held to the same tolerances as above.

    One draw's instance count moves with the seed (the short-seq target is drawn once per document pass, 135
    chapters x 5: eight of our seeds gave 14234-14706), and our draws are not the reference's whatever the seed
    number, so the mean of three of our seeds is compared with the mean of the reference's three."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from corpus.readers import ReadOptions
    from pipeline import BuildConfig
    from pipeline import build as build_dataset

    ref = sample_dir / "reference"
    draws = []
    for seed in (12345, 7, 99):
        out = tmp_path / f"out-{seed}"
        cfg = BuildConfig(inputs=(str(ref / "mobydick.sentences.txt.gz"),), output=str(out),
                          read=ReadOptions(presplit=True), vocab=str(ref / "bert-base-uncased-vocab.txt"),
                          instances=InstanceConfig(seed=seed), dupe_factor=DUPE_FACTOR, num_shards=4,
                          pool_tokens=90_000)
        m = build_dataset(cfg)
        docs = m.totals.documents
        assert 0.1 * docs < dict(m.random_pool)["documents"] < 0.5 * docs  # a sample, not every document
        table = pa.concat_tables([pq.read_table(out / s.file) for s in m.shards])
        draws.append(instance_stats(table, mask_id=103, max_seq_length=128))
    want = json.loads((ref / "mobydick.reference_stats.json").read_text())["stats"]
    check({k: sum(d[k] for d in draws) / 3 for k in REFERENCE_OTHER_SEEDS},
          {k: (want[k] + sum(v)) / 3 for k, v in REFERENCE_OTHER_SEEDS.items()})
    for kind in ("mask", "same", "random"):
        assert abs(draws[0]["mask_kind_fraction"][kind] - want["mask_kind_fraction"][kind]) < 0.01
