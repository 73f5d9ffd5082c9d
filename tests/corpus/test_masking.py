"""MLM masking: num_to_predict rounding, specials untouched, sorted positions, 80/10/10, whole-word groups."""
from __future__ import annotations

import numpy as np
import pytest

from corpus.masking import VocabInfo, mask_sequences, num_to_predict

CLS, SEP, MASK = 2, 3, 4
V = 1000


def vocab(continuation_ids: tuple[int, ...] = ()) -> VocabInfo:
    cont = np.zeros(V, dtype=bool)
    cont[list(continuation_ids)] = True
    return VocabInfo(vocab_size=V, cls_id=CLS, sep_id=SEP, mask_id=MASK, pad_id=0, unk_id=1, is_continuation=cont)


def layout(pairs: list[tuple[list[int], list[int]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    seqs = [[CLS, *a, SEP, *b, SEP] for a, b in pairs]
    offsets = np.cumsum([0] + [len(s) for s in seqs])
    return np.concatenate([np.array(s) for s in seqs]).astype(np.uint16), offsets, np.array([len(a) for a, _ in pairs])


def test_num_to_predict_python3_rounding_and_caps() -> None:
    lengths = np.array([5, 10, 30, 50, 70, 128, 200, 3])
    # 0.75->1, 1.5->2 (half to even), 4.5->4 (half to even), 7.5->8, 10.5->10, 19.2->19, 30->20 (cap), 0.45->1 (floor 1)
    assert num_to_predict(lengths, 0.15, 20).tolist() == [1, 2, 4, 8, 10, 19, 20, 1]
    assert [round(n * 0.15) for n in [10, 30, 50, 70]] == [2, 4, 8, 10]  # what the reference computes
    assert num_to_predict(np.array([128]), 0.15, 5).tolist() == [5]


def test_specials_never_masked_positions_sorted_labels_original() -> None:
    rng = np.random.default_rng(0)
    pairs = [(list(range(100, 100 + la)), list(range(300, 300 + lb))) for la, lb in [(1, 1), (3, 9), (60, 65), (30, 2)]]
    tokens, offsets, a_len = layout(pairs)
    for _ in range(200):
        out = mask_sequences(tokens, offsets, a_len, vocab(), rng, 0.15, 20)
        assert out.counts.tolist() == num_to_predict(np.diff(offsets), 0.15, 20).tolist()
        bounds = np.cumsum([0, *out.counts])
        for i in range(len(pairs)):
            pos = out.positions[bounds[i] : bounds[i + 1]]
            L = offsets[i + 1] - offsets[i]
            assert np.all(np.diff(pos) > 0)
            specials = {0, a_len[i] + 1, L - 1}
            assert not specials & set(pos.tolist())
            seq_in, seq_out = tokens[offsets[i] : offsets[i + 1]], out.input_ids[offsets[i] : offsets[i + 1]]
            np.testing.assert_array_equal(out.labels[bounds[i] : bounds[i + 1]], seq_in[pos])
            untouched = np.setdiff1d(np.arange(L), pos)
            np.testing.assert_array_equal(seq_in[untouched], seq_out[untouched])


def test_rates_80_10_10_and_uniform_positions() -> None:
    rng = np.random.default_rng(1)
    tokens, offsets, a_len = layout([(list(range(100, 160)), list(range(200, 265)))] * 50)  # 128 tokens each
    kinds = np.zeros(3)
    hits = np.zeros(128)
    for _ in range(40):
        out = mask_sequences(tokens, offsets, a_len, vocab(), rng, 0.15, 20)
        assert np.all(out.counts == 19)
        now = out.input_ids[np.repeat(offsets[:-1], out.counts) + out.positions]
        is_mask = now == MASK
        same = ~is_mask & (now == out.labels)
        kinds += [is_mask.sum(), same.sum(), (~is_mask & ~same).sum()]
        np.add.at(hits, out.positions, 1)
    frac = kinds / kinds.sum()
    assert abs(frac[0] - 0.8) < 0.01 and abs(frac[1] - 0.1) < 0.01 and abs(frac[2] - 0.1) < 0.01
    cand = np.delete(hits, [0, 61, 127])
    assert hits[[0, 61, 127]].sum() == 0
    assert cand.std() / cand.mean() < 0.1  # every candidate equally likely (expected 19*2000/125 = 304 each)


def test_random_replacements_are_uniform_vocab_ids() -> None:
    rng = np.random.default_rng(2)
    tokens, offsets, a_len = layout([([500] * 60, [500] * 65)] * 200)
    out = mask_sequences(tokens, offsets, a_len, vocab(), rng, 0.15, 20)
    now = out.input_ids[np.repeat(offsets[:-1], out.counts) + out.positions]
    rand = now[(now != MASK) & (now != 500)]
    assert rand.min() >= 0 and rand.max() < V and len(np.unique(rand)) > 0.2 * len(rand)


def test_whole_word_groups() -> None:
    # 110 = word, 9xx = "##" pieces: words [110, 901, 902], [111], [112, 903], B: [903 (a ## after [SEP]), 113].
    v = vocab(continuation_ids=(901, 902, 903))
    a, b = [110, 901, 902, 111, 112, 903], [903, 113]
    tokens, offsets, a_len = layout([(a, b)] * 300)  # 11 tokens -> num_to_predict = round(1.65) = 2
    rng = np.random.default_rng(3)
    out = mask_sequences(tokens, offsets, a_len, v, rng, 0.15, 20, whole_word_mask=True)
    bounds = np.cumsum([0, *out.counts])
    groups = {(1, 2, 3), (4,), (5, 6), (8,), (9,)}
    seen = set()
    for i in range(300):
        pos = tuple(out.positions[bounds[i] : bounds[i + 1]].tolist())
        assert 1 <= len(pos) <= 2
        chosen = [g for g in groups if set(g) & set(pos)]
        assert all(set(g) <= set(pos) for g in chosen), pos  # a group is masked whole or not at all
        assert sum(len(g) for g in chosen) == len(pos)
        seen.add(pos)
        assert 7 not in pos and 10 not in pos and 0 not in pos
    # The 3-piece word never fits in 2; the reference skips it and keeps scanning, so every sequence gets 2.
    assert all(len(p) == 2 for p in seen) and not any(1 in p for p in seen)
    # The "##" piece opening B (position 8) is its own group, not glued to A's last word across the [SEP].
    assert (5, 6) in seen and any(8 in p and 5 not in p for p in seen)


def test_whole_word_greedy_skip_rule() -> None:
    # One 4-piece word and singles, k = 2: a shuffled order that meets the big word first must skip it.
    v = vocab(continuation_ids=(901,))
    tokens, offsets, a_len = layout([([110, 901, 901, 901], [111, 112])] * 500)  # 9 tokens -> round(1.35) = 1
    out = mask_sequences(tokens, offsets, a_len, v, np.random.default_rng(4), 0.15, 20, whole_word_mask=True)
    assert np.all(out.counts == 1)
    assert set(out.positions.tolist()) == {6, 7}  # only the single-piece words of B fit


def test_vocab_info_validation(tmp_path) -> None:
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##b"]) + "\n")
    info = VocabInfo.from_vocab_file(path)
    assert (info.cls_id, info.sep_id, info.mask_id, info.vocab_size) == (2, 3, 4, 7)
    assert info.is_continuation.tolist() == [False] * 6 + [True]
    assert info.token_dtype == np.uint16
    with pytest.raises(ValueError, match="MASK"):
        VocabInfo.from_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
