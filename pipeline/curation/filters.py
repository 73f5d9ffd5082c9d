"""Curation in the build's read pass: the document filters (``read.DOC_FILTERS``) and what a unit commits for them.

    ReadCorpus -> Language -> Quality -> Decontamination -> SignatureColumns -> SplitTokenize -> WriteDocs
                  (each only when the build asks: --languages, --quality, --decontaminate, --dedup exact|near)

Each filter is a ``curate`` filter in its read-pass form (``UnitReports``): the rows it keeps and,
per unit it removed documents from, one report row with the counts by reason and the removed (and, with
``--decontaminate-mode cut``, edited) documents. So a removed document is never tokenized. ``WriteDocs`` adds the
counts to the unit's marker (``totals.dropped`` sums them) and, before the marker, commits the unit's parts
(``commit_unit``):

    _work/reports/<uid>.dropped.jsonl, <uid>.edited.jsonl   this unit's lines of the report (reports.py joins them)
    _work/sigs/<uid>.arrow                                  (id, content hash, MinHash) of the unit's kept documents:
                                                            what the dedup decision reads (curate.py), not the text

The order is ``CurateConfig``'s (curate/config.py says why). The evaluation sets' n-gram index is built once
per process (``eval_index``: the job builds it at start to refuse an evaluation file without text, the driver's
planner then finds it built) and handed to the workers like the vocabulary (``executor.share``); its digest is part
of the build's identity (``identity``), so a changed evaluation set refuses to resume or to pass for a finished
build. Curation reads files given with ``--input``; a documents Dataset is the user's to curate before the build
(``curate.Rows`` in ``map_batches``).
"""
from __future__ import annotations

import functools
import json
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curate.contract import Filtered
from curate.decontaminate import Decontaminate, DecontaminationConfig, NgramIndex, build_index
from curate.dedup import DedupConfig, Signatures
from curate.eval_sets import eval_files, eval_texts, file_stamp
from curate.language import LanguageFilter
from curate.mix import under
from curate.quality import QualityFilter
from pipeline.config import BuildConfig
from pipeline.work import WORK_SUFFIX, StepContext, cached, write_table
from storage.fs import absolute, expand_inputs, is_url, open_atomic
from storage.redact import redact, redact_url

log = logging.getLogger(__name__)

REPORTS_DIR = "reports"  # _work/reports/<uid>.<dropped|edited>.jsonl
SIGS_DIR = "sigs"  # _work/sigs/<uid>.arrow
REPORT_KEYS = ("id", "source", "reason", "duplicate_of", "detail")


# --- curate's filters as operators of the read pass, whose batches also hold the units' report rows

class KeptByCuration:
    """The build's per-document curation (language, quality, decontamination, in that order) as a test of texts:
    the vocab stage trains on the sampled documents it keeps, so the vocabulary is trained on what curation keeps
    (dedup's copies and the mix's draw aside: they decide how often a text counts, not which words exist).
    Picklable: the filters are made in the process that uses them, on first use."""

    def __init__(self, cfg: BuildConfig):
        self.cfg, self._filters = cfg, None

    def __getstate__(self) -> dict:
        return {"cfg": self.cfg, "_filters": None}

    def __call__(self, texts: list[str]) -> list[bool]:
        if not texts:
            return []
        if self._filters is None:
            index = eval_index(self.cfg) if self.cfg.curate.decontamination.paths else None
            self._filters = [f for _, f in self.cfg.curate.document_filters(index)]
        table = pa.table({"id": pa.array([str(i) for i in range(len(texts))], pa.string()),
                          "text": pa.array(texts, pa.string())})
        for f in self._filters:
            table = f(table).kept
        keep = np.zeros(len(texts), dtype=bool)
        keep[[int(i) for i in table.column("id").to_pylist()]] = True
        return keep.tolist()


def kept_by_curation(cfg: BuildConfig) -> KeptByCuration | None:
    """The vocab stage's document test when the build has per-document filters; None otherwise."""
    c = cfg.curate
    return KeptByCuration(cfg) if (c.language.languages or c.quality is not None or c.decontamination.paths) else None


