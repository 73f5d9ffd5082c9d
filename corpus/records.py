"""Read labelled task data from any fsspec URL into plain Python records: fine-tuning's task files, and the
evaluation sets the build decontaminates against (``curate.eval_sets``), one reader for both.

Formats, chosen from the file name (compression suffixes .gz/.bz2/.xz/.zst are looked through) or forced with
``fmt``: JSON Lines (``.jsonl``, ``.ndjson``), JSON (a list of records, or SQuAD v1.1 ``{"data": [...]}``),
CSV / TSV, Parquet, and CoNLL-style tagging files (``.conll``, ``.bio``, ``.iob``: token and tag per line, whitespace
separated, the tag in the last column, a blank line between sentences, ``-DOCSTART-`` skipped). A ``.txt`` file says
nothing of its layout: it is refused unless the format is given (``--data-format conll``), never parsed as CoNLL.

Every reader returns ``list[dict]`` so the task-specific extraction (``finetuning.examples``) sees one shape.
``finetuning.records`` re-exports this module (the fine-tuning package's name for it).
Task files are small next to pre-training corpora, so reading them whole is the simple and honest choice.
"""
from __future__ import annotations

import csv
import io
import json
import logging
from typing import Any

import fsspec
import numpy as np

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "json", "csv", "tsv", "parquet", "conll")
_COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".zstd")
_BY_SUFFIX = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet",
    ".pq": "parquet", ".conll": "conll", ".bio": "conll", ".iob": "conll",
}


def record_format(url: str) -> str:
    """The format implied by ``url``'s suffix, looking through one compression suffix."""
    name = url.split("?", 1)[0].rstrip("/").lower()
    for comp in _COMPRESSIONS:
        if name.endswith(comp):
            name = name[: -len(comp)]
            break
    for suffix, fmt in _BY_SUFFIX.items():
        if name.endswith(suffix):
            return fmt
    raise ValueError(
        f"cannot tell the format of {url!r} from its name; name it .jsonl/.json/.csv/.tsv/.parquet/.conll "
        f"(optionally .gz) or give the format (jobs/finetune.py --data-format: one of {', '.join(FORMATS)}; "
        "conll for token-and-tag lines)"
    )


def _open_text(url: str, storage_options: dict | None) -> io.TextIOBase:
    # compression="infer" reads .gz/.bz2/.xz/.zst by extension, locally and on object stores alike.
    return fsspec.open(url, "rt", encoding="utf-8", compression="infer", **(storage_options or {})).open()


def read_records(url: str, fmt: str | None = None, storage_options: dict | None = None) -> list[dict[str, Any]]:
    """All records of one task file (a file without any is an error). SQuAD JSON is flattened to one record per
    question (see ``read_squad``)."""
    records = _read_records(url, fmt, storage_options)
    if not records:
        raise ValueError(f"{url} holds no records (an empty file?): give a file with one example per line or row")
    return records


def _read_records(url: str, fmt: str | None, storage_options: dict | None) -> list[dict[str, Any]]:
    fmt = fmt or record_format(url)
    if fmt not in FORMATS:
        raise ValueError(f"unknown data format {fmt!r} for {url}; use one of {', '.join(FORMATS)}")
    try:
        if fmt == "parquet":
            return _read_parquet(url, storage_options)
        with _open_text(url, storage_options) as f:
            if fmt == "jsonl":
                return _read_jsonl(f, url)
            if fmt == "json":
                return _read_json(f, url)
            if fmt in ("csv", "tsv"):
                return list(csv.DictReader(f, delimiter="\t" if fmt == "tsv" else ","))
            return read_conll(f, url)
    except FileNotFoundError as e:
        raise ValueError(f"task data file not found: {url}") from e


def _read_jsonl(f: io.TextIOBase, url: str) -> list[dict[str, Any]]:
    records = []
    for lineno, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{url}: line {lineno} is not valid JSON ({e})") from e
        if not isinstance(rec, dict):
            raise ValueError(f"{url}: line {lineno} is a JSON {type(rec).__name__}, expected an object per line")
        records.append(rec)
    return records


def _read_json(f: io.TextIOBase, url: str) -> list[dict[str, Any]]:
    text = f.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        # Many ".json" task files are really JSON Lines.
        return _read_jsonl(io.StringIO(text), url)
    if isinstance(doc, dict) and isinstance(doc.get("data"), list):
        return flatten_squad(doc, url)
    if isinstance(doc, list) and all(isinstance(r, dict) for r in doc):
        return doc
    raise ValueError(f"{url}: expected a list of records or SQuAD v1.1 JSON ({{'data': [...]}})")


def flatten_squad(doc: dict, url: str = "<squad>") -> list[dict[str, Any]]:
    """SQuAD v1.1 -> one record per question: id, context, question, answers [{"text", "answer_start"}]."""
    records = []
    for article in doc["data"]:
        for para in article.get("paragraphs", []):
            context = para["context"]
            for qa in para.get("qas", []):
                answers = qa.get("answers", [])
                if not answers:
                    raise ValueError(f"{url}: question {qa.get('id')!r} has no answers (SQuAD v2 is not supported)")
                records.append({"id": str(qa["id"]), "context": context, "question": qa["question"],
                                "answers": [{"text": a["text"], "answer_start": int(a["answer_start"])}
                                            for a in answers]})
    return records


def _read_parquet(url: str, storage_options: dict | None) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb", **(storage_options or {})) as f:
        table = pq.read_table(f)
    return table.to_pylist()


def read_conll(f: io.TextIOBase, url: str = "<conll>") -> list[dict[str, Any]]:
    """CoNLL-style tagging: ``token ... tag`` per line, blank line between sentences -> {"tokens", "tags"}."""
    records: list[dict[str, Any]] = []
    tokens: list[str] = []
    tags: list[str] = []
    for lineno, line in enumerate(f, 1):
        parts = line.split()
        if not parts:
            if tokens:
                records.append({"tokens": tokens, "tags": tags})
                tokens, tags = [], []
            continue
        if parts[0] == "-DOCSTART-":
            continue
        if len(parts) < 2:
            raise ValueError(f"{url}: line {lineno} has a token but no tag ({line.strip()!r}); "
                             "CoNLL lines are 'token [other columns] tag'")
        tokens.append(parts[0])
        tags.append(parts[-1])
    if tokens:
        records.append({"tokens": tokens, "tags": tags})
    return records


def split_train_eval(records: list[dict], eval_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """A seeded split for tasks shipped without one: permute row indices with ``default_rng(seed)``; the first
    ``round(n * eval_fraction)`` permuted rows are evaluation, the rest training (both keep file order)."""
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval fraction must be in (0, 1), e.g. 0.1 for a 90/10 split; got {eval_fraction}")
    n = len(records)
    n_eval = int(round(n * eval_fraction))
    if n_eval == 0 or n_eval == n:
        raise ValueError(f"an eval fraction of {eval_fraction} leaves an empty split of {n} records")
    perm = np.random.default_rng(seed).permutation(n)
    eval_idx = np.sort(perm[:n_eval])
    train_idx = np.sort(perm[n_eval:])
    return [records[i] for i in train_idx], [records[i] for i in eval_idx]


def subsample(records: list[dict], limit: int | None, seed: int) -> list[dict]:
    """At most ``limit`` records, a seeded random subset in file order (files are often sorted by label)."""
    if limit is None or limit >= len(records):
        return records
    if limit <= 0:
        raise ValueError(f"an example limit must be positive, got {limit}")
    idx = np.sort(np.random.default_rng(seed + 1).choice(len(records), size=limit, replace=False))
    return [records[i] for i in idx]
