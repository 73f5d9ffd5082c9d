"""NSP pairs (reference steps 3-6) over one document pass, as token-slice bounds rather than token lists.

A document is its sentences' ids back to back (``tokens``) plus sentence bounds (``sent_offsets``); every segment
the reference builds is a run of consecutive sentences, so A, B and their truncations are plain slices. Control
flow draws from a ``random.Random`` (scalar draws are ~10x cheaper than numpy's), in the reference's order.

How we differ from the reference, with the same distribution:
- The reference draws the random-next document from the whole in-memory corpus with one global RNG; we draw it from
  a ``RandomDocPool`` (the whole corpus in the plain loop and the tests; a seeded sample of it in a distributed
  build) with the document pass's own RNG. Up to 10 draws avoid the current document, as in the reference;
  "same document" means the same document id.
- ``truncate_seq_pair`` trims one token per step from the longer side (B on a tie), front or back with a fair coin.
  Which side each step trims does not depend on the coins, so we compute the trims per side in closed form and
  draw the number trimmed from the front as Binomial(n, 1/2) (a popcount of n random bits): the same law.
"""
from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from pipeline.rng import UniformStream

MAX_RANDOM_DOC_TRIES = 10  # the reference's bound on redraws that avoid the current document


def randint(rng: random.Random, a: int, b: int) -> int:
    """Uniform integer in [a, b] like ``rng.randint`` at a sixth of the cost (one ``random()``; the float's
    53-bit resolution biases a range of n values by at most n / 2**53)."""
    return a + int(rng.random() * (b - a + 1))


