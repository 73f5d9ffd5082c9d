"""NSP pairs (reference steps 3-6) for a block of document passes, as token-slice bounds rather than token lists.

A document is its sentences' ids back to back (``tokens``) plus sentence bounds (``sent_offsets``); every segment
the reference builds is a run of consecutive sentences, so A, B and their truncations are plain slices. Two phases:

1. ``walk_chunks``, per document pass, in Python: the reference's chunking loop, inherently sequential (where a
   chunk starts depends on the previous pair's draws) and reduced to a few integer operations per pair. Its draws
   come from the pass's uniforms in fixed slots: ``u[0]``, ``u[1]`` the short target, ``u[2 + 2k]``, ``u[3 + 2k]``
   pair k's end of A and actual-vs-random next.
2. ``finish_pairs``, the whole block at once, in numpy: segment bounds, the random-next document and its segment,
   and truncation. Pair k of a pass draws from its own counter-based stream (SplitMix64 of the pass's seed and k,
   ``pair_words``), so no draw depends on another pair, on the block or on the order of work.

How we differ from the reference, with the same distribution:
- The reference draws the random-next document from the whole in-memory corpus with one global RNG; we draw it from
  a ``RandomDocPool`` (the whole corpus in the plain loop and the tests; a seeded sample of it in a distributed
  build). Up to 10 draws avoid the current document, as in the reference; "same document" means the same id.
- ``truncate_seq_pair`` trims one token per step from the longer side (B on a tie), front or back with a fair coin.
  Which side each step trims does not depend on the coins, so we compute the trims per side in closed form
  (``truncation_trims``) and draw the number trimmed from the front as Binomial(n, 1/2), the popcount of n random
  bits (``fair_coin_counts``): the same law.
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from corpus.ragged import ragged_indices
from corpus.rng import mix64

MAX_RANDOM_DOC_TRIES = 10  # the reference's bound on redraws that avoid the current document
_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment
_POOL_WORDS = MAX_RANDOM_DOC_TRIES + 1  # words 0-9: the document tries; 10: the start sentence; then trim coins


class PackedDoc(NamedTuple):
    """A document as its sentences' ids back to back and the sentence bounds in them (n_sentences + 1, from 0), every
    sentence non-empty: what the builder's intermediate files hold, used as is."""

    tokens: np.ndarray
    sent_offsets: np.ndarray


