"""Sentence splitting on hand-labelled tricky cases (also scored by benchmarks/sentence_splitters.py)."""
from __future__ import annotations

import gzip
import json

import pytest

from corpus.sentences import _CANDIDATE, split_sentences

# (text, expected sentences). Written by hand for the cases that break naive splitters on real running text.
CASES: list[tuple[str, list[str]]] = [
    ("Call me Ishmael. Some years ago I went to sea.", ["Call me Ishmael.", "Some years ago I went to sea."]),
    ("Mr. Smith met Dr. Watson. They talked.", ["Mr. Smith met Dr. Watson.", "They talked."]),
    ("Mrs. Bennet and Prof. Higgins left St. Paul's at noon.",
     ["Mrs. Bennet and Prof. Higgins left St. Paul's at noon."]),
    ("J. R. R. Tolkien wrote it. It sold well.", ["J. R. R. Tolkien wrote it.", "It sold well."]),
    ("The value of pi is 3.14 roughly. Use 2.5 cups.", ["The value of pi is 3.14 roughly.", "Use 2.5 cups."]),
    ("Bring fruit, e.g. apples. Also bread, i.e. a loaf.", ["Bring fruit, e.g. apples.", "Also bread, i.e. a loaf."]),
    ('"Stop!" he cried. "Why?" she asked.', ['"Stop!" he cried.', '"Why?" she asked.']),
    ('He said "I am done." Then he left.', ['He said "I am done."', "Then he left."]),
    ("It was over (or so we thought.) Then came dawn.", ["It was over (or so we thought.)", "Then came dawn."]),
    ("\u201cIs it true?\u201d She nodded. \u201cYes.\u201d",
     ["\u201cIs it true?\u201d", "She nodded.", "\u201cYes.\u201d"]),
    ("Wait... what happened? He paused... Then he spoke.",
     ["Wait... what happened?", "He paused...", "Then he spoke."]),
    ("And then\u2026 Nothing at all.", ["And then\u2026", "Nothing at all."]),
    ("It ended.Next it began again.", ["It ended.", "Next it began again."]),
    ("Visit www.gutenberg.org for more. Thanks.", ["Visit www.gutenberg.org for more.", "Thanks."]),
    ("What?! No way. Really?", ["What?!", "No way.", "Really?"]),
    ("我爱北京。天安门很美！你去过吗？", ["我爱北京。", "天安门很美！", "你去过吗？"]),
    ("他说：「走吧。」我们走了。", ["他说：「走吧。」", "我们走了。"]),
    ("First paragraph ends here\n\nSecond one starts here.", ["First paragraph ends here", "Second one starts here."]),
    ("A hard-wrapped line\ncontinues here. Next.", ["A hard-wrapped line continues here.", "Next."]),
    ("He lives in the U.S. Navy base. It is big.", ["He lives in the U.S. Navy base.", "It is big."]),
    ("The meeting is at 5 p.m. on Friday. Be there.", ["The meeting is at 5 p.m. on Friday.", "Be there."]),
    ("See Fig. 3 and No. 5 for details. Done.", ["See Fig. 3 and No. 5 for details.", "Done."]),
    ("In 1851 it appeared. 1852 was quieter.", ["In 1851 it appeared.", "1852 was quieter."]),
    ("Smith et al. found it. Jones vs. Smith was next.", ["Smith et al. found it.", "Jones vs. Smith was next."]),
    ("\u00c9mile arriva. \u00c0 bient\u00f4t.", ["\u00c9mile arriva.", "\u00c0 bient\u00f4t."]),
    ("No punctuation at the end", ["No punctuation at the end"]),
    ("  Leading and trailing spaces.   ", ["Leading and trailing spaces."]),
    ("", []),
]


@pytest.mark.parametrize("text,expected", CASES, ids=[c[0][:30] for c in CASES])
def test_tricky_cases(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


# Cases for each way a candidate stop is decided: by the pattern itself ("yes" / "no" groups of _CANDIDATE) or by
# _is_boundary (no group). Kept out of CASES, which benchmarks/sentence_splitters.py scores every splitter on.
BRANCH_CASES: list[tuple[str, list[str]]] = [
    # yes: single "." after a digit, after a closer, after a word ending like an abbreviation ("ma-st")
    ("Read chapter 1. The whale comes later.", ["Read chapter 1.", "The whale comes later."]),
    ("It rained (see below). Then it snowed.", ["It rained (see below).", "Then it snowed."]),
    ("He climbed the mast. Then he fell.", ["He climbed the mast.", "Then he fell."]),
    # no: upper-case abbreviation after a space; "!" before a lowercase word or a dash
    ("We met MR. JONES there. He left.", ["We met MR. JONES there.", "He left."]),
    ("Oh! he cried. Stop!\u2014she said. Why?", ["Oh! he cried.", "Stop!\u2014she said.", "Why?"]),
    # _is_boundary: abbreviation at the very start or behind openers, non-ASCII letter before ".", "!" after CJK
    ("Mr. Smith left. He wept.", ["Mr. Smith left.", "He wept."]),
    ('("Mr. Smith") left. He wept.', ['("Mr. Smith") left.', "He wept."]),
    ("Il est all\u00e9. Puis parti.", ["Il est all\u00e9.", "Puis parti."]),
    ("\u597d! ok", ["\u597d!", "ok"]),
]


@pytest.mark.parametrize("text,expected", BRANCH_CASES, ids=[c[0][:30] for c in BRANCH_CASES])
def test_branch_cases(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_branch_cases_reach_every_branch() -> None:
    kinds = {m.lastgroup for text, _ in BRANCH_CASES for m in _CANDIDATE.finditer(text)}
    assert kinds == {"yes", "no", None}


def test_no_text_lost() -> None:
    text = "Mr. Ahab? Aye. He is gone... Where to?! Nobody knows.Right. 3.5 leagues off, e.g. near St. Helena."
    out = split_sentences(text)
    assert "".join(out).replace(" ", "") == text.replace(" ", "")
    assert all(s == s.strip() and s for s in out)


def test_real_text_sentence_sizes(sample_dir) -> None:
    # On real prose, sentences should be sentence-sized: no giant run-ons, few fragments.
    with gzip.open(sample_dir / "corpus" / "mobydick.jsonl.gz", "rt", encoding="utf-8") as f:
        text = json.loads(f.readline())["text"] + " " + json.loads(f.readline())["text"]
    sents = split_sentences(text)
    words = [len(s.split()) for s in sents]
    assert len(sents) > 50
    assert max(words) < 300
    assert sum(w <= 1 for w in words) / len(words) < 0.1
