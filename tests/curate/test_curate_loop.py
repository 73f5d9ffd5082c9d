"""The filter contract and the whole curation in one process: every document is kept or reported once, the report's
lines equal the counts, filters chain as row operators over the build's rows (``lines``, a report row)."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest
from _curate_docs import TASKS, need_shared, passages

from corpus.sentences import split_sentences
from curate import (
    CurateConfig,
    DecontaminationConfig,
    DedupConfig,
    LanguageConfig,
    MixConfig,
    QualityConfig,
    Rows,
    curate,
    split_rows,
)
from curate.contract import check_documents
from curate.decontaminate import build_index
from curate.eval_sets import eval_texts
from curate.language import LanguageFilter
from curate.quality import QualityFilter
from curate.report import counts, lines

FRENCH = ("Il était une fois, dans un petit village au bord de la mer, une vieille femme qui vivait seule avec son"
          " chat. Chaque matin, elle descendait au port pour acheter du poisson frais et parler avec les pêcheurs du"
          " temps qu'il ferait. Les enfants du village l'aimaient beaucoup, car elle leur racontait des histoires de"
          " marins et de tempêtes. Un jour, un bateau inconnu arriva dans le port. Personne ne savait d'où il venait.")


@pytest.fixture(scope="module")
def docs():
    need_shared()
    base = passages(["mobydick", "austen"], n_words=150, per_corpus=150)
    review = "The gorgeously elaborate continuation of ''The Lord of the Rings'' trilogy is so huge that a column of" \
             " words cannot adequately describe co writer/director Peter Jackson's expanded vision of J.R.R." \
             " Tolkien's Middle earth."
    extra = [("copy-of-first", base[20][1], base[20][2]), ("french", FRENCH, "corpora/french"),
             ("lists", "\n".join("• " + s for s in split_sentences(base[9][1])), "corpora/web"),
             ("leak", base[5][1] + " " + review, base[5][2])]
    return base + extra


def test_every_document_is_kept_or_reported_once_and_the_report_matches_the_counts(docs):
    cfg = CurateConfig(dedup=DedupConfig(mode="near"), decontamination=DecontaminationConfig(paths=(str(TASKS),)),
                       language=LanguageConfig(languages=("en",)), quality=QualityConfig(),
                       mix=MixConfig(weights=(("corpora/austen", 0.5),)))
    index = build_index(eval_texts(cfg.decontamination.paths), cfg.decontamination)
    t = pa.table({"id": [d[0] for d in docs], "text": [d[1] for d in docs], "source": [d[2] for d in docs]})
    out = curate([t.slice(0, 100), t.slice(100)], cfg, index)
    kept = [i for b in out.kept for i in b["id"].to_pylist()]
    dropped = [i for d in out.dropped for i in d["id"].to_pylist()]
    assert sorted(kept + dropped) == sorted(t["id"].to_pylist())
    reason = {r["id"]: r for d in out.dropped for r in d.to_pylist()}
    assert reason["french"]["reason"] == "language" and reason["french"]["detail"].startswith("fr ")
    assert reason["lists"]["reason"] == "quality:bullet_lines"
    assert reason["leak"]["reason"] == "contaminated" and "rt_sentiment" in reason["leak"]["detail"]
    first, copy = docs[20][0], "copy-of-first"
    gone = copy if copy > first else first
    assert reason[gone]["reason"] == "exact_duplicate" and reason[gone]["duplicate_of"] == min(first, copy)
    c = out.counts()
    assert c["mix"] > 30 and c == counts(out.dropped)
    report = [json.loads(line) for line in lines(out.dropped)]
    assert len(report) == sum(c.values()) and all(set(r) >= {"id", "reason", "source"} for r in report)
    assert "duplicate_of" not in reason["french"] or reason["french"]["duplicate_of"] is None
    assert not any("duplicate_of" in r for r in report if r["reason"] == "language")


def test_filters_chain_as_row_operators_over_documents_with_lines(docs):
    """Documents may carry their text as ``lines`` (the build's form); a second operator does not see the first
    one's dropped rows. Every row is a document: the contract knows no other rows."""
    rows = pa.table({"unit": ["u"] * 3, "id": ["en", "fr", "short"],
                     "lines": [split_sentences(docs[1][1]), [FRENCH], ["This line is far too short to keep."]]})
    check_documents(rows)
    lang = Rows(lambda: LanguageFilter(LanguageConfig(languages=("en",))))
    qual = Rows(lambda: QualityFilter(QualityConfig()))
    out = split_rows(qual(lang(rows)))
    assert out.kept["id"].to_pylist() == ["en"] and out.kept.column_names == rows.column_names
    assert {r["id"]: r["reason"] for r in out.dropped.to_pylist()} == {"fr": "language",
                                                                       "short": "quality:word_count"}


def test_documents_without_the_contracts_columns_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="no 'id' column"):
        check_documents(pa.table({"text": ["x"]}))
    with pytest.raises(ValueError, match="no 'text' .* or 'lines'"):
        check_documents(pa.table({"id": ["x"], "body": ["x"]}))
    with pytest.raises(ValueError, match="without an id"):
        check_documents(pa.table({"id": ["x", None], "text": ["x", "y"]}))


def test_off_by_default():
    assert not CurateConfig().enabled
    assert CurateConfig(dedup=DedupConfig(mode="exact")).enabled