class UnitReports:
    """A ``curate`` filter as an operator of the read pass: the filter sees the batch's documents only; the units'
    report rows (``id`` null) pass on as they are, and each unit that lost or edited documents gets one more report
    row (``unit``, ``id`` null) whose ``report`` is ``{"dropped": {reason: n}, "removed": [dropped rows], "edited":
    [edited rows]}``: the counts the unit's marker adds up, and the lines of ``reports/dropped.jsonl``."""

    def __init__(self, make: Callable[[], Callable[[pa.Table], Filtered]]):
        self._make, self._filter = make, None

    def __call__(self, batch: pa.Table) -> pa.Table:
        if self._filter is None:
            self._filter = self._make()
        is_doc = batch.column("id").is_valid()
        docs = batch.filter(is_doc)
        out = self._filter(docs)
        parts = [batch.filter(pc.invert(is_doc)), out.kept]
        unit_of = dict(zip(docs.column("id").to_pylist(), docs.column("unit").to_pylist(), strict=False))
        per_unit: dict[str, dict] = {}
        for kind, rows in (("removed", out.dropped.to_pylist()), ("edited", out.edited.to_pylist())):
            for r in rows:
                rep = per_unit.setdefault(unit_of[r["id"]], {"dropped": Counter(), "removed": [], "edited": []})
                rep[kind].append({k: v for k, v in r.items() if v is not None})
                if kind == "removed":
                    rep["dropped"][r["reason"]] += 1
        if per_unit:
            units = sorted(per_unit)
            reports = [json.dumps({**per_unit[u], "dropped": dict(sorted(per_unit[u]["dropped"].items()))},
                                  sort_keys=True, ensure_ascii=False) for u in units]
            cols = {name: pa.nulls(len(units), batch.schema.field(name).type) for name in batch.column_names}
            cols["unit"] = pa.array(units, batch.schema.field("unit").type)
            cols["report"] = pa.array(reports, batch.schema.field("report").type)
            parts.append(pa.table(cols, schema=batch.schema))
        return pa.concat_tables(parts)


class SignatureColumns:
    """Dedup's signatures (``curate.dedup.Signatures``, over the batch's documents) in the read pass's form: the
    rows as they are, with ``content`` and ``sig`` appended (null on the units' report rows), which the pass's sink
    keeps beside each document (``commit_unit``) for the global step."""

    def __init__(self, cfg: DedupConfig):
        self.signatures = Signatures(cfg)

    def __call__(self, batch: pa.Table) -> pa.Table:
        is_doc = batch.column("id").is_valid().to_numpy(zero_copy_only=False)
        sigs = self.signatures(batch.filter(pa.array(is_doc)))  # a row per document, in order
        take = pa.array(np.where(is_doc, np.cumsum(is_doc) - 1, 0), mask=~is_doc)
        return (batch.append_column("content", sigs["content"].take(take))
                .append_column("sig", sigs["sig"].take(take)))


# --- the filters as operators of the read pass (named, so the progress lines and Ray show which is which)

class Language(UnitReports):
    """``--languages``: fastText's lid.176 per document (``curate.language``)."""


class Quality(UnitReports):
    """``--quality``: the Gopher and C4 rules (``curate.quality``)."""


class Decontamination(UnitReports):
    """``--decontaminate``: shared n-grams with evaluation texts (``curate.decontaminate``)."""


def language(s) -> Language | None:
    c = s.cfg.curate.language
    return Language(functools.partial(LanguageFilter, c)) if c.languages else None


def quality(s) -> Quality | None:
    c = s.cfg.curate.quality
    return Quality(functools.partial(QualityFilter, c)) if c is not None else None


def decontamination(s) -> Decontamination | None:
    c = s.cfg.curate.decontamination
    if not c.paths:
        return None
    index = eval_index(s.cfg)
    shared = s.executor.share(f"eval_index:{index.digest()}", index)
    return Decontamination(_Decontaminator(shared, c, s.cfg.read.presplit))


def signatures(s) -> SignatureColumns | None:
    c = s.cfg.curate.dedup
    return SignatureColumns(c) if c.mode != "off" else None


FILTERS = (language, quality, decontamination, signatures)


class _Decontaminator:
    """Makes the decontamination filter in a worker from the shared index (loaded once per process)."""

    def __init__(self, index: Any, cfg: DecontaminationConfig, presplit: bool):
        self.index, self.cfg, self.presplit = index, cfg, presplit

    def __call__(self) -> Decontaminate:
        return Decontaminate(cached("eval_index", self.index.key, self.index.get), self.cfg, self.presplit)


# --- the evaluation sets: read once per process, checked, part of the build's identity

