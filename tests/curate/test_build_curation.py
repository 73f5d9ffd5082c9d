"""Curation inside the build (the plain loop; tests/curate/test_build_curation_ray.py holds Ray to it):
dedup's decision and the mix draw leave the pool and the instances as a build of what they keep, every removed
document is a line of OUTPUT/reports/dropped.jsonl and the manifest's counts are those lines, decontamination and
language ID work through the read pass, and a build without curation is the build it always was."""
from __future__ import annotations

import dataclasses
import gzip
import json
import random
import shutil
from collections import Counter

import pytest
from _curate_docs import REPO, TASKS, need_shared, passages, plant

from corpus.create_instances import InstanceConfig
from curate import CurateConfig, DecontaminationConfig, DedupConfig, LanguageConfig, MixConfig
from pipeline import BuildConfig, build

VOCAB = REPO / "data" / "sample" / "reference" / "bert-base-uncased-vocab.txt"
INST = InstanceConfig(max_seq_length=64, max_predictions_per_seq=10)


def write(path, docs) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t, _ in docs))
    return str(path)


def cfg(inputs, out, **curate) -> BuildConfig:
    return BuildConfig(inputs=tuple(inputs), output=str(out), dupe_factor=2, num_shards=2, pool_tokens=20_000,
                       vocab=str(VOCAB), instances=INST, curate=CurateConfig(**curate))


def report(out) -> list[dict]:
    return [json.loads(line) for line in open(out / "reports" / "dropped.jsonl")]


def shard_bytes(m) -> list[bytes]:
    return [open(s.url, "rb").read() for s in m.shards]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """600 passages of Moby Dick and the Psalms' commentary with 25 exact and 25 near (~0.9 Jaccard) copies planted,
    spread over two input files (so copies fall within a file and across files)."""
    docs, pairs = plant(passages(["mobydick", "mhcc"], n_words=200, per_corpus=300), 25, 25, seed=7)
    d = tmp_path_factory.mktemp("planted")
    files = [write(d / "in" / "one.jsonl", docs[::2]), write(d / "in" / "two.jsonl", docs[1::2])]
    return d, files, docs, pairs


def test_near_dedup_keeps_one_of_each_planted_pair_and_builds_what_it_keeps(planted):
    d, files, docs, pairs = planted
    m = build(cfg(files, d / "near", dedup=DedupConfig(mode="near")))
    lines = report(d / "near")
    gone = {x["id"]: x for x in lines}
    assert len(gone) == len(lines)  # one line per removed document
    one = [p for p in pairs if (p[0] in gone) != (p[1] in gone)]
    assert len(one) >= 0.95 * len(pairs)
    planted_ids = {i for p in pairs for i in p[:2]}
    distinct = [i for i, _, _ in docs if i not in planted_ids]
    assert sum(i not in gone for i in distinct) >= 0.99 * len(distinct)
    assert all(x["duplicate_of"] not in gone for x in lines)  # every duplicate points at a kept document
    assert {x["source"] for x in lines} <= set(files)
    by_reason = Counter(x["reason"] for x in lines)
    assert m.dropped == dict(by_reason) and by_reason["exact_duplicate"] >= 25 and by_reason["near_duplicate"] >= 23
    assert m.curation["reports"]["dropped"] == {"file": "reports/dropped.jsonl", "lines": len(lines),
                                                "by_reason": dict(sorted(by_reason.items()))}
    # The pool and the instances are those of a build of the kept documents alone, byte for byte.
    kept = [write(d / "kept" / "in" / f.rsplit("/", 1)[1], [x for x in docs[k::2] if x[0] not in gone])
            for k, f in enumerate(files)]
    ref = build(dataclasses.replace(cfg(kept, d / "kept" / "out"), inputs=tuple(kept)))
    assert shard_bytes(m) == shard_bytes(ref)
    assert dataclasses.replace(m.totals, dropped=()) == ref.totals and m.random_pool == ref.random_pool


def test_exact_dedup_drops_only_the_exact_copies(planted):
    d, files, docs, pairs = planted
    m = build(cfg(files, d / "exact", dedup=DedupConfig(mode="exact")))
    lines = report(d / "exact")
    assert m.dropped == {"exact_duplicate": 25} == Counter(x["reason"] for x in lines)
    assert {x["id"] for x in lines} | {x["duplicate_of"] for x in lines} == {i for p in pairs[:25] for i in p[:2]}


