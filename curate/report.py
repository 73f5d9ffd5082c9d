"""What curation removed, as the build reports it: ``OUTPUT/reports/dropped.jsonl`` lines and counts by reason.

One JSON object per line per removed document, keys in a fixed order: ``id`` (the record's own id, or the build's
``<file>:<offset>``), ``source`` (the input), ``reason``, then ``duplicate_of`` (duplicates) and ``detail`` (what
was measured) when set. Edited documents (``--decontaminate-mode cut``) go to ``edited.jsonl`` in the same form.
The manifest's counts are ``counts`` of the same rows, so they equal the report's lines by construction.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator

import pyarrow as pa

DROPPED_FILE = "dropped.jsonl"
EDITED_FILE = "edited.jsonl"


def lines(tables: Iterable[pa.Table]) -> Iterator[str]:
    for t in tables:
        for row in t.to_pylist():
            yield json.dumps({k: v for k, v in row.items() if v is not None or k in ("id", "reason")},
                             ensure_ascii=False)


def counts(tables: Iterable[pa.Table]) -> dict[str, int]:
    c: Counter = Counter()
    for t in tables:
        c.update(t.column("reason").to_pylist())
    return dict(sorted(c.items()))