def pack_sentences(sentences: Iterable[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, sent_offsets) of the non-empty sentences; the reference drops lines with no tokens."""
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
    ) -> "RandomDocPool":
        """Rebuild from the flat arrays (``to_arrays``), e.g. after a trip through Ray's object store."""
        pool = cls.__new__(cls)
        pool._set(list(doc_ids), np.asarray(tokens), np.asarray(sent_offsets, np.int64), np.asarray(doc_offsets, np.int64))
        return pool

    def to_arrays(self) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        return self.doc_ids, self.tokens, self.sent_offsets, self.doc_offsets

    def _set(self, doc_ids: list[str], tokens: np.ndarray, sent_offsets: np.ndarray, doc_offsets: np.ndarray) -> None:
        if len(doc_offsets) != len(doc_ids) + 1 or sent_offsets[-1] != len(tokens) or doc_offsets[-1] != len(sent_offsets) - 1:
            raise ValueError("inconsistent pool arrays: need len(doc_offsets) == docs + 1 and offsets ending at the data")
        self.doc_ids = doc_ids
        self.tokens = tokens
        self.sent_offsets = sent_offsets
        self.doc_offsets = doc_offsets
        # Python lists for the per-draw scalar lookups (numpy scalar indexing is ~10x slower).
        self._doc_offsets_list = doc_offsets.tolist()

    def __len__(self) -> int:
        return len(self.doc_ids)

    def __reduce__(self):
        return (RandomDocPool.from_arrays, self.to_arrays())

    def draw(self, rng: random.Random, exclude_doc_id: str) -> int:
        """Index of a random document, redrawn up to 10 times while it is ``exclude_doc_id`` (then kept anyway)."""
        n = len(self.doc_ids)
        if n == 0:
            raise ValueError("the random-document pool is empty; it needs at least one non-empty document")
        rand = rng.random
        for _ in range(MAX_RANDOM_DOC_TRIES):
            idx = int(rand() * n)
            if self.doc_ids[idx] != exclude_doc_id:
                break
        return idx

    def document(self, idx: int) -> list[np.ndarray]:
        """Sentence arrays of document ``idx`` (views into the pool)."""
        s0, s1 = self._doc_offsets_list[idx], self._doc_offsets_list[idx + 1]
        return [self.tokens[self.sent_offsets[j] : self.sent_offsets[j + 1]] for j in range(s0, s1)]

    def random_segment(self, rng: random.Random, idx: int, target_length: int) -> tuple[int, int]:
        """Token bounds in ``tokens`` of a random-next B: from a random sentence of document ``idx``, whole
        sentences until ``target_length`` tokens are reached (may overshoot) or the document ends."""
        s0, s1 = self._doc_offsets_list[idx], self._doc_offsets_list[idx + 1]
        start = s0 + int(rng.random() * (s1 - s0))
        offs = self.sent_offsets
        t0 = offs.item(start)
        # First sentence end at or past t0 + target: searchsorted finds it without a per-sentence loop.
        j = offs.searchsorted(t0 + target_length)
        j = min(max(j, start + 1), s1)
        return t0, offs.item(j)


class Pair(NamedTuple):
    """One instance before masking: A is ``doc_tokens[a0:a1]``, B is ``b_src[b0:b1]`` (b_src: doc or pool)."""

    a0: int
    a1: int
    b_from_pool: bool
    b0: int
    b1: int
    is_random_next: bool


def truncation_trims(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """Tokens the reference's truncate_seq_pair removes from A and from B (longer side first, B on a tie)."""
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0
    gap = abs(len_a - len_b)
    if excess <= gap:
        return (excess, 0) if len_a > len_b else (0, excess)
    rest = excess - gap  # once equal, trims alternate B, A, B, ... (B first on the tie)
    trim_a = rest // 2 + (gap if len_a > len_b else 0)
    trim_b = rest - rest // 2 + (gap if len_b > len_a else 0)
    return trim_a, trim_b


def document_pairs(
    doc_id: str,
    sent_offsets: list[int],
    rng: "random.Random | UniformStream",
    pool: RandomDocPool,
    max_seq_length: int,
    short_seq_prob: float,
) -> list[Pair]:
    """The reference's create_instances_from_document, minus masking, for one document pass.

    This is the builder's hottest Python loop, so it returns plain tuples in ``Pair``'s field order (a Pair
    compares equal to its tuple) and inlines ``pool.draw`` / ``pool.random_segment``, which stay the readable
    definitions (tests check both agree through the hand-computed cases).
    """
    n_sent = len(sent_offsets) - 1
    max_num_tokens = max_seq_length - 3
    rand = rng.random
    target = max_num_tokens
    if rand() < short_seq_prob:
        target = randint(rng, 2, max_num_tokens)  # drawn once per document pass, as the reference
    pool_ids, pool_docs, pool_offsets = pool.doc_ids, pool._doc_offsets_list, pool.sent_offsets
    n_pool = len(pool_ids)
    if n_pool == 0:
        raise ValueError("the random-document pool is empty; it needs at least one non-empty document")
    pairs: list[Pair] = []
    offs = sent_offsets
    chunk_start = 0
    while chunk_start < n_sent:
        # The chunk ends at the first sentence that brings it to the target, or at the document's end.
        i = min(bisect_left(offs, offs[chunk_start] + target, chunk_start + 1) - 1, n_sent - 1)
        n_chunk = i - chunk_start + 1
        a_end = 1 + int(rand() * (n_chunk - 1)) if n_chunk >= 2 else 1  # randint(1, n_chunk - 1)
        a0, a1 = offs[chunk_start], offs[chunk_start + a_end]
        if n_chunk == 1 or rand() < 0.5:
            for _ in range(MAX_RANDOM_DOC_TRIES):  # pool.draw
                d = int(rand() * n_pool)
                if pool_ids[d] != doc_id:
                    break
            s0, s1 = pool_docs[d], pool_docs[d + 1]  # pool.random_segment
            start = s0 + int(rand() * (s1 - s0))
            b0 = pool_offsets.item(start)
            j = min(max(int(pool_offsets.searchsorted(b0 + target - (a1 - a0))), start + 1), s1)
            b1 = pool_offsets.item(j)
            from_pool = True
            chunk_start += a_end  # unused sentences go back: the next chunk starts after A
        else:
            b0, b1 = a1, offs[i + 1]
            from_pool = False
            chunk_start = i + 1
        trim_a, trim_b = truncation_trims(a1 - a0, b1 - b0, max_num_tokens)
        if trim_a:
            front = rng.getrandbits(trim_a).bit_count()  # Binomial(trims, 1/2): a fair coin per trimmed token
            a0, a1 = a0 + front, a1 - (trim_a - front)
        if trim_b:
            front = rng.getrandbits(trim_b).bit_count()
            b0, b1 = b0 + front, b1 - (trim_b - front)
        pairs.append((a0, a1, from_pool, b0, b1, from_pool))  # type: ignore[arg-type]
    return pairs
