"""NSP pair construction: the chunk walk with scripted uniforms, the vectorised finish (random next, truncation), the
counter-based streams, and the pool."""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from corpus.pairs import (
    MAX_RANDOM_DOC_TRIES,
    RandomDocPool,
    fair_coin_counts,
    finish_pairs,
    pack_sentences,
    pair_words,
    pass_target,
    to_uniform,
    truncation_trims,
    walk_chunks,
)


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
    for mx in (2, 7, 61, 125, 300):
        la = np.array([r.randint(1, 300) for _ in range(600)])
        lb = np.array([r.randint(1, 300) for _ in range(600)])
        ta, tb = truncation_trims(la, lb, mx)
        assert [(int(a), int(b)) for a, b in zip(ta, tb, strict=False)] == \
            [reference_truncate(a, b, mx) for a, b in zip(la, lb, strict=False)]


def test_pair_words_are_splitmix64() -> None:
    # SplitMix64 from state 0: the published first outputs.
    words = pair_words(np.zeros(2, np.uint64), np.array([0, 1]))
    assert [hex(int(w)) for w in words] == ["0xe220a8397b1dcdaf", "0x6e789e6aa1b965f4"]
    u = to_uniform(pair_words(np.full(100_000, 7, np.uint64), np.arange(100_000)))
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.005


def test_fair_coin_counts_are_binomial() -> None:
    seeds = pair_words(np.full(4000, 99, np.uint64), np.arange(4000))
    for n in (1, 37, 95, 130):  # 130 bits span three words
        counts = fair_coin_counts(seeds, np.full(4000, n), np.zeros(4000, np.int64))
        assert counts.min() >= 0 and counts.max() <= n
        assert abs(counts.mean() - n / 2) < 0.04 * n + 0.05, n
        assert abs(counts.var() - n / 4) < 0.12 * n / 4 + 0.02, n
    zero = fair_coin_counts(seeds[:5], np.zeros(5, np.int64), np.zeros(5, np.int64))
    assert zero.tolist() == [0] * 5
    # Another word offset is another draw; the same is the same.
    a = fair_coin_counts(seeds, np.full(4000, 40), np.zeros(4000, np.int64))
    assert np.array_equal(a, fair_coin_counts(seeds, np.full(4000, 40), np.zeros(4000, np.int64)))
    assert not np.array_equal(a, fair_coin_counts(seeds, np.full(4000, 40), np.ones(4000, np.int64)))


def test_pass_target() -> None:
    assert pass_target(0.5, 0.99, 125, 0.1) == 125
    assert pass_target(0.05, 0.0, 125, 0.1) == 2  # randint(2, 125)
    assert pass_target(0.05, 0.999999, 125, 0.1) == 125
    assert pass_target(0.0, 0.5, 10, 0.0) == 10  # probability 0 never shortens


def test_walk_chunks_hand_computed() -> None:
    _, offsets = pack_sentences([arr(3), arr(4), arr(5), arr(6)])  # [0, 3, 7, 12, 18]
    u = [0.5, 0.5,  # the pass's target slots (not read by the walk)
         0.6,  # chunk 0-2 (3+4+5 >= 10): a_end = 1 + int(0.6 * 2) = 2
         0.7,  # >= 0.5: actual next, B = sentence 2
         0.0, 0.0,  # last sentence alone: a one-sentence chunk is always random next (slots unused)
         0.0, 0.0, 0.0, 0.0]
    out: list[int] = []
    assert walk_chunks(offsets.tolist(), 10, u, out) == 2
    assert out == [0, 2, 2, 0, 3, 1, 3, 1]


def test_walk_puts_unused_sentences_back() -> None:
    _, offsets = pack_sentences([arr(3), arr(4), arr(5), arr(6)])  # [0, 3, 7, 12, 18]
    u = [0.5, 0.5,
         0.0,  # chunk 0-2: a_end = 1, A = sentence 0
         0.2,  # < 0.5: random next; sentences 1-2 go back
         0.3,  # the next chunk restarts at sentence 1: 4 + 5 + 6 >= 10 ends at sentence 3: a_end = 1 + int(0.3 * 2)
         0.9,  # actual next: B = sentences 2-3
         0.0, 0.0, 0.0, 0.0]
    out: list[int] = []
    assert walk_chunks(offsets.tolist(), 10, u, out) == 2
    assert out == [0, 1, 2, 1, 1, 1, 3, 0]


def make_pool() -> RandomDocPool:
    return RandomDocPool([("d", [arr(3), arr(4), arr(5), arr(6)]), ("o", [arr(2, 500), arr(9, 600)])])


def finish_one(pool: RandomDocPool, doc_id: str, offsets: np.ndarray, records: list[int], target: int,
               max_num_tokens: int, seed: int = 1):
    walk = np.asarray(records, np.int64).reshape(-1, 4)
    n = len(walk)
    seeds = pair_words(np.full(n, seed, np.uint64), np.arange(n))
    return finish_pairs(walk, offsets, np.full(n, target), np.full(n, pool.code(doc_id)), seeds, pool, max_num_tokens)


