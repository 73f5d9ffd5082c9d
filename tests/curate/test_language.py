"""Language identification on real text: every document of the five shared English corpora is kept with
``--languages en``; Vim's tutorial in 18 other languages (data/sample/other) is dropped, each excerpt named by its
language; the model is the one inside the installed package."""
from __future__ import annotations

import gzip
import json
from collections import Counter

import pyarrow as pa
import pytest
from _curate_docs import REPO, corpus

from curate.language import LanguageConfig, LanguageFilter, identify, known_languages, sample

EXCERPTS = REPO / "data" / "sample" / "other" / "vimtutor.excerpts.jsonl.gz"
ENGLISH = LanguageFilter(LanguageConfig(languages=("en",)))


@pytest.fixture(scope="module")
def excerpts() -> list[dict]:
    with gzip.open(EXCERPTS, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_the_five_english_corpora_are_kept_whole():
    for name in ("austen", "mobydick", "mhcc", "tdavid", "webbible"):
        docs = corpus(name)
        out = ENGLISH(pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs]}))
        assert len(out.kept) == len(docs), (name, out.dropped.to_pylist()[:3])


def test_other_languages_are_dropped_and_named(excerpts):
    out = ENGLISH(pa.table({"id": [e["id"] for e in excerpts], "text": [e["text"] for e in excerpts]}))
    assert not len(out.kept)
    said = dict(zip(out.dropped["id"].to_pylist(), out.dropped["detail"].to_pylist(), strict=False))
    right = [e for e in excerpts if said[e["id"]].split()[0] == e["lang"]]
    assert len(right) >= 0.9 * len(excerpts), Counter((e["lang"], said[e["id"]].split()[0]) for e in excerpts)
    # hand-checked: the German introduction ("Vim ist ein sehr mächtiger Editor ...") is German, confidently
    lang, p = identify(next(e["text"] for e in excerpts if e["id"] == "vimtutor.de:0"))
    assert lang == "de" and p > 0.9


def test_keeping_several_languages(excerpts):
    keep = LanguageFilter(LanguageConfig(languages=("en", "de", "fr")))
    out = keep(pa.table({"id": [e["id"] for e in excerpts], "text": [e["text"] for e in excerpts]}))
    assert {i.split(":")[0] for i in out.kept["id"].to_pylist()} == {"vimtutor.de", "vimtutor.fr"}


def test_text_with_nothing_to_read_is_dropped_as_undetermined():
    out = ENGLISH(pa.table({"id": ["blank", "digits"], "text": ["   \n ", "12345 67890 42 1999 2000"]}))
    assert out.dropped.to_pylist()[0]["detail"] == "und 0.00" and len(out.dropped) == 2


def test_a_long_document_is_sampled_from_start_to_end():
    text = "a" * 5000 + "b" * 5000 + "c" * 5000
    s = sample(text, 4000)
    assert len(s) == 4000 + 3 and s.startswith("a") and "b" in s and s.endswith("c")
    assert sample("short", 4000) == "short"


def test_the_model_ships_in_the_package_and_knows_176_languages():
    assert len(known_languages()) == 176 and {"en", "de", "zh", "sw"} <= known_languages()


@pytest.mark.parametrize("kw, needle", [({"languages": ("english",)}, "not an ISO 639 code"),
                                        ({"languages": ("xx",)}, "does not know xx"),
                                        ({"languages": ("en",), "threshold": 1.5}, "--language-threshold 1.5")])
def test_config_mistakes_say_the_fix(kw, needle):
    with pytest.raises(ValueError, match=needle):
        LanguageConfig(**kw)
