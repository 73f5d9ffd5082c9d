"""Words and word n-grams as 64-bit hashes, for a whole batch of documents at once (NumPy, no per-word Python).

Near-duplicate detection and decontamination compare texts as sequences of normalised words: lower case (Python's
``str.lower``, so every script), and a word is a maximal run of characters that are not separators. Separators are
ASCII characters other than letters and digits, and the Unicode punctuation and spaces most text carries:
U+00A0-U+00BF (no-break space, quotes, signs), U+2000-U+207F (general punctuation: dashes, curly quotes, ellipsis,
zero-width characters; super- and subscripts), U+3000-U+303F (CJK punctuation) and U+FEFF (BOM). Other non-ASCII
characters (letters of every script, also CJK ideographs, which then form long "words") count as word characters.
GPT-3 and datatrove normalise the same way for their 13-gram decontamination (lower case, punctuation removed).

Hashes are fixed functions of the bytes (a polynomial over the word's UTF-8 bytes, then splitmix64), identical in
every process and machine: never Python's salted ``hash()``. A word n-gram's hash is a polynomial over its words'
hashes taken from prefix sums, so every n (5 for shingles, 13 for decontamination, the lengths of short evaluation
texts) costs a few array passes, whatever n is.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from corpus.rng import mix64

_U64 = np.uint64
# Odd multipliers: invertible modulo 2**64, so a prefix sum can be shifted back to position 0 exactly.
_BYTE_BASE = 0x100000001B3  # FNV's 64-bit prime
_BYTE_BASE_INV = pow(_BYTE_BASE, -1, 1 << 64)
_WORD_BASE = 0x9E3779B97F4A7C15 | 1
_WORD_BASE_INV = pow(_WORD_BASE, -1, 1 << 64)

# ASCII: letters and digits are word bytes; everything else separates. Bytes >= 0x80 are word bytes unless the
# multi-byte sequences below mark them as punctuation.
_SEPARATOR = np.ones(256, dtype=bool)
for _lo, _hi in ((ord("0"), ord("9")), (ord("A"), ord("Z")), (ord("a"), ord("z")), (0x80, 0xFF)):
    _SEPARATOR[_lo:_hi + 1] = False
# (lead byte, second-byte range) of the punctuation blocks named in the module docstring.
_PUNCT_2 = ((0xC2, 0xA0, 0xBF),)  # U+00A0-U+00BF
_PUNCT_3 = ((0xE2, 0x80, 0x81), (0xE3, 0x80, 0x80))  # U+2000-U+207F (we take all of 0x2000-0x207F), U+3000-U+303F
_BOM = (0xEF, 0xBB, 0xBF)


@dataclasses.dataclass(frozen=True)
class Words:
    """The words of a batch of documents: ``hashes[offsets[d]:offsets[d + 1]]`` are document d's, in order."""

    hashes: np.ndarray
    """uint64, one per normalised word, a fixed function of its bytes (never the salted ``hash()``)."""
    offsets: np.ndarray
    """int64, len(documents) + 1: document d's words are ``[offsets[d], offsets[d + 1])``."""
    lengths: np.ndarray
    """int64, each word's length in UTF-8 bytes: the weights of the repetition rules' character shares."""
    starts: np.ndarray | None = None
    """int64, each word's first byte in the batch's lower-cased UTF-8 text, the documents joined by one space
    (``words``): where a matched n-gram's words are, to quote them; None where not kept."""

    def count(self, d: int) -> int:
        return int(self.offsets[d + 1] - self.offsets[d])


def _separators(buf: np.ndarray) -> np.ndarray:
    """Which bytes separate words. ``buf`` ends with 2 spaces, so a sequence test never reads past it."""
    sep = _SEPARATOR[buf]
    at = np.flatnonzero(buf >= 0xC2)  # lead bytes of multi-byte characters: few, so the tests below are cheap
    if len(at):
        b0, b1, b2 = buf[at], buf[at + 1], buf[at + 2]
        two = np.zeros(len(at), dtype=bool)
        three = (b0 == _BOM[0]) & (b1 == _BOM[1]) & (b2 == _BOM[2])
        for lead, lo, hi in _PUNCT_2:
            two |= (b0 == lead) & (b1 >= lo) & (b1 <= hi)
        for lead, lo, hi in _PUNCT_3:
            three |= (b0 == lead) & (b1 >= lo) & (b1 <= hi)
        for k, mask in ((2, two), (3, three)):
            for j in range(k):
                sep[at[mask] + j] = True
    return sep


