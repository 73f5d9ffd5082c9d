"""Real documents for the curation tests: the shared corpora (../shared/data/corpora) cut into passages of a fixed
number of words, and planted copies of some of them (exact, and near at a measured Jaccard of ~0.9)."""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from curate.words import ngrams, words

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"
CORPORA = SHARED / "corpora"
TASKS = SHARED / "tasks"


def need_shared() -> None:
    if not CORPORA.is_dir():
        pytest.skip(f"needs the shared corpora at {CORPORA}")


def corpus(name: str) -> list[dict]:
    need_shared()
    with gzip.open(CORPORA / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def passages(names: list[str], n_words: int = 200, per_corpus: int | None = None) -> list[tuple[str, str, str]]:
    """(id, text, source) of consecutive n_words-word passages of each corpus's documents (the last, shorter piece
    of each document dropped), at most per_corpus per corpus."""
    out = []
    for name in names:
        got = 0
        for doc in corpus(name):
            w = doc["text"].split()
            for i in range(0, len(w) - n_words + 1, n_words):
                if per_corpus is not None and got >= per_corpus:
                    break
                out.append((f"{doc['id']}@{i}", " ".join(w[i:i + n_words]), f"corpora/{name}"))
                got += 1
    return out


def jaccard(a: str, b: str, k: int = 5) -> float:
    g, off = ngrams(words([a, b]), k, short=True)
    x, y = set(g[off[0]:off[1]].tolist()), set(g[off[1]:off[2]].tolist())
    return len(x & y) / len(x | y)


def plant(docs: list[tuple[str, str, str]], n_exact: int, n_near: int, seed: int = 0):
    """docs plus copies of randomly chosen ones: exact copies, and near copies with two words replaced far apart
    (~0.9 Jaccard on 5-word shingles at 200 words). Returns (documents, [(original id, copy id, jaccard)])."""
    rng = random.Random(seed)
    chosen = rng.sample(range(len(docs)), n_exact + n_near)
    out, pairs = list(docs), []
    for k, i in enumerate(chosen):
        doc_id, text, source = docs[i]
        if k < n_exact:
            copy = text
        else:
            w = text.split()
            third = len(w) // 3
            for j in (rng.randrange(5, third), rng.randrange(2 * third, len(w) - 5)):
                w[j] = rng.choice(["lantern", "harbour", "quietly", "seventeen", "copper"])
            copy = " ".join(w)
        copy_id = f"planted-{k:04d}"
        out.append((copy_id, copy, source))
        pairs.append((doc_id, copy_id, jaccard(text, copy)))
    rng.shuffle(out)
    return out, pairs


def table(docs: list[tuple[str, str, str]]) -> pa.Table:
    return pa.table({"id": [d[0] for d in docs], "text": [d[1] for d in docs], "source": [d[2] for d in docs]})


def batches(t: pa.Table, sizes: list[int]) -> list[pa.Table]:
    """t cut into consecutive batches of the given sizes (cycled)."""
    out, start, i = [], 0, 0
    while start < len(t):
        n = sizes[i % len(sizes)]
        out.append(t.slice(start, n))
        start += n
        i += 1
    return out


def shuffled(t: pa.Table, seed: int) -> pa.Table:
    return t.take(pa.array(np.random.default_rng(seed).permutation(len(t))))
