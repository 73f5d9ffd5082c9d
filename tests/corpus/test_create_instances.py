"""create_instances: columns, segment layout, determinism by (seed, doc, pass), seeded NSP/MLM rates."""
from __future__ import annotations

import numpy as np
import pytest

from corpus.create_instances import (
    COLUMNS,
    InstanceConfig,
    RandomDocPool,
    VocabInfo,
    create_instances,
    create_instances_batch,
)
from corpus.rng import instance_keys

V = 30522
CLS, SEP, MASK = 101, 102, 103


def vocab() -> VocabInfo:
    cont = np.zeros(V, dtype=bool)
    cont[20000:] = True  # ids >= 20000 play "##" pieces
    return VocabInfo(vocab_size=V, cls_id=CLS, sep_id=SEP, mask_id=MASK, pad_id=0, unk_id=100, is_continuation=cont)


def make_docs(n_docs: int, seed: int = 0, sentences: tuple[int, int] = (8, 40), length: tuple[int, int] = (5, 30)):
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(n_docs):
        n = int(rng.integers(*sentences))
        docs.append((f"doc-{d}", [rng.integers(1000, 30000, int(rng.integers(*length))).astype(np.uint16)
                                  for _ in range(n)]))
    return docs


def unmasked(ids: np.ndarray, pos: np.ndarray, orig: np.ndarray) -> np.ndarray:
    out = ids.copy()
    out[pos.astype(np.int64)] = orig
    return out


def is_sub(needle: np.ndarray, hay: np.ndarray) -> bool:
    n = len(needle)
    win = np.lib.stride_tricks.sliding_window_view(hay, n)
    return bool(np.any(np.all(win == needle, axis=1)))


def test_config_validation() -> None:
    InstanceConfig()
    for bad in (
        dict(max_seq_length=4),
        dict(max_seq_length=15),
        dict(max_predictions_per_seq=0),
        dict(masked_lm_prob=0.0),
        dict(masked_lm_prob=1.5),
        dict(short_seq_prob=-0.1),
        dict(seed="x"),
    ):
        with pytest.raises(ValueError):
            InstanceConfig(**bad)


def test_columns_layout_and_segments() -> None:
    docs = make_docs(12)
    pool = RandomDocPool(docs)
    cfg = InstanceConfig()
    text = {d: np.concatenate(s) for d, s in docs}
    every = np.concatenate(list(text.values()))
    doc_id, sents = docs[0]
    out = create_instances(doc_id, sents, 0, cfg, pool, vocab())
    assert set(out) == set(COLUMNS) and len({len(v) for v in out.values()}) == 1
    assert len(out["key"]) >= 4  # ~600 tokens in ~125-token sequences
    for i, (ids, a_len, pos, orig, nsp) in enumerate(
        zip(out["input_ids"], out["a_length"], out["masked_lm_positions"], out["masked_lm_ids"],
            out["next_sentence_label"], strict=False)
    ):
        assert ids.dtype == np.uint16 and pos.dtype == np.uint16 and orig.dtype == np.uint16
        assert len(ids) <= 128
        # token_type_ids[i] = 0 if i < a_length + 2 else 1 rebuilds the segments: [CLS] A [SEP] | B [SEP]
        seg = (np.arange(len(ids)) >= a_len + 2).astype(int)
        assert ids[0] == CLS and ids[a_len + 1] == SEP and ids[-1] == SEP
        assert seg[a_len + 1] == 0 and seg[a_len + 2] == 1
        full = unmasked(ids, pos, orig)
        a, b = full[1 : a_len + 1], full[a_len + 2 : -1]
        assert len(a) >= 1 and len(b) >= 1
        assert not np.isin(np.concatenate([a, b]), [CLS, SEP]).any()  # specials only at the three slots
        assert is_sub(a, text[doc_id])  # A is a contiguous run of the document (truncation trims the ends)
        assert is_sub(b, every if nsp else text[doc_id])
        assert out["key"][i] == int(instance_keys(cfg.seed, doc_id, 0, len(out["key"]))[i])


def test_actual_next_continues_a() -> None:
    # Without truncation (sequences shorter than the maximum) an actual-next B starts where A ends in the document.
    docs = make_docs(6, sentences=(40, 60))
    pool = RandomDocPool(docs)
    cfg = InstanceConfig(max_seq_length=256, max_predictions_per_seq=40, short_seq_prob=0.0)
    checked = 0
    for doc_id, sents in docs:
        text = np.concatenate(sents)
        for p in range(3):
            out = create_instances(doc_id, sents, p, cfg, pool, vocab())
            for ids, a_len, pos, orig, nsp in zip(*(out[c] for c in COLUMNS[:5]), strict=False):
                if nsp == 0 and len(ids) < 256:
                    full = unmasked(ids, pos, orig)
                    assert is_sub(np.concatenate([full[1 : a_len + 1], full[a_len + 2 : -1]]), text)
                    checked += 1
    assert checked >= 3


