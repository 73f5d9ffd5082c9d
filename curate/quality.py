"""Document quality heuristics: the Gopher rules (Rae et al. 2021, MassiveText) and C4's (Raffel et al. 2020),
each a named rule whose drops are counted as ``quality:<rule>``.

A document is dropped by the first rule (in ``RULES`` order) it fails; ``detail`` gives the measured value. Words
are whitespace-separated tokens for the counts, and normalised words (``curate.words``: lower case,
punctuation removed) for the repetition rules; lines are the text's lines (blank ones ignored), paragraphs its
blank-line separated blocks. The thresholds are the papers' (datatrove's ``GopherQualityFilter``,
``GopherRepetitionFilter`` and ``C4QualityFilter`` use the same numbers), except ``line_punct``, FineWeb's
document-level form of C4's line rule:

    rule               drops a document when                                              source
    word_count         fewer than 50 or more than 100,000 words                           Gopher
    mean_word_length   mean word length outside 3..10 characters                          Gopher
    symbol_ratio       ('#' + '...' + '…') per word > 0.1                                 Gopher
    bullet_lines       > 90% of lines start with a bullet (• ‣ ◦ - * ·)                   Gopher
    ellipsis_lines     > 30% of lines end with an ellipsis                                 Gopher
    alpha_words        < 80% of words hold a letter                                        Gopher
    stop_words         fewer than 2 of: the be to of and that have with                    Gopher
    dup_lines          > 30% of lines, or > 20% of line characters, repeat an earlier line Gopher
    dup_paragraphs     the same for paragraphs (30% / 20%)                                 Gopher
    top_ngram          the most frequent 2/3/4-gram covers > 20/18/16% of word characters  Gopher
    dup_ngrams         repeated 5..10-grams cover > 15/14/13/12/11/10% of word characters  Gopher
    lorem_ipsum        contains "lorem ipsum"                                              C4
    curly_bracket      contains "{" (C4's test for code)                                   C4
    min_sentences      fewer than 5 sentences (the build's splitter)                       C4
    line_punct         < 12% of lines end in terminal punctuation (. ! ? … and a closer)   C4 (FineWeb's form)

The line rules (bullet_lines, ellipsis_lines, dup_lines, line_punct) judge documents of at least ``min_lines`` (3)
lines only: a document that is one line (running text whose paragraph breaks were flattened, as in our corpora)
has no share of lines to speak of, and would otherwise be dropped for ending in a heading.

``dup_ngrams`` counts the characters of the words covered by any occurrence of an n-gram after its first (Gopher
and datatrove skip ahead greedily instead; the two differ only where repeats overlap). ``QualityConfig.rules`` picks
a subset.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pyarrow as pa

from curate import contract
from curate.words import Ngrams, Words, words

RULES = ("word_count", "mean_word_length", "symbol_ratio", "bullet_lines", "ellipsis_lines", "alpha_words",
         "stop_words", "dup_lines", "dup_paragraphs", "top_ngram", "dup_ngrams", "lorem_ipsum", "curly_bracket",
         "min_sentences", "line_punct")
STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
TOP_NGRAM = {2: 0.20, 3: 0.18, 4: 0.16}
DUP_NGRAMS = {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}
_BULLETS = ("•", "‣", "◦", "-", "*", "·", "⁃", "●", "▪")
_CLOSERS = "\"'”’»)]}」』）"
_TERMINAL = (".", "!", "?", "…", "。", "！", "？")
_ALPHA_TOKEN = re.compile(r"\S*[^\W\d_]\S*")
_PARAGRAPHS = re.compile(r"\n[ \t\r\f\v]*\n")


@dataclasses.dataclass(frozen=True, kw_only=True)
class QualityConfig:
    """Which rules run (all by default) and the thresholds the module docstring names."""

    rules: tuple[str, ...] = RULES
    """Names from ``RULES`` to run, checked in ``RULES`` order whatever the order here; all by default."""
    min_words: int = 50
    """Fewest whitespace-separated words a kept document has (Gopher, Rae et al. 2021)."""
    max_words: int = 100_000
    """Most whitespace-separated words a kept document has (Gopher)."""
    min_mean_word_length: float = 3.0
    """Lowest mean word length, in characters, of a kept document (Gopher)."""
    max_mean_word_length: float = 10.0
    """Highest mean word length, in characters, of a kept document (Gopher)."""
    max_symbol_ratio: float = 0.1
    """Most ('#' + '...' + '…') occurrences per word (Gopher)."""
    max_bullet_lines: float = 0.9
    """Largest share of lines that may start with a bullet (Gopher)."""
    max_ellipsis_lines: float = 0.3
    """Largest share of lines that may end with an ellipsis (Gopher)."""
    min_alpha_words: float = 0.8
    """Smallest share of words holding a letter (Gopher)."""
    min_stop_words: int = 2
    """Fewest distinct words of ``STOP_WORDS`` (the be to of and that have with) a kept document holds (Gopher)."""
    max_dup_lines: float = 0.3
    """Largest share of lines that may repeat an earlier line (Gopher)."""
    max_dup_line_chars: float = 0.2
    """Largest share of line characters that may be in repeated lines (Gopher)."""
    max_dup_paragraphs: float = 0.3
    """Largest share of blank-line separated paragraphs that may repeat an earlier one (Gopher)."""
    max_dup_paragraph_chars: float = 0.2
    """Largest share of paragraph characters that may be in repeated paragraphs (Gopher)."""
    min_sentences: int = 5
    """Fewest sentences, by the build's splitter, a kept document has (C4, Raffel et al. 2020)."""
    min_line_punct: float = 0.12
    """Smallest share of lines ending in terminal punctuation: FineWeb's document-level form of C4's line rule."""
    min_lines: int = 3
    """Fewest non-blank lines for the line rules to judge a document: one flattened to a single line has no share
    of lines to speak of, and would otherwise be dropped for ending in a heading."""

    def __post_init__(self) -> None:
        unknown = [r for r in self.rules if r not in RULES]
        if unknown or not self.rules:
            raise ValueError(f"quality rules {', '.join(unknown) or '(none)'}: name one or more of {', '.join(RULES)}")
        if not 0 < self.min_words <= self.max_words:
            raise ValueError(f"min_words {self.min_words} / max_words {self.max_words}: need 0 < min <= max")