def pack_sentences(sentences: Iterable[np.ndarray] | PackedDoc) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, sent_offsets) of the non-empty sentences; the reference drops lines with no tokens."""
    if isinstance(sentences, PackedDoc):
        return sentences
    kept = [s for s in sentences if len(s)]
    if not kept:
        return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    lengths = np.fromiter((len(s) for s in kept), dtype=np.int64, count=len(kept))
    offsets = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.concatenate(kept), offsets


class RandomDocPool:
    """Documents that random-next segments are drawn from, stored flat so it pickles cheaply (one array each).

    ``tokens``: all sentences back to back; ``sent_offsets``: sentence bounds in ``tokens`` (n_sentences + 1);
    ``doc_offsets``: document bounds in sentences (n_docs + 1); ``doc_ids``: one id per document.
    """

    def __init__(self, docs: Iterable[tuple[str, list[np.ndarray]]] = ()):
        doc_ids: list[str] = []
        pieces: list[np.ndarray] = []
        sent_lengths: list[int] = []
        doc_offsets = [0]
        for doc_id, sentences in docs:
            kept = [s for s in sentences if len(s)]
            if not kept:  # the reference removes empty documents
                continue
            doc_ids.append(doc_id)
            pieces.extend(kept)
            sent_lengths.extend(len(s) for s in kept)
            doc_offsets.append(len(sent_lengths))
        sent_offsets = np.zeros(len(sent_lengths) + 1, dtype=np.int64)
        np.cumsum(sent_lengths, out=sent_offsets[1:])
        tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint16)
        self._set(doc_ids, tokens, sent_offsets, np.asarray(doc_offsets, dtype=np.int64))

    @classmethod
    def from_arrays(
        cls, doc_ids: list[str], tokens: np.ndarray, sent_offsets: np.ndarray, doc_offsets: np.ndarray
    ) -> RandomDocPool:
        """Rebuild from the flat arrays (``to_arrays``), e.g. after a trip through Ray's object store."""
        pool = cls.__new__(cls)
        pool._set(list(doc_ids), np.asarray(tokens), np.asarray(sent_offsets, np.int64),
                  np.asarray(doc_offsets, np.int64))
        return pool

    def to_arrays(self) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        return self.doc_ids, self.tokens, self.sent_offsets, self.doc_offsets

    def _set(self, doc_ids: list[str], tokens: np.ndarray, sent_offsets: np.ndarray, doc_offsets: np.ndarray) -> None:
        if (len(doc_offsets) != len(doc_ids) + 1 or sent_offsets[-1] != len(tokens)
                or doc_offsets[-1] != len(sent_offsets) - 1):
            raise ValueError("inconsistent pool arrays: need len(doc_offsets) == docs + 1 and offsets ending at the "
                             "data")
        self.doc_ids = doc_ids
        self.tokens = tokens
        self.sent_offsets = sent_offsets
        self.doc_offsets = doc_offsets
        # An integer per document id (the first index holding it), so "same document" is an array comparison.
        first: dict[str, int] = {}
        self._codes = np.array([first.setdefault(d, i) for i, d in enumerate(doc_ids)], dtype=np.int64)
        self._first = first

    def __len__(self) -> int:
        return len(self.doc_ids)

    def __reduce__(self):
        return (RandomDocPool.from_arrays, self.to_arrays())

    def code(self, doc_id: str) -> int:
        """The integer standing for ``doc_id`` in ``draw_documents`` (-1 when the pool does not hold it)."""
        return self._first.get(doc_id, -1)

    def draw_documents(self, u: np.ndarray, own: np.ndarray) -> np.ndarray:
        """Document index per row of ``u`` (rows of 10 uniforms): the first of ``floor(u * len)`` whose id is not
        the row's own (``own``, a ``code``), else the tenth draw anyway, as the reference."""
        n = len(self.doc_ids)
        if n == 0:
            raise ValueError("the random-document pool is empty; it needs at least one non-empty document")
        tries = (u[:, :MAX_RANDOM_DOC_TRIES] * n).astype(np.int64)
        ok = self._codes[tries] != own[:, None]
        first = np.where(ok.any(axis=1), ok.argmax(axis=1), MAX_RANDOM_DOC_TRIES - 1)
        return tries[np.arange(len(tries)), first]

    def segments(self, docs: np.ndarray, u: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token bounds in ``tokens`` of random-next Bs: from sentence ``floor(u * sentences)`` of each document,
        whole sentences until the target is reached (may overshoot) or the document ends; at least one sentence."""
        s0, s1 = self.doc_offsets[docs], self.doc_offsets[docs + 1]
        start = s0 + (u * (s1 - s0)).astype(np.int64)
        offs = self.sent_offsets
        b0 = offs[start]
        end = np.minimum(np.maximum(np.searchsorted(offs, b0 + targets), start + 1), s1)
        return b0, offs[end]


def pass_target(u0: float, u1: float, max_num_tokens: int, short_seq_prob: float) -> int:
    """The pass's target length: ``max_num_tokens``, or with probability short_seq_prob randint(2, max)."""
    return 2 + int(u1 * (max_num_tokens - 1)) if u0 < short_seq_prob else max_num_tokens


def walk_chunks(offs: list[int], target: int, u: list[float], out: list[int]) -> int:
    """The reference's chunking over one document pass; appends ``chunk_start, a_end, chunk_end, is_random`` per pair
    (sentence indices: A is sentences [chunk_start, chunk_start + a_end), an actual B runs to chunk_end inclusive)
    to ``out`` and returns the number of pairs. ``u`` needs ``2 + 2 * sentences`` uniforms (pair k: slots 2 + 2k,
    3 + 2k). A chunk ends at the first sentence that brings it to the target, or at the document's end; with a
    random next, the unused sentences go back (the next chunk starts after A); a one-sentence chunk is always
    random next."""
    n_sent = len(offs) - 1
    last = n_sent - 1
    start, k = 0, 2
    extend = out.extend
    while start < n_sent:
        end = bisect_left(offs, offs[start] + target, start + 1) - 1
        if end > last:
            end = last
        if end > start:
            a_end = 1 + int(u[k] * (end - start))  # randint(1, sentences in the chunk - 1)
            if u[k + 1] < 0.5:
                extend((start, a_end, end, 1))
                start += a_end
            else:
                extend((start, a_end, end, 0))
                start = end + 1
        else:
            extend((start, 1, end, 1))
            start += 1
        k += 2
    return (k - 2) >> 1


def truncation_trims(len_a, len_b, max_num_tokens: int):
    """Tokens the reference's truncate_seq_pair removes from A and from B (longer side first, B on a tie); works on
    scalars and arrays."""
    la, lb = np.asarray(len_a, dtype=np.int64), np.asarray(len_b, dtype=np.int64)
    excess = np.maximum(la + lb - max_num_tokens, 0)
    a_longer = la > lb
    to_longer = np.minimum(excess, np.abs(la - lb))  # until both sides are equal
    rest = excess - to_longer  # then alternately B, A, B, ... (B first on the tie)
    trim_a = np.where(a_longer, to_longer, 0) + rest // 2
    trim_b = np.where(a_longer, 0, to_longer) + rest - rest // 2
    return trim_a, trim_b


def pair_words(seeds: np.ndarray, index: np.ndarray | int) -> np.ndarray:
    """Word ``index`` of the SplitMix64 stream of each seed (uint64): ``mix64(seed + index * gamma)``."""
    with np.errstate(over="ignore"):
        return mix64(seeds + np.asarray(index, dtype=np.uint64) * _GAMMA)


def to_uniform(words: np.ndarray) -> np.ndarray:
    """Uniform doubles in [0, 1) from the top 53 bits of uint64 words."""
    return (words >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def fair_coin_counts(seeds: np.ndarray, n: np.ndarray, first_word: np.ndarray) -> np.ndarray:
    """Binomial(n_i, 1/2) per row: the popcount of n_i bits of row i's stream, from word ``first_word[i]`` on."""
    n = np.asarray(n, dtype=np.int64)
    out = np.zeros(len(n), dtype=np.int64)
    rows = np.flatnonzero(n)
    if not len(rows):
        return out
    bits = n[rows]
    words = (bits + 63) >> 6
    owner = np.repeat(np.arange(len(rows)), words)
    w = pair_words(seeds[rows][owner], ragged_indices(first_word[rows], words))
    last = np.cumsum(words) - 1  # the last word of a row keeps only the bits still needed (1-64)
    w[last] &= np.uint64(0xFFFFFFFFFFFFFFFF) >> (64 - (bits - 64 * (words - 1))).astype(np.uint64)
    out[rows] = np.bincount(owner, weights=np.bitwise_count(w), minlength=len(rows)).astype(np.int64)
    return out


class BlockPairs(NamedTuple):
    """Bounds of every pair of a block: A is ``block[a0:a1]``; B is ``block[b0:b1]``, or ``pool.tokens[b0:b1]``
    where ``is_random`` (a random next, from the pool)."""

    a0: np.ndarray
    a1: np.ndarray
    b0: np.ndarray
    b1: np.ndarray
    is_random: np.ndarray


def finish_pairs(walk: np.ndarray, doc_offsets: np.ndarray, targets: np.ndarray, own: np.ndarray,
                 seeds: np.ndarray, pool: RandomDocPool, max_num_tokens: int) -> BlockPairs:
    """Pairs from ``walk_chunks`` records, for a whole block at once.

    ``walk``: (n, 4) records with sentence indices already made block-wide (into ``doc_offsets``, the block's token
    offset of every sentence, each document followed by its end); per pair: the pass's ``targets``, the document's
    pool ``own`` code and the pair's ``seeds`` (its counter-based stream: words 0-10 pick a random next, the trim
    coins follow).
    """
    start, a_end, end, is_random = walk.T
    is_random = is_random.astype(bool)
    a0, a1 = doc_offsets[start], doc_offsets[start + a_end]
    b0, b1 = a1.copy(), doc_offsets[end + 1]
    rnd = np.flatnonzero(is_random)
    if len(rnd):
        u = to_uniform(pair_words(seeds[rnd, None], np.arange(_POOL_WORDS)[None, :]))
        docs = pool.draw_documents(u, own[rnd])
        b0[rnd], b1[rnd] = pool.segments(docs, u[:, MAX_RANDOM_DOC_TRIES], targets[rnd] - (a1[rnd] - a0[rnd]))
    trim_a, trim_b = truncation_trims(a1 - a0, b1 - b0, max_num_tokens)
    first = np.full(len(a0), _POOL_WORDS, dtype=np.int64)
    front_a = fair_coin_counts(seeds, trim_a, first)
    front_b = fair_coin_counts(seeds, trim_b, first + ((trim_a + 63) >> 6))
    return BlockPairs(a0 + front_a, a1 - (trim_a - front_a), b0 + front_b, b1 - (trim_b - front_b), is_random)