def test_mix_weights_repeat_and_draw_documents_and_the_manifest_says_the_shares(tmp_path):
    """a x2, b x0.5, c unnamed (x1): asked and made token shares within 1%; a's documents get twice the passes
    (pairs of their own), b's draw leaves half out of the pool and the instances, reported as ``mix``."""
    need_shared()
    docs = passages(["austen", "mobydick", "webbible"], n_words=100, per_corpus=700)
    by = {s: [x for x in docs if x[2] == f"corpora/{s}"] for s in ("austen", "mobydick", "webbible")}
    a, b, c = (write(tmp_path / "in" / n / "part.jsonl", by[s]) for n, s in
               (("a", "austen"), ("b", "mobydick"), ("c", "webbible")))
    folder = tmp_path / "in"
    mix = MixConfig(weights=((str(folder / "a"), 2.0), (str(folder / "b"), 0.5)))
    m = build(cfg([a, b, c], tmp_path / "mixed", mix=mix))
    plain = build(cfg([a, b, c], tmp_path / "plain"))
    shares = m.curation["mix"]
    assert set(shares) == {str(folder / "a"), str(folder / "b"), "(inputs no SOURCE names)"}
    for s in shares.values():
        assert abs(s["share"] - s["asked_share"]) < 0.01, shares
    assert shares[str(folder / "a")]["documents_made"] == 2 * shares[str(folder / "a")]["documents"]
    lines = report(tmp_path / "mixed")
    assert {x["reason"] for x in lines} == {"mix"} and {x["source"] for x in lines} == {b}
    assert m.dropped == {"mix": len(lines)} and 0.4 < len(lines) / len(by["mobydick"]) < 0.6
    assert all(x["detail"] == "weight 0.5" for x in lines)
    assert m.totals.documents == plain.totals.documents - len(lines)
    # a's copies: twice the passes of a's documents (each copy its own draws): instances follow the tokens made
    ratio = m.totals.instances / plain.totals.instances
    expect = sum(s["tokens_made"] for s in shares.values()) / sum(s["tokens"] for s in shares.values())
    assert abs(ratio - expect) < 0.05, (ratio, expect)