def _dup_share(items: list[str]) -> tuple[float, float]:
    """(share of items that repeat an earlier one, share of their characters)."""
    seen: set[str] = set()
    dup = dup_chars = total_chars = 0
    for s in items:
        total_chars += len(s)
        if s in seen:
            dup += 1
            dup_chars += len(s)
        else:
            seen.add(s)
    return (dup / len(items), dup_chars / total_chars) if items and total_chars else (0.0, 0.0)


def _per_doc(values: np.ndarray, offsets: np.ndarray, ufunc=np.add, empty=0) -> np.ndarray:
    """``ufunc.reduceat`` of ``values`` over each document's run [offsets[d], offsets[d+1]); ``empty`` for none."""
    out = np.full(len(offsets) - 1, empty, dtype=np.result_type(values, type(empty)))
    has = offsets[1:] > offsets[:-1]
    if has.any():
        out[has] = ufunc.reduceat(values, offsets[:-1][has])
    return out


def _ngram_shares(w: Words) -> dict[tuple[str, int], np.ndarray]:
    """Per document of the batch: ("top", n) the share of word characters in the most frequent n-gram's
    occurrences (0 when no n-gram repeats), ("dup", n) the share in words covered by a repeated n-gram's later
    occurrences. One sort per n over the whole batch (n-grams keyed by their document), no per-document loop."""
    n_docs, n_words = len(w.offsets) - 1, len(w.lengths)
    cum = np.zeros(n_words + 1, dtype=np.int64)
    np.cumsum(w.lengths, out=cum[1:])
    total = (cum[w.offsets[1:]] - cum[w.offsets[:-1]]).astype(np.float64)
    total[total == 0] = 1.0
    out: dict[tuple[str, int], np.ndarray] = {}
    grams = Ngrams(w)
    for n in (*TOP_NGRAM, *DUP_NGRAMS):
        g, off = grams(n)
        doc = np.repeat(np.arange(n_docs), np.diff(off))
        start = w.offsets[doc] + (np.arange(len(g)) - off[doc])
        # An n-gram is the same only within a document: key it by its document (an xor keeps the keys distinct).
        key = g ^ (doc.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        order = np.argsort(key)  # unstable and fast; first occurrences come from the positions, not the order
        k = key[order]
        run = np.flatnonzero(np.diff(k, prepend=k[:1] ^ np.uint64(1))) if len(k) else np.zeros(0, np.int64)
        counts = np.diff(np.append(run, len(k)))
        first = np.minimum.reduceat(order, run) if len(k) else np.zeros(0, np.int64)
        if n in TOP_NGRAM:
            count = np.empty(len(g), dtype=np.int64)
            count[order] = np.repeat(counts, counts)
            most = _per_doc(count, off, np.maximum)
            # the first occurrence of a most frequent n-gram of each document
            at = _per_doc(np.where(count == most[doc], np.arange(len(g)), len(g)), off, np.minimum, len(g))
            share = np.zeros(n_docs)
            ok = (at < len(g)) & (most > 1)
            best = at[ok]
            share[ok] = most[ok] * (cum[start[best] + n] - cum[start[best]]) / total[ok]
            out["top", n] = share
        else:
            repeat = np.ones(len(g), dtype=bool)
            repeat[first] = False
            s = start[repeat]
            depth = np.cumsum(np.bincount(s, minlength=n_words + 1) - np.bincount(s + n, minlength=n_words + 1))
            covered = np.zeros(n_words + 1, dtype=np.int64)
            np.cumsum(np.where(depth[:-1] > 0, w.lengths, 0), out=covered[1:])
            out["dup", n] = (covered[w.offsets[1:]] - covered[w.offsets[:-1]]) / total
    return out


def _ends_terminal(line: str) -> bool:
    return line.rstrip().rstrip(_CLOSERS).endswith(_TERMINAL)


class QualityFilter:
    def __init__(self, cfg: QualityConfig):
        self.cfg = cfg
        self.on = frozenset(cfg.rules)
        self.stop = words(list(STOP_WORDS)).hashes

    def _check(self, text: str, w: Words, d: int, shares, stops) -> tuple[str, str] | None:
        c, on = self.cfg, self.on
        tokens = text.split()
        n = len(tokens)
        if "word_count" in on and not c.min_words <= n <= c.max_words:
            return "word_count", str(n)
        if not n:
            return None
        if "mean_word_length" in on:
            mean = sum(map(len, tokens)) / n
            if not c.min_mean_word_length <= mean <= c.max_mean_word_length:
                return "mean_word_length", f"{mean:.2f}"
        if "symbol_ratio" in on:
            ratio = (text.count("#") + text.count("...") + text.count("…")) / n
            if ratio > c.max_symbol_ratio:
                return "symbol_ratio", f"{ratio:.3f}"
        lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
        if len(lines) < c.min_lines:
            lines = []  # too few lines for a share of lines (module docstring)
        if "bullet_lines" in on and lines:
            share = sum(ln.startswith(_BULLETS) for ln in lines) / len(lines)
            if share > c.max_bullet_lines:
                return "bullet_lines", f"{share:.2f}"
        if "ellipsis_lines" in on and lines:
            share = sum(ln.endswith(("...", "…")) for ln in lines) / len(lines)
            if share > c.max_ellipsis_lines:
                return "ellipsis_lines", f"{share:.2f}"
        if "alpha_words" in on:
            share = len(_ALPHA_TOKEN.findall(text)) / n
            if share < c.min_alpha_words:
                return "alpha_words", f"{share:.2f}"
        if "stop_words" in on:
            found = int(stops[d])
            if found < c.min_stop_words:
                return "stop_words", str(found)
        if "dup_lines" in on and lines:
            share, chars = _dup_share(lines)
            if share > c.max_dup_lines or chars > c.max_dup_line_chars:
                return "dup_lines", f"{share:.2f} of lines, {chars:.2f} of characters"
        if "dup_paragraphs" in on:
            paras = [p.strip() for p in _PARAGRAPHS.split(text) if p.strip()]
            share, chars = _dup_share(paras)
            if share > c.max_dup_paragraphs or chars > c.max_dup_paragraph_chars:
                return "dup_paragraphs", f"{share:.2f} of paragraphs, {chars:.2f} of characters"
        if shares:
            for n, limit in TOP_NGRAM.items():
                if "top_ngram" in on and shares["top", n][d] > limit:
                    return "top_ngram", f"{n}-gram {shares['top', n][d]:.3f}"
            for n, limit in DUP_NGRAMS.items():
                if "dup_ngrams" in on and shares["dup", n][d] > limit:
                    return "dup_ngrams", f"{n}-grams {shares['dup', n][d]:.3f}"
        low = text.lower() if "lorem_ipsum" in on else ""
        if "lorem_ipsum" in on and "lorem ipsum" in low:
            return "lorem_ipsum", ""
        if "curly_bracket" in on and "{" in text:
            return "curly_bracket", ""
        if "min_sentences" in on:
            from corpus.sentences import split_sentences

            count = len(split_sentences(text))
            if count < c.min_sentences:
                return "min_sentences", str(count)
        if "line_punct" in on and lines:
            share = sum(map(_ends_terminal, lines)) / len(lines)
            if share < c.min_line_punct:
                return "line_punct", f"{share:.2f}"
        return None

    @contract.per_slice
    def __call__(self, table: pa.Table) -> contract.Filtered:
        text = [t or "" for t in contract.texts(table)]
        w = words(text)
        shares = _ngram_shares(w) if self.on & {"top_ngram", "dup_ngrams"} else {}
        # how many of the stop words each document holds
        stops = sum((_per_doc((w.hashes == h).astype(np.int64), w.offsets) > 0).astype(np.int64) for h in self.stop)
        drop = np.zeros(len(table), dtype=bool)
        reasons, details = [], []
        for d, t in enumerate(text):
            failed = self._check(t, w, d, shares, stops)
            if failed:
                drop[d] = True
                reasons.append(contract.QUALITY + failed[0])
                details.append(failed[1] or None)
        return contract.split(table, drop, reasons, details=details)