def test_deterministic_and_order_independent() -> None:
    docs = make_docs(10)
    pool = RandomDocPool(docs)
    cfg = InstanceConfig(seed=7)
    first = [create_instances(d, s, 1, cfg, pool, vocab()) for d, s in docs]
    again = [create_instances(d, s, 1, cfg, pool, vocab()) for d, s in reversed(docs)][::-1]
    for x, y in zip(first, again, strict=False):
        for c in COLUMNS:
            assert [np.asarray(v).tolist() for v in x[c]] == [np.asarray(v).tolist() for v in y[c]]
    other_pass = create_instances(docs[0][0], docs[0][1], 2, cfg, pool, vocab())
    other_seed = create_instances(docs[0][0], docs[0][1], 1, InstanceConfig(seed=8), pool, vocab())
    assert other_pass["key"] != first[0]["key"]
    assert [a.tolist() for a in other_seed["input_ids"]] != [a.tolist() for a in first[0]["input_ids"]]


def test_empty_inputs() -> None:
    pool = RandomDocPool(make_docs(3))
    empty = create_instances("e", [], 0, InstanceConfig(), pool, vocab())
    assert all(v == [] for v in empty.values())
    only_blank = create_instances("e", [np.zeros(0, np.uint16)], 0, InstanceConfig(), pool, vocab())
    assert only_blank["key"] == []
    # Blank sentences are dropped, not counted as sentences.
    s = [np.arange(1000, 1010, dtype=np.uint16), np.zeros(0, np.uint16), np.arange(2000, 2010, dtype=np.uint16)]
    a = create_instances("x", s, 0, InstanceConfig(), pool, vocab())
    b = create_instances("x", [s[0], s[2]], 0, InstanceConfig(), pool, vocab())
    assert [v.tolist() for v in a["input_ids"]] == [v.tolist() for v in b["input_ids"]]


def run(docs, cfg, passes=3):
    pool = RandomDocPool(docs)
    cols = {c: [] for c in COLUMNS}
    for p in range(passes):
        for d, s in docs:
            out = create_instances(d, s, p, cfg, pool, vocab())
            for c in COLUMNS:
                cols[c].extend(out[c])
    return cols


def test_seeded_rates_nsp_mlm() -> None:
    # Many short sentences per document: chunks almost always hold 2+ sentences, so random next is ~50%
    # (a one-sentence chunk, always random, is ~0.2% of instances here).
    cols = run(make_docs(60, seed=1, sentences=(350, 450), length=(3, 7)), InstanceConfig(short_seq_prob=0.0))
    n = len(cols["key"])
    assert n > 3000
    assert abs(np.mean(cols["next_sentence_label"]) - 0.5) < 0.025
    lens = np.array([len(x) for x in cols["input_ids"]])
    masked = np.array([len(x) for x in cols["masked_lm_positions"]])
    np.testing.assert_array_equal(masked, np.minimum(20, np.maximum(1, np.rint(lens * 0.15))).astype(int))
    assert abs(masked.sum() / lens.sum() - 0.15) < 0.005
    now = np.concatenate([ids[p.astype(int)]
                          for ids, p in zip(cols["input_ids"], cols["masked_lm_positions"], strict=False)])
    orig = np.concatenate(cols["masked_lm_ids"])
    mask = now == MASK
    same = ~mask & (now == orig)
    assert abs(mask.mean() - 0.8) < 0.01 and abs(same.mean() - 0.1) < 0.01
    assert abs(1 - mask.mean() - same.mean() - 0.1) < 0.01


def test_one_sentence_chunks_are_always_random_next() -> None:
    # Every sentence is longer than the target, so every chunk is one sentence: the reference forces random next.
    cols = run(make_docs(10, seed=5, sentences=(3, 8), length=(130, 200)), InstanceConfig(), passes=2)
    assert len(cols["key"]) > 50 and all(label == 1 for label in cols["next_sentence_label"])


def test_short_seq_prob_gives_short_targets() -> None:
    docs = make_docs(30, seed=2, sentences=(30, 60))
    long_only = run(docs, InstanceConfig(short_seq_prob=0.0), passes=2)
    always_short = run(docs, InstanceConfig(short_seq_prob=1.0), passes=2)
    mean = lambda cols: np.mean([len(x) for x in cols["input_ids"]])  # noqa: E731
    assert mean(always_short) < 0.8 * mean(long_only)
    assert len(always_short["key"]) > len(long_only["key"])


def test_whole_word_mask_end_to_end() -> None:
    cols = run(make_docs(10, seed=3), InstanceConfig(whole_word_mask=True), passes=1)
    cont = vocab().is_continuation
    for ids, pos, orig, a_len in zip(cols["input_ids"], cols["masked_lm_positions"], cols["masked_lm_ids"],
                                     cols["a_length"], strict=False):
        full = unmasked(ids, pos, orig)
        chosen = set(pos.tolist())
        for p in chosen:  # a chosen "##" piece's whole word is chosen (within its segment)
            if cont[full[p]] and p not in (1, a_len + 2):
                assert p - 1 in chosen
        assert len(pos) <= 20


def test_batch_equals_per_document_pass_calls() -> None:
    docs = make_docs(8, seed=4) + [("empty", [np.zeros(0, np.uint16)])]
    pool = RandomDocPool(docs)
    for cfg in (InstanceConfig(seed=11), InstanceConfig(seed=11, whole_word_mask=True)):
        batch = create_instances_batch(docs, range(3), cfg, pool, vocab())
        loop = {c: [] for c in COLUMNS}
        for d, s in docs:
            for p in range(3):
                out = create_instances(d, s, p, cfg, pool, vocab())
                for c in COLUMNS:
                    loop[c].extend(out[c])
        for c in COLUMNS:
            assert [np.asarray(v).tolist() for v in batch[c]] == [np.asarray(v).tolist() for v in loop[c]], c
