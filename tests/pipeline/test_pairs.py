"""NSP pair construction: hand-computed cases with a scripted RNG, truncation vs the reference loop, the pool."""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from pipeline.pairs import (
    RandomDocPool,
    Pair,
    document_pairs,
    pack_sentences,
    truncation_trims,
)


class ScriptedRng:
    """Returns the scripted values in order; fails loudly if the code draws more, fewer or other draws."""

    def __init__(self, randoms: list[float], bits: list[tuple[int, int]] = ()):
        self.randoms = list(randoms)
        self.bits = list(bits)

    def random(self) -> float:
        return self.randoms.pop(0)

    def getrandbits(self, k: int) -> int:
        want_k, value = self.bits.pop(0)
        assert k == want_k, f"asked for {k} bits, script has {want_k}"
        return value

    def done(self) -> bool:
        return not self.randoms and not self.bits


def arr(n: int, start: int = 100) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.uint16)


def reference_truncate(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """The reference's truncate_seq_pair, counting trims instead of popping tokens."""
    ta = tb = 0
    while len_a + len_b > max_num_tokens:
        if len_a > len_b:
            len_a, ta = len_a - 1, ta + 1
        else:
            len_b, tb = len_b - 1, tb + 1
    return ta, tb


def test_truncation_trims_hand_cases() -> None:
    assert truncation_trims(10, 4, 6) == (7, 1)  # A down to 4, tie -> B, then A
    assert truncation_trims(4, 10, 6) == (1, 7)
    assert truncation_trims(5, 5, 7) == (1, 2)  # tie: B first
    assert truncation_trims(60, 70, 125) == (0, 5)
    assert truncation_trims(3, 4, 125) == (0, 0)


def test_truncation_trims_match_reference_loop() -> None:
    r = random.Random(0)
    for _ in range(3000):
        la, lb, mx = r.randint(1, 300), r.randint(1, 300), r.randint(2, 300)
        assert truncation_trims(la, lb, mx) == reference_truncate(la, lb, mx), (la, lb, mx)


def test_front_trims_are_binomial() -> None:
    # Two 100-token sentences, max 10 tokens: A (100) and B (100) each lose 95 tokens, each one from the front or
    # the back by a fair coin, so the tokens cut from A's front are Binomial(95, 1/2).
    from pipeline.rng import UniformStream, np_rng

    pool = RandomDocPool([("d", [arr(100), arr(100)])])
    fronts = []
    for seed in range(3000):
        pairs = document_pairs("d", [0, 100, 200], UniformStream(np_rng(seed)), pool, 13, 0.0)
        a0, a1 = pairs[0][0], pairs[0][1]
        assert a1 - a0 == 5
        fronts.append(a0)
    assert abs(np.mean(fronts) - 47.5) < 0.3
    assert abs(np.var(fronts) - 23.75) < 2.5


def make_pool() -> RandomDocPool:
    return RandomDocPool([("d", [arr(3), arr(4), arr(5), arr(6)]), ("o", [arr(2, 500), arr(9, 600)])])


def test_document_pairs_hand_computed() -> None:
    pool = make_pool()
    _, offsets = pack_sentences([arr(3), arr(4), arr(5), arr(6)])  # [0, 3, 7, 12, 18]
    rng = ScriptedRng(
        [
            0.5,  # >= short_seq_prob: target = max_num_tokens = 10
            0.6,  # chunk of 3 sentences (3+4+5 >= 10): a_end = 1 + int(0.6 * 2) = 2
            0.7,  # >= 0.5: actual next, B = sentence 2
            # last sentence alone: a one-sentence chunk is always random next (no draw for it)
            0.1,  # pool draw 1: index 0 = "d" itself -> redraw
            0.9,  # pool draw 2: index 1 = "o"
            0.2,  # start at o's sentence 0 (2 tokens), needs 10 - 6 = 4 -> also sentence 1 (9): B = 11 tokens
        ],
        bits=[(2, 0b01), (1, 0b1), (6, 0b000111)],
    )
    pairs = document_pairs("d", offsets.tolist(), rng, pool, max_seq_length=13, short_seq_prob=0.1)
    assert rng.done()
    # A = sentences 0-1 (7) + B = sentence 2 (5) = 12 > 10: trim A by 2, one from each end.
    # A = sentence 3 (6), B = 11 pool tokens: trims A 1 (front), B 6 (3 front, 3 back).
    assert pairs == [Pair(1, 6, False, 7, 12, False), Pair(13, 18, True, 18 + 3, 18 + 11 - 3, True)]


def test_unused_sentences_are_put_back() -> None:
    pool = make_pool()
    _, offsets = pack_sentences([arr(3), arr(4), arr(5), arr(6)])  # [0, 3, 7, 12, 18]
    rng = ScriptedRng(
        [
            0.5,  # target 10
            0.0,  # chunk 0-2 (3+4+5 >= 10): a_end = 1 + int(0.0 * 2) = 1, A = sentence 0
            0.2,  # < 0.5: random next; sentences 1-2 go back
            0.9,  # draw "o"
            0.6,  # start at o's sentence 1 (9 tokens, pool tokens [20, 29)) >= 10 - 3: B = 9 tokens
            0.3,  # the next chunk restarts at sentence 1: 4 + 5 < 10, ends with the document: a_end = 1
            0.9,  # actual next: B = sentences 2-3
        ],
        bits=[(2, 0b10), (5, 0b00011)],
    )
    pairs = document_pairs("d", offsets.tolist(), rng, pool, max_seq_length=13, short_seq_prob=0.1)
    assert rng.done()
    # 3 + 9 = 12 > 10: B loses 2 (1 front, 1 back); 4 + 11 = 15: B loses 5 (2 front, 3 back).
    assert pairs == [Pair(0, 3, True, 21, 28, True), Pair(3, 7, False, 9, 15, False)]


def test_short_target_and_single_sentence_doc() -> None:
    pool = make_pool()
    _, offsets = pack_sentences([arr(30)])
    # 0.05 < 0.1: target = randint(2, 10) = 2; a one-sentence chunk is always random next; B is o's
    # sentence 0 (target 2 - 30 < 0 still takes one sentence); 30 + 2 > 10: A loses 22, all from the back.
    rng = ScriptedRng([0.05, 0.0, 0.99, 0.0], bits=[(22, 0)])
    pairs = document_pairs("d", offsets.tolist(), rng, pool, max_seq_length=13, short_seq_prob=0.1)
    assert rng.done()
    assert pairs == [Pair(0, 8, True, 18, 20, True)]


def test_pool_draw_avoids_current_doc_up_to_ten_tries() -> None:
    pool = RandomDocPool([("a", [arr(2)]), ("b", [arr(2)])])
    rng = random.Random(0)
    assert all(pool.doc_ids[pool.draw(rng, "a")] == "b" for _ in range(200))  # 2**-10 chance each of "a"
    alone = RandomDocPool([("a", [arr(2)])])
    assert alone.draw(rng, "a") == 0  # after 10 tries the reference keeps the same document
    counts = np.bincount([pool.draw(rng, "zz") for _ in range(4000)])
    assert abs(counts[0] / 4000 - 0.5) < 0.04


def test_pool_drops_empty_and_pickles() -> None:
    pool = RandomDocPool([("a", [arr(0), arr(3)]), ("empty", [arr(0)]), ("b", [arr(2), arr(4)])])
    assert pool.doc_ids == ["a", "b"] and len(pool) == 2
    assert [len(s) for s in pool.document(1)] == [2, 4]
    clone = pickle.loads(pickle.dumps(pool))
    assert clone.doc_ids == pool.doc_ids
    np.testing.assert_array_equal(clone.tokens, pool.tokens)
    assert [len(s) for s in clone.document(0)] == [3]
    with pytest.raises(ValueError):
        RandomDocPool([]).draw(random.Random(0), "a")


def test_random_segment_overshoots_and_stops_at_doc_end() -> None:
    pool = RandomDocPool([("a", [arr(5)]), ("b", [arr(2), arr(3), arr(4)])])
    # b's sentences are at tokens [5, 7), [7, 10), [10, 14).
    assert pool.random_segment(ScriptedRng([0.0]), 1, 4) == (5, 10)  # 2 + 3 >= 4 (overshoot by 1)
    assert pool.random_segment(ScriptedRng([0.0]), 1, 100) == (5, 14)  # document ends first
    assert pool.random_segment(ScriptedRng([0.9]), 1, -3) == (10, 14)  # at least one sentence
