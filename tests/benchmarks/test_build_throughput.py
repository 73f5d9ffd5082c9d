"""benchmarks/build_throughput.py's corpora, in a small form: N copies of real text with distinct ids and shuffled
sentences (no two copies alike), as folders, big .jsonl.gz files or plain files; the benchmark itself runs jobs on
Ray for minutes and is not part of the suite."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import build_throughput as bench  # noqa: E402


def _read(folder: Path) -> list[dict]:
    out = []
    for p in sorted(folder.rglob("*.jsonl*")):
        with (gzip.open(p, "rt") if p.suffix == ".gz" else open(p)) as f:
            out += [json.loads(line) for line in f]
    return out


@pytest.mark.slow  # ~40 s on an idle box (Heaps' law fitted per corpus made), minutes under load
def test_copies_have_their_own_ids_and_text(tmp_path, sample_dir):
    src = sample_dir / "corpus"
    one = _read(src)
    for compressed, scale, files in ((0, 3, 6), (2, 3, 2), (0, 9, 1)):
        dst = bench.make_corpus(src, scale, tmp_path / f"c{compressed}-{scale}", compressed)
        got = _read(dst)
        assert len(got) == scale * len(one) and len({r["id"] for r in got}) == len(got)
        assert len(list(dst.rglob("*.jsonl*"))) == files
        assert sorted(r["text"] for r in got if "#" not in r["id"]) == sorted(r["text"] for r in one)
        copy = {r["id"]: r["text"] for r in got if r["id"].endswith("#1")}
        texts = {r["id"] + "#1": r["text"] for r in one}
        assert copy.keys() == texts.keys() and sum(copy[k] != texts[k] for k in copy) > len(copy) // 2
        # about the same bytes of text, in another order, with new words: never the same text repeated
        assert abs(sum(map(len, copy.values())) / sum(map(len, texts.values())) - 1) < 0.01


@pytest.mark.slow
def test_copies_grow_the_vocabulary_as_heaps_law_says(tmp_path, sample_dir):
    # A repeated corpus adds no distinct word after its first copy (the tokenizer's word table stays warm); each
    # copy here adds the new words Heaps' law, fitted on the corpus, predicts that far into the text.
    from varied_text import WORD, Heaps

    src = sample_dir / "corpus"
    one = _read(src)
    fit = Heaps.of(r["text"] for r in one)
    assert 0.3 < fit.beta < 1.0 and fit.distinct > 1000
    got = _read(bench.make_corpus(src, 3, tmp_path / "c", 0))
    seen: set[str] = set()
    for k in range(3):
        before = len(seen)
        for r in got:
            if (k == 0 and "#" not in r["id"]) or r["id"].endswith(f"#{k}"):
                seen.update(WORD.findall(r["text"]))
        added = len(seen) - before
        expected = fit.distinct if k == 0 else fit.new_words(k)
        assert abs(added - expected) <= 0.02 * expected, (k, added, expected)
    assert fit.new_words(1) > fit.new_words(2) > 0  # sublinear growth: fewer new words further in