def eval_index(cfg: BuildConfig) -> NgramIndex:
    """The n-gram index of ``--decontaminate``'s files, built once per process and version of the files; a file
    that gives no text long enough to match is refused with the fix."""
    c = cfg.curate.decontamination
    files = eval_files(c.paths, cfg.endpoint_url)
    key = (c, cfg.endpoint_url, tuple((f, file_stamp(f, cfg.endpoint_url)) for f in files))

    def load() -> NgramIndex:
        index = build_index(eval_texts(c.paths, c.fields, cfg.endpoint_url, examples=True), c)
        checked = dict(zip(index.files, index.checked, strict=False))
        empty = [f for f in files if not checked.get(f)]
        if empty:
            fields = f" in the fields {', '.join(c.fields)}" if c.fields else ""
            raise ValueError(f"--decontaminate {redact_url(empty[0])}: no evaluation text of at least {c.min_words} "
                             f"words{fields} in it" + (f" (nor in {len(empty) - 1} other file(s))" if len(empty) > 1
                                                      else "") + ": name files whose records hold the evaluation "
                             "texts (--decontaminate-fields names the fields), or leave the file out")
        log.info("decontamination index: %d texts of %d file(s), %d n-grams (%d texts too short to check)",
                 index.texts, len(index.files), index.size, index.too_short)
        return index
    if _INDEX.get("key") != key:
        _INDEX.clear()  # one index in memory
        _INDEX.update(key=key, index=load())
    return _INDEX["index"]


_INDEX: dict[str, Any] = {}  # this process's index of the evaluation sets, and what it was built from


def identity(cfg: BuildConfig, inputs: Any = None) -> dict[str, Any]:
    """What the build's identity adds for curation: the evaluation sets' content (their index's digest). Curation of
    a documents Dataset is refused here, before any work."""
    if cfg.curate.enabled and inputs is not None and inputs.documents is not None:
        raise ValueError("curation (dedup, decontaminate, languages, quality, mix) runs on --input files; curate a "
                         "documents Dataset before the build (curate.Rows(filter) in map_batches), or write"
                         " it as files")
    if not cfg.curate.decontamination.paths:
        return {}
    return {"eval_sets_sha256": eval_index(cfg).digest()}


def check(cfg: BuildConfig) -> None:
    """The curation mistakes a job refuses at its start, in one line each, before Ray or MLflow: evaluation files
    without text, a --mix SOURCE that matches no input file (unknown languages are refused by the config)."""
    c = cfg.curate
    if c.decontamination.paths:
        eval_index(cfg)
    if c.mix.weights and cfg.inputs:
        check_mix(cfg, [f.path for f in expand_inputs(list(cfg.inputs), cfg.endpoint_url)])


def mix_source(prefix: str) -> str:
    """A --mix SOURCE as the files' paths spell it (a local one made absolute, as the input listing does)."""
    return prefix if is_url(prefix) else absolute(prefix)


def check_mix(cfg: BuildConfig, paths: list[str]) -> None:
    """Refuse a --mix SOURCE that is none of ``paths`` (the input files) and holds none of them."""
    bad = [p for p, _ in cfg.curate.mix.weights if not any(under(path, mix_source(p)) for path in paths)]
    if bad:
        raise ValueError(f"--mix {bad[0]}: no input file is {bad[0]} or lies under it (inputs: "
                         f"{', '.join(cfg.inputs[:3])}{' ...' if len(cfg.inputs) > 3 else ''}); name an input file"
                         " or folder")


# --- what a unit commits for curation (WriteDocs, before its marker)

def report_line(row: dict[str, Any], source: str) -> str:
    """One line of the report: the keys in a fixed order, those not set left out (the source: the unit's input).
    Redacted (storage/redact.py): a detail can quote a --decontaminate URL, and the report is an MLflow artifact."""
    row = {**row, "source": row.get("source") or source}
    return json.dumps(redact({k: row[k] for k in REPORT_KEYS if row.get(k) is not None}), ensure_ascii=False)


def reports_url(ctx: StepContext, uid: str, kind: str) -> str:
    return ctx.url(REPORTS_DIR, f"{uid}.{kind}.jsonl")


def sigs_url(ctx: StepContext, uid: str) -> str:
    return ctx.url(SIGS_DIR, uid + WORK_SUFFIX)


def commit_unit(uid: str, path: str, reports: list[dict], docs: pa.Table, kept_ids: list[str],
                ctx: StepContext) -> None:
    """A unit's parts of curation: its report lines (the filters' report rows) and its documents' signatures (the
    ``SignatureColumns`` of the documents it keeps). Nothing when the build curates nothing."""
    for kind in ("removed", "edited"):
        rows = [x for r in reports for x in r.get(kind, ())]
        if rows:
            name = "dropped" if kind == "removed" else "edited"
            with open_atomic(reports_url(ctx, uid, name), ctx.endpoint_url) as f:
                f.write("".join(report_line(x, path) + "\n" for x in rows).encode("utf-8"))
    if "sig" in docs.column_names:
        sigs = docs.select(["id", "content", "sig"])
        write_table(sigs_url(ctx, uid), sigs.filter(pc.is_in(sigs["id"], value_set=pa.array(kept_ids, pa.string()))),
                    ctx)
