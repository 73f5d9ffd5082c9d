"""Sentence splitting for running text: fast rules tuned for the cases that break naive splitters.

The reference takes one sentence per line and leaves splitting to the user; our corpora are free-running text, so
the builder splits them. Rules (see ``docs/benchmarks.md`` "Sentence splitter choice" for the measurements that
picked them over blingfire, a plain regex, NLTK Punkt, syntok and pysbd):

- A blank line (paragraph break) always ends a sentence; a single newline is whitespace (hard-wrapped text).
- ``.``, ``!``, ``?``, ``…`` (runs of them, e.g. ``?!`` and ``...``), then optional closing quotes/brackets, then
  whitespace, end a sentence when what follows (after opening quotes/brackets) starts with an uppercase letter, a
  digit or an uncased letter (CJK, ...). A lowercase continuation never starts a sentence ("e.g. the", "3 p.m. on").
- No split after a known abbreviation (Mr. Dr. St. e.g. i.e. vs. Fig. No. ...) or a single-letter initial
  ("J. R. R. Tolkien", "U.S. Navy"); decimals (3.14) never match since no space follows the point.
- Sloppy text without a space after the full stop ("the end.Next") splits when a lowercase word of 2+ letters is
  followed by a capitalised word; "www.gutenberg.org" and "Mr.Smith" do not.
- CJK full stops 。！？ (and fullwidth ！？) end a sentence with no space needed.
"""
from __future__ import annotations

import re

# Lower-cased, without the final point. Titles, Latin, references and units seen before names/numbers; chosen
# to be ones that rarely end a sentence (so "etc." may still end one).
ABBREVIATIONS = frozenset(
    """mr mrs ms mx dr prof st sr jr rev fr gen col capt cpt lt sgt maj cmdr adm hon gov pres sen rep supt messrs mme
    mlle mssrs e.g eg i.e ie viz cf vs v al approx ca c fig figs vol vols no nos pp p ch chap sec sect art para
    ed eds esp est dept univ assn bros inc ltd co corp jan feb mar apr jun jul aug sep sept oct nov dec mt ft
    op ps a.m p.m""".split()
)

_CLOSERS = "\"'”’»)]}」』）"
_OPENERS = "\"'“‘«([{「『（"
_TERMINALS = ".!?…。！？"
_CJK_STOPS = "。！？"
# One alternative starting with a terminal character: Python's re scans ~7x faster than with alternations whose
# lookbehinds run at every position. Each match (~1 per sentence) is then decided in Python.
_CANDIDATE = re.compile(r"[.!?…。！？]+[\"'”’»)\]}」』）]*\s*")
_PARAGRAPH = re.compile(r"\n[ \t\r\f\v]*\n\s*")


def _is_abbreviation(text: str, dot: int) -> bool:
    """Whether the '.' at ``text[dot]`` closes an abbreviation or an initial."""
    # Abbreviations are short: look back a bounded distance, with C-level rfind rather than a Python loop.
    lo = max(0, dot - 12)
    start = max(text.rfind(" ", lo, dot), text.rfind("\n", lo, dot), text.rfind("\t", lo, dot)) + 1
    if start == 0 and lo > 0:
        return False  # a "word" longer than any abbreviation
    word = text[start:dot].lstrip(_OPENERS)
    if not word:
        return False
    if len(word) == 1:
        return word.isalpha()  # an initial: "J. R. R. Tolkien", or the last letter of "U.S."
    if word[-2] == "." and word[-1].isalpha():
        return True  # dotted acronyms: "U.S.", "e.g.", "a.m."
    return word.lower() in ABBREVIATIONS


def _starts_sentence(text: str, i: int) -> bool:
    n = len(text)
    while i < n and text[i] in _OPENERS:
        i += 1
    if i >= n:
        return False
    c = text[i]
    # Uppercase, digits and uncased scripts (CJK has no case) may start a sentence; lowercase continues one.
    return c.isupper() or c.isdigit() or (c.isalpha() and not c.islower())


def _is_boundary(text: str, s: int, e: int) -> bool:
    """Whether the candidate ``text[s:e]`` (terminals, closers, whitespace) ends a sentence."""
    run_end = s + 1
    while run_end < e and text[run_end] in _TERMINALS:
        run_end += 1
    first = text[s]
    if first in _CJK_STOPS or (first in "!?" and s and ord(text[s - 1]) >= 0x2E80) or (
        run_end > s + 1 and any(c in _CJK_STOPS for c in text[s:run_end])
    ):
        return True  # CJK: no space or capital needed
    single_point = first == "." and run_end == s + 1
    if text[e - 1].isspace():
        if e >= len(text) or not _starts_sentence(text, e):
            return False
        return not (single_point and _is_abbreviation(text, s))
    # No whitespace: only the sloppy "word.Next" case ("www.gutenberg.org", "3.14", "e.g.," never split).
    if not single_point or run_end != e or e + 1 >= len(text) or s < 2:
        return False
    return (
        text[e].isupper()
        and text[e + 1].islower()
        and text[s - 1].islower()
        and text[s - 2].islower()
        and not _is_abbreviation(text, s)
    )


def _split_paragraph(text: str, out: list[str]) -> None:
    start = 0
    for m in _CANDIDATE.finditer(text):
        s, e = m.span()
        if _is_boundary(text, s, e):
            piece = text[start:e].strip()
            if piece:
                out.append(piece)
            start = e
    piece = text[start:].strip()
    if piece:
        out.append(piece)


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` in order, stripped, none empty; newlines inside a sentence become spaces."""
    out: list[str] = []
    for para in _PARAGRAPH.split(text):
        if para and not para.isspace():
            _split_paragraph(para, out)
    return [s.replace("\n", " ") if "\n" in s else s for s in out]
