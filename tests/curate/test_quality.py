"""The Gopher and C4 quality rules on the shared corpora (hand-checked drops and keeps) and on documents made to
fail one rule each."""
from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from _curate_docs import corpus, passages

from curate.quality import RULES, QualityConfig, QualityFilter

ALL = QualityFilter(QualityConfig())


def _run(f, texts):
    return f(pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": texts}))


@pytest.fixture(scope="module")
def shared():
    out = {}
    for name in ("austen", "mobydick", "mhcc", "tdavid", "webbible"):
        docs = corpus(name)
        r = ALL(pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs]}))
        out[name] = (len(docs), dict(zip(r.dropped["id"].to_pylist(), r.dropped["reason"].to_pylist(), strict=False)))
    return out


def test_novels_and_commentary_pass_every_rule(shared):
    for name in ("austen", "mobydick", "mhcc"):
        assert shared[name][1] == {}, name


def test_hand_checked_drops_of_the_shared_corpora(shared):
    tdavid, web = shared["tdavid"][1], shared["webbible"][1]
    # The Treasury of David quotes "{Mrs. Rogers.}": C4 takes a curly bracket for code (its known false positive
    # on literature), so that rule is not in the default set; its Psalm 119 volume is 262,883 words, past Gopher's
    # 100,000.
    assert "tdavid:ot24" not in tdavid and tdavid["tdavid:ot120"] == "quality:word_count"
    ot24 = [d for d in corpus("tdavid") if d["id"] == "tdavid:ot24"]
    c4 = _run(QualityFilter(QualityConfig(rules=("curly_bracket",))), [ot24[0]["text"]])
    assert c4.dropped["reason"].to_pylist() == ["quality:curly_bracket"]
    # The Bible blocks: Exodus repeats the tabernacle's instructions word for word (chapters 25-31 and 35-40);
    # ot19 is a 45-word fragment cut mid-sentence; ot34 a stitched fragment of one sentence.
    # Gopher's repetition thresholds (0.15 for 5-grams) drop Exodus; the default (0.30, moved to keep manuals) keeps
    # it
    assert "engWEB2015eb:ot2" not in web
    exodus = [d for d in corpus("webbible") if d["id"] == "engWEB2015eb:ot2"][0]["text"]
    gopher = _run(QualityFilter(QualityConfig(rules=("dup_ngrams",), max_dup_ngrams=0.15)), [exodus])
    assert gopher.dropped["reason"].to_pylist() == ["quality:dup_ngrams"]
    assert web["engWEB2015eb:ot19"] == "quality:word_count"
    assert web["engWEB2015eb:ot34"] == "quality:min_sentences"
    counts = Counter(web.values())
    assert set(counts) <= {"quality:dup_ngrams", "quality:word_count", "quality:min_sentences"}
    assert len(web) < 0.4 * shared["webbible"][0]


@pytest.fixture(scope="module")
def good() -> str:
    """A real 200-word passage of Moby Dick that passes every rule."""
    text = passages(["mobydick"], n_words=200, per_corpus=40)[30][1]
    assert not len(_run(ALL, [text]).dropped)
    return text


def _lines(text: str, n: int) -> list[str]:
    w = text.split()
    k = len(w) // n
    return [" ".join(w[i * k:(i + 1) * k]) for i in range(n)]


CASES = {
    "word_count": lambda g: " ".join(g.split()[:30]),
    "mean_word_length": lambda g: " ".join(["a", "b", "I", "so", "to", "of", "the"] * 30) + ".",
    "symbol_ratio": lambda g: g + " " + " ".join(["#tag"] * 25),
    "bullet_lines": lambda g: "\n".join("• " + ln for ln in _lines(g, 10)),
    "ellipsis_lines": lambda g: "\n".join(ln + "..." for ln in _lines(g, 10)),
    "alpha_words": lambda g: g + " " + " ".join(str(1000 + i) for i in range(120)),
    "stop_words": lambda g: " ".join(w for w in g.split() if w.lower() not in
                                     ("the", "be", "to", "of", "and", "that", "have", "with")),
    "dup_lines": lambda g: "\n".join(_lines(g, 4) * 3),
    "dup_paragraphs": lambda g: "\n\n".join(_lines(g, 4) * 3),
    "top_ngram": lambda g: g + " " + " ".join(["buy now"] * 60),
    "dup_ngrams": lambda g: g + " " + g,
    "lorem_ipsum": lambda g: g + " Lorem ipsum dolor sit amet.",
    "curly_bracket": lambda g: g + " function() { return 1; }",
    "min_sentences": lambda g: g.replace(".", ",").replace("!", ",").replace("?", ","),
    "line_punct": lambda g: "\n".join(ln.rstrip(".!?;,") for ln in _lines(g.replace(".", ""), 8)),
    "boilerplate_lines": lambda g: "\n".join([g, "We use cookies to improve your experience.", "Accept all cookies",
                                              "Subscribe to our newsletter", "Privacy Policy", "Log in"]),
}


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_drops_what_it_names(rule, good):
    assert rule in CASES
    out = _run(QualityFilter(QualityConfig(rules=(rule,))), [good, CASES[rule](good)])
    assert out.kept["id"].to_pylist() == ["d0"]
    assert out.dropped["reason"].to_pylist() == [f"quality:{rule}"]


def test_the_first_failing_rule_names_the_drop(good):
    # Fails symbol_ratio and curly_bracket: reported once, as the first in RULES order.
    out = _run(ALL, [good + " " + " ".join(["#x"] * 25) + " {"])
    assert out.dropped["reason"].to_pylist() == ["quality:symbol_ratio"] and len(out.dropped) == 1


def test_line_rules_leave_one_line_documents_alone(good):
    # Running text flattened to one line (our corpora) ending in a heading: no share of lines to judge.
    out = _run(ALL, [good.rstrip(".") + " CHAPTER IV"])
    assert not len(out.dropped)


def test_config_mistakes_say_the_fix():
    with pytest.raises(ValueError, match="quality rules gibberish"):
        QualityConfig(rules=("gibberish",))
