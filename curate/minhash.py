"""MinHash signatures of documents over their word shingles, for a whole batch at once.

A document's shingles are the hashes of its runs of ``shingle_words`` consecutive normalised words
(``curate.words``); a document shorter than that has one shingle, all its words; one with no words has no
signature. A shingle is the top 32 bits h of its 64-bit hash (two distinct shingles of a pair of documents share
them with probability ~1e-5), and permutation p maps it to ``h * a_p mod 2**32`` with an odd multiplier ``a_p``: a
bijection on 32-bit values, so two documents agree on permutation p exactly when the same shingle is the minimum
of both. The shingle hashes are splitmix64 outputs, so the products behave as independent random orders
(``tests/curate/test_minhash.py`` checks the estimate against true Jaccard on real text: no bias, the
binomial spread). The multipliers come from ``corpus.rng.derive_seed(seed, "minhash", p)`` (blake2b): the same
signature in every process and machine. A signature is ``num_perm`` uint32 minima; the share of positions on which
two signatures agree estimates the Jaccard similarity of their shingle sets (standard error sqrt(J(1-J)/num_perm)).

Vectorised: per chunk of shingles, one (num_perm x chunk) uint32 product and a ``minimum.reduceat`` over documents
(32-bit products: twice the speed of 64-bit ones, the memory traffic halved); a chunk's temporary memory is
bounded (``_CHUNK`` shingles), whatever the size of a document or a batch.
"""
from __future__ import annotations

import functools

import numpy as np

from corpus.rng import derive_seed
from curate.words import Words, ngrams

_CHUNK = 4096  # shingles per product: num_perm x _CHUNK x 4 bytes = 1.8 MB at 112 permutations (fits in cache)
EMPTY = np.uint32(0xFFFFFFFF)


@functools.lru_cache(maxsize=8)
def multipliers(seed: int, num_perm: int) -> np.ndarray:
    """The odd 32-bit multipliers of the permutations, as a column (num_perm, 1)."""
    return np.array([(derive_seed(seed, "minhash", p) & 0xFFFFFFFF) | 1 for p in range(num_perm)],
                    dtype=np.uint32)[:, None]


def signatures(w: Words, shingle_words: int, num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(signatures (documents x num_perm) uint32, has_signature bool per document) of the documents of ``w``."""
    shingles, offsets = ngrams(w, shingle_words, short=True)
    n_docs = len(offsets) - 1
    counts = np.diff(offsets)
    out = np.full((n_docs, num_perm), EMPTY, dtype=np.uint32)
    if not len(shingles):
        return out, counts > 0
    doc_of = np.repeat(np.arange(n_docs), counts)
    a = multipliers(seed, num_perm)
    top = (shingles >> np.uint64(32)).astype(np.uint32)
    for c0 in range(0, len(top), _CHUNK):
        h = top[c0:c0 + _CHUNK]
        docs = doc_of[c0:c0 + _CHUNK]
        with np.errstate(over="ignore"):
            products = a * h[None, :]
        cut = np.flatnonzero(np.diff(docs, prepend=-1))  # where each document's run starts in this chunk
        mins = np.minimum.reduceat(products, cut, axis=1)
        rows = docs[cut]
        out[rows] = np.minimum(out[rows], mins.T)
    return out, counts > 0


def agreement(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per pair of rows, the share of positions where signatures ``a`` and ``b`` (pairs x num_perm) agree: the
    MinHash estimate of their Jaccard similarity."""
    return (a == b).mean(axis=1)
