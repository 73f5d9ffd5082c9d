"""Fixtures shared by the job tests: tiny pre-training datasets made by the real builder (jobs.build_dataset)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MOBY = REPO / "data" / "sample" / "corpus" / "mobydick.jsonl.gz"


def _chapters(dest: Path, first: int, last: int) -> Path:
    """Moby Dick chapters [first, last) as a small JSON Lines input (chapter 0 is the Gutenberg header)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(MOBY, "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f if line.strip()]
    with gzip.open(dest, "wt", encoding="utf-8") as f:
        for doc in docs[first:last]:
            f.write(json.dumps(doc) + "\n")
    return dest


@pytest.fixture(scope="session")
def tiny_pretrain_data(tmp_path_factory) -> dict[str, str]:
    """{"train": URL, "eval": URL}: seq 64, a 600-entry trained vocab, 4 balanced shards; eval from other chapters
    with the train vocabulary. Built with --no-ray (the builder's plain loop over the same steps): fast, no Ray."""
    from jobs import build_dataset

    root = tmp_path_factory.mktemp("pretrain-data")
    common = ["--max-seq-length", "64", "--max-predictions-per-seq", "10", "--num-shards", "4", "--no-ray",
              "--log-level", "WARNING"]
    rc = build_dataset.main(["--input", str(_chapters(root / "raw" / "train.jsonl.gz", 1, 9)),
                             "--output", str(root / "train"), "--vocab-size", "600", "--dupe-factor", "2", *common])
    assert rc == 0
    rc = build_dataset.main(["--input", str(_chapters(root / "raw" / "eval.jsonl.gz", 9, 11)),
                             "--output", str(root / "eval"), "--vocab", str(root / "train" / "vocab.txt"),
                             "--dupe-factor", "1", *common])
    assert rc == 0
    return {"train": str(root / "train"), "eval": str(root / "eval")}
