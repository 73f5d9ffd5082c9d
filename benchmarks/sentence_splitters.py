"""Sentence splitters side by side: speed (MB/s of raw text, one process) and quality on hand-labelled cases.

    python benchmarks/sentence_splitters.py [--extra-path DIR] [--repeats 3]

Candidates: ours (corpus/sentences.py), a plain regex, blingfire, and NLTK Punkt (untrained), syntok and pysbd
when importable (``--extra-path`` adds a folder such as a ``pip install --target`` dir to sys.path; they are not
project dependencies). Quality: exact-match rate and boundary F1 on the labelled cases of
tests/corpus/test_sentences.py. Speed: Moby Dick and Austen from ../shared/data/corpora, per document.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPORA = REPO.parent / "shared" / "data" / "corpora"

Splitter = Callable[[str], list[str]]


def load_cases() -> list[tuple[str, list[str]]]:
    spec = importlib.util.spec_from_file_location("_cases", REPO / "tests" / "corpus" / "test_sentences.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CASES


def candidates() -> dict[str, Splitter]:
    from corpus.sentences import split_sentences

    out: dict[str, Splitter] = {"ours (rules)": split_sentences}
    rx = re.compile(r"(?<=[.!?])\s+")
    out["plain regex"] = lambda t: [s for s in rx.split(t.strip()) if s]
    try:
        import blingfire

        out["blingfire"] = lambda t: [s for s in blingfire.text_to_sentences(t).split("\n") if s] if t.strip() else []
    except ImportError:
        print("blingfire: not installed")
    try:
        from nltk.tokenize.punkt import PunktSentenceTokenizer

        punkt = PunktSentenceTokenizer()
        out["nltk punkt (untrained)"] = punkt.tokenize
    except ImportError:
        print("nltk: not importable (use --extra-path)")
    try:
        from syntok import segmenter

        def syntok_split(t: str) -> list[str]:
            return [
                "".join(tok.spacing + tok.value for tok in sent).strip()
                for para in segmenter.analyze(t)
                for sent in para
            ]

        out["syntok"] = syntok_split
    except ImportError:
        print("syntok: not importable (use --extra-path)")
    try:
        import pysbd

        seg = pysbd.Segmenter(language="en", clean=False)
        out["pysbd"] = lambda t: [s.strip() for s in seg.segment(t) if s.strip()]
    except ImportError:
        print("pysbd: not importable (use --extra-path)")
    return out


def _boundaries(sents: list[str]) -> set[int]:
    # Boundaries as offsets in the text with all whitespace removed: independent of how each tool trims spaces.
    pos, out = 0, set()
    for s in sents[:-1]:
        pos += len(re.sub(r"\s+", "", s))
        out.add(pos)
    return out


def quality(split: Splitter, cases: list[tuple[str, list[str]]]) -> tuple[float, float, list[str]]:
    tp = fp = fn = exact = 0
    failed = []
    for text, gold in cases:
        got = split(text)
        norm = [re.sub(r"\s+", " ", s).strip() for s in got]
        exact += norm == gold
        if norm != gold:
            failed.append(text[:40])
        g, p = _boundaries(gold), _boundaries(norm)
        tp += len(g & p)
        fp += len(p - g)
        fn += len(g - p)
    f1 = 2 * tp / max(1, 2 * tp + fp + fn)
    return exact / len(cases), f1, failed


def load_docs(name: str) -> list[str]:
    with gzip.open(CORPORA / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def speed(split: Splitter, docs: list[str], repeats: int, max_bytes: int | None = None) -> tuple[float, int]:
    if max_bytes is not None:  # the slowest tools run on a prefix only
        kept, total = [], 0
        for d in docs:
            kept.append(d[: max(0, max_bytes - total)])
            total += len(kept[-1])
            if total >= max_bytes:
                break
        docs = kept
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    best = float("inf")
    n = 0
    for _ in range(repeats):
        # CPU time of this process: the figure per CPU, and steadier than wall time on a shared machine.
        t = time.process_time()
        n = sum(len(split(d)) for d in docs)
        best = min(best, time.process_time() - t)
    return nbytes / 1e6 / best, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extra-path", action="append", default=[])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    for p in args.extra_path:
        sys.path.append(p)
    cases = load_cases()
    corpora = {name: load_docs(name) for name in ("mobydick", "austen")}
    rows = []
    for name, split in candidates().items():
        exact, f1, failed = quality(split, cases)
        slow = name in ("pysbd", "syntok")
        speeds = {c: speed(split, docs, 1 if slow else args.repeats, 300_000 if name == "pysbd" else None)
                  for c, docs in corpora.items()}
        rows.append((name, exact, f1, speeds, failed))
    ours = rows[0][3]["mobydick"][0]
    print(f"{len(cases)} labelled cases; speed = MB of UTF-8 text per CPU-second, one process, best of {args.repeats}"
          " (pysbd: first 300 kB only)")
    print(f"{'splitter':24s} {'exact':>6s} {'bF1':>6s} {'moby MB/s':>10s} {'austen MB/s':>12s} {'vs ours':>8s} "
          f"{'moby sents':>10s}")
    for name, exact, f1, sp, _ in rows:
        m, a = sp["mobydick"], sp["austen"]
        print(f"{name:24s} {exact:6.2f} {f1:6.3f} {m[0]:10.2f} {a[0]:12.2f} {m[0] / ours:8.2f} {m[1]:10d}")
    for name, *_, failed in rows:
        if failed:
            print(f"  {name} fails: " + " | ".join(repr(f) for f in failed))


if __name__ == "__main__":
    main()
