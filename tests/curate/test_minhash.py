"""MinHash signatures estimate Jaccard on real text; LSH banding, band keys and candidate edges."""
from __future__ import annotations

import hashlib
import random

import numpy as np
import pyarrow as pa
import pytest
from _curate_docs import jaccard, passages

from curate.lsh import band_keys, banding, bucket_edges, candidate_probability
from curate.minhash import agreement, multipliers, signatures
from curate.words import words


def test_permutations_come_from_hashlib_not_pythons_hash():
    a = multipliers(12345, 4).ravel()
    digest = hashlib.blake2b(b"i12345\x1fsminhash\x1fi0", digest_size=8).digest()
    assert int(a[0]) == (int.from_bytes(digest, "little") & 0xFFFFFFFF) | 1
    assert all(int(x) % 2 == 1 for x in a) and len(set(a.tolist())) == 4
    assert not np.array_equal(multipliers(1, 4), multipliers(2, 4))


@pytest.fixture(scope="module")
def pairs():
    """Real passages and edited copies spanning Jaccard 0.3..1 (k words replaced at random places)."""
    rng = random.Random(1)
    docs = passages(["mobydick", "austen"], n_words=200, per_corpus=60)
    out = []
    for i, (_, text, _) in enumerate(docs):
        w = text.split()
        for j in rng.sample(range(len(w)), (i % 12) * 2):
            w[j] = f"edit{j}"
        out.append((text, " ".join(w)))
    return out


def test_signature_agreement_estimates_jaccard_without_bias(pairs):
    num_perm = 112
    texts = [t for p in pairs for t in p]
    sigs, has = signatures(words(texts), 5, num_perm, 12345)
    assert has.all()
    est = agreement(sigs[0::2], sigs[1::2])
    true = np.array([jaccard(a, b) for a, b in pairs])
    assert true.min() < 0.5 and true.max() == 1.0
    sd = np.sqrt(true * (1 - true) / num_perm)
    z = (est - true) / np.maximum(sd, 1e-9)
    assert np.all(np.abs(est - true) <= 4 * sd + 1e-9), np.max(np.abs(z))
    assert abs(np.mean(est - true)) < 0.01  # unbiased: the permutations behave as independent random orders
    assert 0.5 < np.std(z[true < 1]) < 1.5  # and the spread is the binomial one


def test_signatures_do_not_depend_on_the_batch(pairs):
    texts = [p[0] for p in pairs[:20]]
    together, _ = signatures(words(texts), 5, 64, 7)
    for i in (0, 7, 19):
        alone, _ = signatures(words([texts[i]]), 5, 64, 7)
        assert np.array_equal(alone[0], together[i])


def test_documents_without_words_have_no_signature_and_short_ones_do():
    sigs, has = signatures(words(["", "two words", "!!!", "one two three four five six"]), 5, 16, 1)
    assert has.tolist() == [False, True, False, True]
    assert (sigs[1] != 0xFFFFFFFF).all()


def test_the_banding_for_the_default_threshold():
    assert banding(0.8, 112) == (13, 8)
    b, r = banding(0.8, 112)
    assert candidate_probability(0.8, b, r) >= 0.9
    assert candidate_probability(0.9, b, r) > 0.999  # a planted ~0.9 copy is almost always a candidate
    assert candidate_probability(0.5, b, r) < 0.05
    # a stricter threshold needs fewer, longer bands
    b9, r9 = banding(0.9, 112)
    assert r9 > r and candidate_probability(0.9, b9, r9) >= 0.9


def test_band_keys_differ_between_bands_for_equal_values():
    sigs = np.zeros((2, 16), dtype=np.uint32)
    sigs[1, 8:] = 5
    keys = band_keys(sigs, 2, 8)
    assert keys[0, 0] != keys[0, 1]  # the same values in band 0 and band 1
    assert keys[0, 0] == keys[1, 0] and keys[0, 1] != keys[1, 1]


def test_bucket_edges_are_stars_to_the_smallest_id_with_exact_copies_collapsed():
    key = np.array([1, 1, 1, 2, 3, 3, 3], dtype=np.uint64)
    ids = ["b", "a", "c", "d", "f", "g", "e"]
    content = [b"X", b"X", b"Y", b"Z", b"P", b"Q", b"R"]
    a, b = bucket_edges(key, pa.array(ids), pa.array(content))
    edges = sorted(zip(a.to_pylist(), b.to_pylist(), strict=False))
    # bucket 1: a and b are the same text (a kept for it), c differs -> a-c; bucket 3: e-f, e-g; bucket 2: alone
    assert edges == [("a", "c"), ("e", "f"), ("e", "g")]
    order = np.random.default_rng(0).permutation(len(ids))
    a2, b2 = bucket_edges(key[order], pa.array([ids[i] for i in order]), pa.array([content[i] for i in order]))
    assert sorted(zip(a2.to_pylist(), b2.to_pylist(), strict=False)) == edges
