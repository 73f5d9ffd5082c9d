"""benchmarks/build_throughput.py's corpora, in a small form: N copies of real text with distinct ids and shuffled
sentences (no two copies alike), as folders, big .jsonl.gz files or plain files; the benchmark itself runs jobs on
Ray for minutes and is not part of the suite."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import build_throughput as bench  # noqa: E402


def _read(folder: Path) -> list[dict]:
    out = []
    for p in sorted(folder.rglob("*.jsonl*")):
        with (gzip.open(p, "rt") if p.suffix == ".gz" else open(p)) as f:
            out += [json.loads(line) for line in f]
    return out


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
        assert all(len(copy[k]) == len(texts[k]) for k in copy)  # the same bytes of text, in another order
