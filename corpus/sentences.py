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
# The same sets as regex character classes.
_TERM, _CLOSE, _OPEN = (f"[{re.escape(chars)}]" for chars in (_TERMINALS, _CLOSERS, _OPENERS))
# The lookbehinds below may call a word an abbreviation only when a space, tab or newline precedes it within the
# 12 characters that _is_abbreviation searches for the start of the word.
assert max(map(len, ABBREVIATIONS)) <= 11


def _abbreviations_by_length() -> list[str]:
    """The alphabetic abbreviations as one alternation per length: Python's lookbehinds must be fixed-width."""
    by_len: dict[int, list[str]] = {}
    for a in sorted(ABBREVIATIONS):
        if a.isalpha() and len(a) > 1:
            by_len.setdefault(len(a), []).append(a)
    return ["|".join(words) for _, words in sorted(by_len.items())]


# Not an abbreviation: no word start 2-6 letters back spells one. (?i) errs towards "could be one" (it also matches
# e.g. the long s for s, which lower() leaves alone).
_NOT_ABBREVIATION = "".join(rf"(?<!\b(?i:{w})\.)" for w in _abbreviations_by_length())
# Surely an abbreviation or initial: right after a space, tab or newline, ASCII case variants only, as
# _is_abbreviation cuts and lower()s the word.
_ABBREVIATION = "|".join(
    [rf"(?<=[ \n\t](?ai:{w})\.)" for w in _abbreviations_by_length()]
    + [r"(?<=[ \n\t][A-Za-z]\.)", r"(?<=[ \n\t][A-Za-z]\.[A-Za-z]\.)"]
)
# A candidate (~1 per sentence) is a run of terminals, then closers, then whitespace. The pattern starts with one
# terminal character class, so re skips ahead with its prefix-charset scan (~2x faster than with "[...]+" first, ~7x
# faster than with lookbehinds tried at every position); the lookarounds after it run only at candidates and settle
# the common shapes in C, always with the same span as the plain run:
# - yes: a boundary whatever _is_boundary's finer rules say: "!", "?", a CJK stop or a run of terminals, or a single
#   "." after a non-letter or after 2+ ASCII letters that cannot spell an abbreviation; then whitespace, optional
#   openers and an ASCII capital or digit.
# - no: a single "." closing an abbreviation or initial that follows a space; or non-CJK terminals followed by the
#   end, by whitespace, openers and a lowercase ASCII letter or , ; : dash, or (with no space) by one of those or a
#   digit.
# _is_boundary decides the rest (~1-3% of candidates in the corpora) and remains the definition of a boundary.
_CANDIDATE = re.compile(
    rf"{_TERM}(?:"
    rf"(?P<yes>(?:(?<=[A-Za-z]{{2}}\.){_NOT_ABBREVIATION}|(?<![^\W\d_]\.)|(?<=[!?…。！？]){_TERM}*|{_TERM}+)"
    rf"{_CLOSE}*\s+(?={_OPEN}*[A-Z0-9]))"
    rf"|(?P<no>(?:{_ABBREVIATION})(?!{_TERM}){_CLOSE}*\s*"
    rf"|(?:(?<=[.…])|(?<=[\x00-\u2e7f][!?]))[.!?…]*+{_CLOSE}*+"
    rf"(?:\s+(?={_OPEN}*+[a-z,;:—–-])|(?=[a-z0-9,;:—–-])|\s*\Z))"
    rf"|{_TERM}*{_CLOSE}*\s*)"
)
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
    ends = [
        m.end() for m in _CANDIDATE.finditer(text)
        if (kind := m.lastgroup) == "yes" or (kind is None and _is_boundary(text, *m.span()))
    ]
    # Every piece but the last holds its stop, so only the last can strip to nothing.
    out += [text[a:b].strip() for a, b in zip([0, *ends], ends, strict=False)]
    piece = text[ends[-1] if ends else 0:].strip()
    if piece:
        out.append(piece)


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` in order, stripped, none empty; newlines inside a sentence become spaces."""
    out: list[str] = []
    for para in _PARAGRAPH.split(text):
        if para and not para.isspace():
            _split_paragraph(para, out)
    return [s.replace("\n", " ") if "\n" in s else s for s in out]
