"""Document quality heuristics: the Gopher rules (Rae et al. 2021, MassiveText) and C4's (Raffel et al. 2020),
each a named rule whose drops are counted as ``quality:<rule>``.

A document is dropped by the first rule (in ``RULES`` order) it fails; ``detail`` gives the measured value. Words
are whitespace-separated tokens for the counts, and normalised words (``curate.words``: lower case,
punctuation removed) for the repetition rules; lines are the text's lines (blank ones ignored), paragraphs its
blank-line separated blocks. The thresholds are the papers' (datatrove's ``GopherQualityFilter``,
``GopherRepetitionFilter`` and ``C4QualityFilter`` use the same numbers), except ``line_punct``, FineWeb's
document-level form of C4's line rule, and three moved to keep real documentation (marked *: measured on the shared
technical documentation, docs/build-checks.md, check curate-keeps-real). Every threshold is a ``QualityConfig``
field and a ``--quality-*`` flag; ``--quality-skip`` turns rules off:

    rule               drops a document when                                              source
    word_count         fewer than 50 or more than 100,000 words                           Gopher
    mean_word_length   mean word length outside 3..10 characters                          Gopher
    symbol_ratio       ('#' + '...' + '…') per word > 0.1                                 Gopher
    bullet_lines       > 90% of lines start with a bullet (• ‣ ◦ - * ·)                   Gopher
    ellipsis_lines     > 30% of lines end with an ellipsis                                 Gopher
    alpha_words        < 70% of words hold a letter (Gopher: 80%)                          Gopher*
    stop_words         fewer than 2 of: the be to of and that have with                    Gopher
                       (other languages' lists with --languages: STOP_WORDS_BY_LANGUAGE)
    dup_lines          > 30% of lines, or > 20% of line characters, repeat an earlier line Gopher
    dup_paragraphs     the same for paragraphs (30% / 20%)                                 Gopher
    top_ngram          the most frequent 2/3/4-gram covers > 25/23/21% of word characters  Gopher* (20/18/16)
    dup_ngrams         repeated 5..10-grams cover > 30/29/../25% of word characters        Gopher* (15..10)
    lorem_ipsum        contains "lorem ipsum"                                              C4
    curly_bracket      contains "{" (C4's test for code; not in the default set)           C4
    min_sentences      fewer than 5 sentences (the build's splitter)                       C4
    line_punct         < 12% of lines end in terminal punctuation (. ! ? … and a closer)   C4 (FineWeb's form)*
                       (code-aware: of the paragraphs not indented, else lines not indented)
    boilerplate_lines  > 30% of lines are cookie/subscribe/sign-in/policy/JavaScript lines C4's line list

The line rules (bullet_lines, ellipsis_lines, dup_lines, line_punct, boilerplate_lines) judge documents of at
least ``min_lines`` (3) lines only: a document that is one line (running text whose paragraph breaks were
flattened, as in our corpora) has no share of lines to speak of, and would otherwise be dropped for ending in a
heading.

``dup_ngrams`` counts the characters of the words covered by any occurrence of an n-gram after its first (Gopher
and datatrove skip ahead greedily instead; the two differ only where repeats overlap). ``QualityConfig.rules`` picks
a subset; ``DEFAULT_RULES`` is every rule but ``curly_bracket``, whose one brace anywhere removed a third of the
shared technical documentation (prose HOWTOs with one brace among them).
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
         "min_sentences", "line_punct", "boilerplate_lines")
DEFAULT_RULES = tuple(r for r in RULES if r != "curly_bracket")
STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
# Other languages' most frequent function words, for ``stop_words`` when --languages keeps them (Gopher's list is
# English: it dropped 85-97% of the shared German, Spanish, French, ... documentation).
STOP_WORDS_BY_LANGUAGE = {
    "en": STOP_WORDS,
    "de": ("der", "die", "und", "den", "von", "zu", "das", "mit", "sich", "ist", "nicht", "ein"),
    "es": ("de", "la", "que", "el", "en", "los", "del", "se", "las", "por", "para", "con"),
    "fr": ("de", "la", "le", "et", "les", "des", "du", "un", "une", "est", "que", "pour"),
    "it": ("di", "il", "la", "che", "per", "un", "del", "non", "della", "si", "con", "una"),
    "nl": ("de", "het", "een", "en", "van", "is", "dat", "op", "te", "zijn", "met", "voor"),
    "pl": ("w", "na", "z", "do", "się", "nie", "to", "że", "jest", "jak", "lub", "oraz"),
    "pt": ("de", "que", "do", "da", "em", "um", "para", "com", "não", "os", "no", "uma"),
    "ru": ("и", "в", "не", "на", "что", "с", "по", "как", "это", "для", "из", "или"),
}
TOP_NGRAM = {2: 0.20, 3: 0.18, 4: 0.16}
DUP_NGRAMS = {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}
_BULLETS = ("•", "‣", "◦", "-", "*", "·", "⁃", "●", "▪")
_CLOSERS = "\"'”’»)]}」』）"
_TERMINAL = (".", "!", "?", "…", "。", "！", "？")
_ALPHA_TOKEN = re.compile(r"\S*[^\W\d_]\S*")
_PARAGRAPHS = re.compile(r"\n[ \t\r\f\v]*\n")
_BOILERPLATE = re.compile(r"cookie|subscri|newsletter|privacy policy|terms of (?:use|service)|sign (?:in|up)\b|"
                          r"log ?in\b|javascript|all rights reserved|create (?:an )?account", re.IGNORECASE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class QualityConfig:
    """Which rules run (all by default) and the thresholds the module docstring names."""

    rules: tuple[str, ...] = DEFAULT_RULES
    """Names from ``RULES`` to run, checked in ``RULES`` order whatever the order here; by default every rule but
    C4's ``curly_bracket`` (one ``{`` anywhere drops a page: it removed a third of the shared technical
    documentation, prose HOWTOs with one brace among them; docs/build-checks.md)."""
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
    min_alpha_words: float = 0.7
    """Smallest share of words holding a letter: Gopher's is 0.8, which drops reference pages with tables of
    numbers and options (a tenth of the shared technical documentation at 0.74-0.79; docs/build-checks.md)."""
    min_stop_words: int = 2
    """Fewest distinct stop words a kept document holds (Gopher: of the be to of and that have with)."""
    stop_word_languages: tuple[str, ...] = ("en",)
    """Languages whose stop words count for ``stop_words`` (``STOP_WORDS_BY_LANGUAGE``); the build sets them from
    --languages. A language without a list (ja, zh, ...: no spaces between words) turns the rule off."""
    max_dup_lines: float = 0.3
    """Largest share of lines that may repeat an earlier line (Gopher)."""
    max_dup_line_chars: float = 0.2
    """Largest share of line characters that may be in repeated lines (Gopher)."""
    max_dup_paragraphs: float = 0.3
    """Largest share of blank-line separated paragraphs that may repeat an earlier one (Gopher)."""
    max_dup_paragraph_chars: float = 0.2
    """Largest share of paragraph characters that may be in repeated paragraphs (Gopher)."""
    max_top_ngram: float = 0.25
    """Largest share of word characters the most frequent 2-gram may cover; 3- and 4-grams get 0.02 and 0.04 less
    (Gopher's ladder, 0.20 / 0.18 / 0.16, moved up by 0.05: reference pages name their subject in every entry)."""
    max_dup_ngrams: float = 0.30
    """Largest share of word characters repeated 5-grams may cover; each n from 6 to 10 gets 0.01 less (Gopher's
    0.15 .. 0.10 moved up by 0.15: manuals repeat their option and return-value phrases, 0.15-0.27 measured on
    the shared technical documentation; pages of one repeated line still go by dup_lines)."""
    max_boilerplate_lines: float = 0.3
    """Largest share of lines that may be web boilerplate: cookie, subscribe, newsletter, sign-in, privacy-policy,
    terms-of-use, JavaScript and all-rights-reserved lines (C4 removes such lines; here a page mostly made of them
    goes)."""
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
        if not 0 < self.max_dup_ngrams <= 1 or not 0 < self.max_top_ngram <= 1:
            raise ValueError(f"--quality-max-top-ngram {self.max_top_ngram} / --quality-max-dup-ngrams "
                             f"{self.max_dup_ngrams}: use a share in (0, 1]")
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


def _prose_units(text: str, min_units: int) -> list[str]:
    """What ``line_punct`` judges, code-aware: the blank-line separated paragraphs that do not start indented (an
    indented block is code, a table or verbatim text, which ends in no full stop), or, when there are fewer than
    ``min_units`` of those, the lines that do not start indented. A wrapped paragraph ends where its last line
    does, so a manual's prose is not judged by the ends of its wrapped lines."""
    paras = [p.strip() for p in _PARAGRAPHS.split(text) if p.strip() and not p[:1].isspace()]
    if len(paras) >= min_units:
        return paras
    return [ln.strip() for ln in text.split("\n") if ln.strip() and not ln[:1].isspace()]


def _ends_terminal(line: str) -> bool:
    return line.rstrip().rstrip(_CLOSERS).endswith(_TERMINAL)


class QualityFilter:
    def __init__(self, cfg: QualityConfig):
        self.cfg = cfg
        self.on = frozenset(cfg.rules)
        known = [lg for lg in cfg.stop_word_languages if lg in STOP_WORDS_BY_LANGUAGE]
        if len(known) < len(cfg.stop_word_languages):
            self.on = self.on - {"stop_words"}
        self.stop = words(sorted({w for lg in known for w in STOP_WORDS_BY_LANGUAGE[lg]})).hashes

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
                limit += c.max_top_ngram - TOP_NGRAM[2]
                if "top_ngram" in on and shares["top", n][d] > limit:
                    return "top_ngram", f"{n}-gram {shares['top', n][d]:.3f}"
            for n, limit in DUP_NGRAMS.items():
                limit += c.max_dup_ngrams - DUP_NGRAMS[5]
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
            units = _prose_units(text, c.min_lines)
            if len(units) >= c.min_lines:
                share = sum(map(_ends_terminal, units)) / len(units)
                if share < c.min_line_punct:
                    return "line_punct", f"{share:.2f}"
        if "boilerplate_lines" in on and lines:
            share = sum(bool(_BOILERPLATE.search(ln)) for ln in lines) / len(lines)
            if share > c.max_boilerplate_lines:
                return "boilerplate_lines", f"{share:.2f}"
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