def _powers(base: int, n: int) -> np.ndarray:
    """base**0 .. base**(n-1) modulo 2**64."""
    out = np.full(max(n, 1), base, dtype=_U64)
    out[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(out, dtype=_U64)[:n]


_CHUNK = 1 << 20  # bytes of text per prefix sum: the byte powers cached for it are 16 MB per process
_CACHE: dict[str, np.ndarray] = {}


def _byte_powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(B**i, B**-i) for i < n, cached per process (grown for a word longer than a chunk)."""
    if len(_CACHE.get("pow", ())) < n:
        n = max(n, _CHUNK + 1)
        _CACHE["pow"], _CACHE["inv"] = _powers(_BYTE_BASE, n), _powers(_BYTE_BASE_INV, n)
    return _CACHE["pow"], _CACHE["inv"]


def _word_sums(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per word, sum of byte_j * B**(j - start): prefix sums over chunks of about _CHUNK bytes cut at word starts,
    shifted back to each word's start, so a word's value does not depend on where its chunk begins."""
    out = np.empty(len(starts), dtype=_U64)
    cuts = np.unique(np.searchsorted(starts, np.arange(0, int(ends[-1]), _CHUNK)))
    cuts = np.append(cuts, len(starts))
    for w0, w1 in zip(cuts[:-1], cuts[1:], strict=False):
        a, b = int(starts[w0]), int(ends[w1 - 1])
        pw, inv = _byte_powers(b - a + 1)
        prefix = np.zeros(b - a + 1, dtype=_U64)
        with np.errstate(over="ignore"):
            np.cumsum(buf[a:b] * pw[:b - a], out=prefix[1:])
            s, e = starts[w0:w1] - a, ends[w0:w1] - a
            out[w0:w1] = (prefix[e] - prefix[s]) * inv[s]
    return out


def words(texts: Sequence[str]) -> Words:
    """Normalised word hashes of every text, one pass over the batch's bytes. A text that is None has no words."""
    encoded = [(t or "").lower().encode("utf-8", "surrogatepass") for t in texts]
    lengths = np.fromiter((len(e) + 1 for e in encoded), dtype=np.int64, count=len(encoded))
    doc_start = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(lengths, out=doc_start[1:])
    # One space after each document keeps words from running across documents; two more end the buffer.
    buf = np.frombuffer(b" ".join(encoded) + b"   ", dtype=np.uint8)
    is_word = ~_separators(buf)
    edges = np.diff(is_word.view(np.int8), prepend=np.int8(0))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    lens = ends - starts
    if not len(starts):
        return Words(np.zeros(0, _U64), np.zeros(len(encoded) + 1, dtype=np.int64), np.zeros(0, np.int64))
    with np.errstate(over="ignore"):
        # Each word byte times base**(its position in the word), summed per word; then mixed with the length.
        hashes = mix64(_word_sums(buf, starts, ends) ^ (lens.astype(_U64) << _U64(48)))
    offsets = np.searchsorted(starts, doc_start[:-1]).astype(np.int64)
    return Words(hashes, np.append(offsets, len(starts)), lens, starts)


class Ngrams:
    """Word n-gram hashes of a batch for any n: the prefix sums are made once, each n then costs a few passes."""

    def __init__(self, w: Words):
        self.w = w
        m = len(w.hashes)
        with np.errstate(over="ignore"):
            # prefix[i] = sum_{j<i} h_j * B**j; a gram is (prefix[end] - prefix[start]) * B**-start, so it does
            # not depend on where it sits.
            self.prefix = np.zeros(m + 1, dtype=_U64)
            np.cumsum(w.hashes * _powers(_WORD_BASE, m), out=self.prefix[1:])
        self.unshift = _powers(_WORD_BASE_INV, m)

    def __call__(self, n: int, short: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Hashes of every run of ``n`` consecutive words inside each document, and per-document offsets into them
        (like ``Words.offsets``). With ``short``, a document of 1..n-1 words gets one n-gram: all its words (so a
        two-line document still has a MinHash signature)."""
        w = self.w
        counts = np.diff(w.offsets)
        per_doc = np.maximum(counts - n + 1, 0)
        if short:
            per_doc = np.where((counts > 0) & (counts < n), 1, per_doc)
        out_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(per_doc, out=out_offsets[1:])
        total = int(out_offsets[-1])
        if not total:
            return np.zeros(0, _U64), out_offsets
        # gram i covers words [start_i, end_i) of the batch.
        doc_of = np.repeat(np.arange(len(counts)), per_doc)
        start = w.offsets[doc_of] + (np.arange(total, dtype=np.int64) - out_offsets[doc_of])
        end = np.minimum(start + n, w.offsets[doc_of + 1])
        with np.errstate(over="ignore"):
            grams = (self.prefix[end] - self.prefix[start]) * self.unshift[start]
            # The length is mixed in: a short document's gram never equals a full one.
            return mix64(grams ^ (end - start).astype(_U64)), out_offsets


def ngrams(w: Words, n: int, short: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``Ngrams(w)(n, short)``: one n."""
    return Ngrams(w)(n, short)