def _with_evals(n_docs: int = 120):
    """Passages of Austen, every fourth with an evaluation sentence of the shared tasks planted between two of its
    sentences."""
    need_shared()
    with gzip.open(TASKS / "rt_sentiment.jsonl.gz", "rt", encoding="utf-8") as f:
        evals = [r["text"] for r in map(json.loads, f) if len(r["text"].split()) >= 15]
    evals = random.Random(1).sample(evals, n_docs // 4)
    out, planted_ids = [], {}
    for i, (doc_id, text, src) in enumerate(passages(["austen"], n_words=150, per_corpus=n_docs)):
        cut = text.find(". ", len(text) // 3) + 2
        if i % 4 == 0 and cut > 1:
            ev = evals[i // 4][0].upper() + evals[i // 4][1:].rstrip(" .") + "."
            text = f"{text[:cut]}{ev} {text[cut:]}"
            planted_ids[doc_id] = ev
        out.append((doc_id, text, src))
    return out, planted_ids


@pytest.mark.parametrize("mode", ["drop", "cut"])
def test_planted_evaluation_sentences_are_found_by_the_build(tmp_path, mode):
    docs, planted_ids = _with_evals()
    corpus = write(tmp_path / "in.jsonl", docs)
    dc = DecontaminationConfig(paths=(str(TASKS / "rt_sentiment.jsonl.gz"),), mode=mode)
    m = build(cfg([corpus], tmp_path / mode, decontamination=dc))
    plain = build(cfg([corpus], tmp_path / "plain"))
    lines = report(tmp_path / mode)
    ev = m.curation["eval_sets"]
    assert ev["texts"] > 10_000 and list(ev["files"]) == [str(TASKS / "rt_sentiment.jsonl.gz")]
    if mode == "drop":
        assert {x["id"] for x in lines} == set(planted_ids) and m.dropped == {"contaminated": len(planted_ids)}
        assert all("rt_sentiment" in x["detail"] for x in lines)
        assert m.totals.documents == plain.totals.documents - len(planted_ids)
    else:
        edited = [json.loads(x) for x in open(tmp_path / mode / "reports" / "edited.jsonl")]
        assert not lines and {x["id"] for x in edited} == set(planted_ids)
        # the planted sentence (two, where the review's text is two sentences), and nothing else
        assert all(x["reason"] == "contaminated_cut" and x["detail"].split()[1] in "12" for x in edited)
        assert m.curation["reports"]["edited"]["lines"] == len(planted_ids)
        assert m.totals.documents == plain.totals.documents and m.totals.tokens < plain.totals.tokens


def test_a_changed_evaluation_set_is_another_build(tmp_path):
    docs, _ = _with_evals(40)
    corpus = write(tmp_path / "in.jsonl", docs)
    evals = tmp_path / "eval.jsonl"
    shutil.copyfile(TASKS / "wnut16_ner.jsonl.gz", tmp_path / "eval.jsonl.gz")
    with gzip.open(tmp_path / "eval.jsonl.gz", "rt", encoding="utf-8") as f:
        evals.write_text("".join(f.readlines()[:300]))
    c = cfg([corpus], tmp_path / "out", decontamination=DecontaminationConfig(paths=(str(evals),)))
    first = build(c)
    assert build(c).sha256 == first.sha256  # unchanged: already complete
    evals.write_text(evals.read_text() + json.dumps({"tokens": "a new evaluation sentence with at least thirteen "
                                                              "words in it for the index".split()}) + "\n")
    with pytest.raises(ValueError, match="different config"):
        build(c)


def test_language_id_in_the_read_pass_drops_the_other_languages(tmp_path):
    with gzip.open(REPO / "data" / "sample" / "other" / "vimtutor.excerpts.jsonl.gz", "rt", encoding="utf-8") as f:
        vim = [json.loads(line) for line in f]
    english = passages(["mobydick"], n_words=150, per_corpus=60)
    corpus = write(tmp_path / "in.jsonl", english + [(v["id"], v["text"], "vim") for v in vim])
    m = build(cfg([corpus], tmp_path / "out", language=LanguageConfig(languages=("en",))))
    lines = report(tmp_path / "out")
    assert {x["id"] for x in lines} == {v["id"] for v in vim if v["lang"] != "en"}
    assert m.dropped == {"language": len(lines)} and m.totals.documents == len(english) + len(vim) - len(lines)
    # hand-checked: the German introduction is named German
    lang, p = next(x for x in lines if x["id"] == "vimtutor.de:0")["detail"].split()
    assert lang == "de" and float(p) >= 0.9


def test_without_curation_the_build_is_the_one_it_always_was(tmp_path, planted):
    d, files, _, _ = planted
    c = cfg(files[:1], tmp_path / "out")
    assert "curate" not in c.identity()  # the same config hash as before curation existed
    m = build(c)
    assert m.curation is None and "curation" not in json.load(open(tmp_path / "out" / "manifest.json"))
    assert not (tmp_path / "out" / "reports").exists()


def test_the_drop_set_is_found_by_id_even_when_hashes_collide(monkeypatch):
    import numpy as np
    import pyarrow as pa

    from pipeline.curation import stage

    drops = pa.table({"id": ["b", "d", "a"], "reason": ["exact_duplicate", "near_duplicate", "exact_duplicate"],
                      "duplicate_of": ["x", "y", "x"]})
    want = [("exact_duplicate", "x"), None, ("near_duplicate", "y"), None, ("exact_duplicate", "x")]
    assert stage.DropSet(drops).find(["a", "c", "d", "e", "b"]) == want
    monkeypatch.setattr(stage, "_hashes", lambda ids: np.zeros(len(ids), np.uint64))  # every id the same hash
    assert stage.DropSet(drops).find(["a", "c", "d", "e", "b"]) == want


@pytest.fixture(scope="module")
def read_docs():
    need_shared()
    return passages(["mobydick", "austen"], n_words=150, per_corpus=3)


FRENCH = ("Il était une fois, dans un petit village au bord de la mer, une vieille femme qui vivait seule avec son"
          " chat. Chaque matin, elle descendait au port pour acheter du poisson frais et parler avec les pêcheurs du"
          " temps qu'il ferait. Les enfants du village l'aimaient beaucoup, car elle leur racontait des histoires de"
          " marins et de tempêtes. Un jour, un bateau inconnu arriva dans le port. Personne ne savait d'où il venait.")


def test_the_read_pass_forms_unit_reports_and_signature_columns(read_docs):
    """What the build's read pass gets: a filter that keeps rows and adds one report row per unit that lost
    documents (their counts and lines), and the signature operator's columns, which the global step reads back."""
    import pyarrow as pa

    from corpus.sentences import split_sentences
    from curate.dedup import Signatures
    from curate.language import LanguageFilter
    from pipeline.curation.filters import SignatureColumns, UnitReports

    rows = pa.table({"unit": ["u1", "u1", "u2", "u2", "u1"], "ord": [0, 1, 0, 1, 2],
                     "id": ["en1", "fr", "en2", None, None],
                     "lines": [split_sentences(read_docs[1][1]), [FRENCH], split_sentences(read_docs[2][1]), None,
                               None],
                     "report": [None, None, None, '{"read_documents": 1}', '{"read_documents": 2}']})
    out = UnitReports(lambda: LanguageFilter(LanguageConfig(languages=("en",))))(rows)
    assert out.schema == rows.schema
    assert sorted(i for i in out["id"].to_pylist() if i) == ["en1", "en2"]
    added = [json.loads(r) for u, i, r in zip(out["unit"].to_pylist(), out["id"].to_pylist(),
                                              out["report"].to_pylist(), strict=False) if i is None and "dropped" in r]
    assert len(added) == 1 and added[0]["dropped"] == {"language": 1}
    assert added[0]["removed"][0]["id"] == "fr" and added[0]["removed"][0]["detail"].startswith("fr ")
    assert {r for r in out["report"].to_pylist() if r and "read_documents" in r} == {'{"read_documents": 1}',
                                                                                   '{"read_documents": 2}'}
    cfg = DedupConfig(mode="near")
    with_sigs = SignatureColumns(cfg)(rows)
    assert with_sigs["content"].null_count == 2 and with_sigs["id"].equals(rows["id"])  # the report rows, in place
    docs_only = rows.filter(rows["id"].is_valid())  # curate's contract: documents in, one signature row each
    got = with_sigs.filter(with_sigs["id"].is_valid()).select(["id", "content", "sig"])
    assert got.equals(Signatures(cfg)(docs_only))