def test_finish_actual_next_without_truncation() -> None:
    pool = make_pool()
    _, offsets = pack_sentences([arr(3), arr(4), arr(5), arr(6)])  # [0, 3, 7, 12, 18]
    p = finish_one(pool, "d", offsets, [0, 2, 2, 0], 10, max_num_tokens=100)
    assert [x.tolist() for x in p] == [[0], [7], [7], [12], [False]]  # A = sentences 0-1, B = sentence 2


def test_finish_truncates_binomially_inside_the_segments() -> None:
    # Two 100-token sentences, max 10 tokens: A (100) and B (100) each lose 95 tokens, each one from the front or
    # the back by a fair coin, so the tokens cut from A's front are Binomial(95, 1/2).
    pool = RandomDocPool([("d", [arr(100), arr(100)])])
    offsets = np.array([0, 100, 200])
    fronts = []
    for seed in range(3000):
        a0, a1, b0, b1, rnd = finish_one(pool, "d", offsets, [0, 1, 1, 0], 10, max_num_tokens=10, seed=seed)
        assert a1[0] - a0[0] == 5 and b1[0] - b0[0] == 5 and 0 <= a0[0] <= 95 and 100 <= b0[0] <= 195
        fronts.append(int(a0[0]))
    assert abs(np.mean(fronts) - 47.5) < 0.3
    assert abs(np.var(fronts) - 23.75) < 2.5


def test_finish_random_next_comes_from_another_document() -> None:
    pool = make_pool()  # "o" is pool tokens [18, 29): sentences [18, 20) and [20, 29)
    _, offsets = pack_sentences([arr(3), arr(4), arr(5), arr(6)])
    own = 0
    for seed in range(400):
        a0, a1, b0, b1, rnd = finish_one(pool, "d", offsets, [0, 1, 2, 1], 10, max_num_tokens=100, seed=seed)
        assert rnd.tolist() == [True] and (a0[0], a1[0]) == (0, 3)
        if b0[0] < 18:  # "d" itself ten times in a row (2**-10): the reference keeps it
            own += 1
            continue
        # From o's sentence 0 (2 tokens, short of 10 - 3: o's sentence 1 too) or sentence 1 (9 tokens).
        assert (b0[0], b1[0]) in ((18, 29), (20, 29))
    assert own <= 3


def test_pool_draw_documents_avoids_own_up_to_ten_tries() -> None:
    pool = make_pool()
    u = np.zeros((2, MAX_RANDOM_DOC_TRIES))
    u[0, :2] = [0.1, 0.9]  # try 1: index 0 = "d" itself -> redraw; try 2: index 1 = "o"
    assert pool.draw_documents(u, np.array([pool.code("d")] * 2)).tolist() == [1, 0]  # row 2: "d" ten times: kept
    rng = np.random.default_rng(0)
    two = RandomDocPool([("a", [arr(2)]), ("b", [arr(2)])])
    picks = two.draw_documents(rng.random((4000, 10)), np.full(4000, two.code("a")))
    assert (picks == 1).mean() > 0.995  # 2**-10 chance each of "a"
    unknown = two.draw_documents(rng.random((4000, 10)), np.full(4000, two.code("zz")))
    assert two.code("zz") == -1 and abs((unknown == 0).mean() - 0.5) < 0.04


def test_pool_segments_overshoot_and_stop_at_doc_end() -> None:
    pool = RandomDocPool([("a", [arr(5)]), ("b", [arr(2), arr(3), arr(4)])])
    # b's sentences are at tokens [5, 7), [7, 10), [10, 14).
    docs, u = np.array([1, 1, 1]), np.array([0.0, 0.0, 0.9])
    b0, b1 = pool.segments(docs, u, np.array([4, 100, -3]))
    # Overshoot, document end, at least one sentence.
    assert list(zip(b0.tolist(), b1.tolist(), strict=False)) == [(5, 10), (5, 14), (10, 14)]


def test_pool_drops_empty_and_pickles() -> None:
    pool = RandomDocPool([("a", [arr(0), arr(3)]), ("empty", [arr(0)]), ("b", [arr(2), arr(4)])])
    assert pool.doc_ids == ["a", "b"] and len(pool) == 2
    assert pool.doc_offsets.tolist() == [0, 1, 3] and pool.sent_offsets.tolist() == [0, 3, 5, 9]  # a: 3; b: 2, 4
    clone = pickle.loads(pickle.dumps(pool))
    assert clone.doc_ids == pool.doc_ids and clone.code("b") == 1
    np.testing.assert_array_equal(clone.tokens, pool.tokens)
    assert clone.doc_offsets.tolist() == [0, 1, 3] and clone.sent_offsets.tolist() == [0, 3, 5, 9]
    with pytest.raises(ValueError, match="pool is empty"):
        RandomDocPool([]).draw_documents(np.zeros((1, 10)), np.array([-1]))
