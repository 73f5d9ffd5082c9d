"""The texts of evaluation sets, read with fine-tuning's own readers (``corpus.records``): JSON Lines, JSON
(records or SQuAD v1.1), CSV, TSV, Parquet and CoNLL files, compressed or not, on any fsspec filesystem.

Every string field of every record is a text (a list of strings, such as a tagging task's ``tokens``, is one text,
its items joined by spaces), unless ``fields`` names the ones to take. Labels are strings too, but far shorter than
any n-gram the decontamination looks for, so they never match. A folder contributes the files in it whose names say
a task format.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from corpus.records import read_records, record_format
from storage.fs import filesystem_for, storage_options, unstrip


def eval_files(paths: Sequence[str], endpoint_url: str | None = None) -> list[str]:
    """The evaluation files ``paths`` name (a folder: its task files), in order; ValueError for one that is not
    there."""
    return [url for path in paths for url in _files(path, endpoint_url)]


def file_stamp(url: str, endpoint_url: str | None = None) -> tuple:
    """(size, etag, mtime) of a file as its store reports them: what tells a changed file (a cache key)."""
    fs, p = filesystem_for(url, endpoint_url)
    info = fs.info(p)
    return (info.get("size"), str(info.get("ETag") or info.get("etag") or ""),
            str(info.get("mtime") or info.get("LastModified") or info.get("updated") or ""))


def _files(path: str, endpoint_url: str | None) -> list[str]:
    fs, p = filesystem_for(path, endpoint_url)
    if not fs.exists(p):
        raise ValueError(f"--decontaminate {path} does not exist: name evaluation files or folders of them")
    if not fs.isdir(p):
        return [path]
    found = []
    for name in sorted(fs.find(p)):
        try:
            record_format(name)
        except ValueError:
            continue
        found.append(unstrip(fs, name, path))
    if not found:
        raise ValueError(f"--decontaminate {path}: a folder with no task files in it (.jsonl, .json, .csv, .tsv,"
                         " .parquet, .conll, optionally compressed); name the evaluation files")
    return found


def _texts(record: dict[str, Any], fields: Sequence[str]) -> Iterator[str]:
    values = [record[f] for f in fields if f in record] if fields else list(record.values())
    for v in values:
        if isinstance(v, str):
            yield v
        elif isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            yield " ".join(v)


_ID_FIELDS = ("id", "idx", "guid", "qid", "uid")


def _example(record: dict[str, Any], k: int) -> str:
    """How a report names a record: its own id field, else its place (line k of JSON Lines, row k of a table)."""
    for f in _ID_FIELDS:
        if isinstance(record.get(f), str | int) and not isinstance(record.get(f), bool):
            return f"{f} {record[f]}"
    return f"record {k}"


def eval_texts(paths: Sequence[str], fields: Sequence[str] = (), endpoint_url: str | None = None,
               examples: bool = False) -> Iterator[tuple[str, ...]]:
    """(file, text) for every text of every record of the evaluation files (a folder: its task files); with
    ``examples``, (file, text, example): the record's id field or its 1-based place (``record 12``)."""
    for url in eval_files(paths, endpoint_url):
        records = read_records(url, storage_options=storage_options(url, endpoint_url))
        if fields and not any(f in r for r in records for f in fields):
            raise ValueError(f"--decontaminate {url}: no record has a field {', '.join(fields)} (the first"
                             f" record's fields: {', '.join(records[0])}); pass the fields that hold its text")
        for k, r in enumerate(records, 1):
            for text in _texts(r, fields):
                yield (url, text, _example(r, k)) if examples else (url, text)
