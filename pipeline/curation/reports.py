"""The curation report and the manifest's curation section, when the build curates (pipeline/curation/filters.py).

    ReportStep   "report" -> OUTPUT/reports/dropped.jsonl: one line per document curation removed, every unit's part
                 in unit order (the read pass's filters' lines, ``_work/reports/<uid>.dropped.jsonl``, then its drop
                 list's from the curate stage); OUTPUT/reports/edited.jsonl the same for --decontaminate-mode cut's
                 edits; then its ReportMarker (lines by reason)

A line is ``{"id", "source", "reason", "duplicate_of"?, "detail"?}`` (``curate.report``): the record's own
id (or ``<file key>:<offset>``), the input file, why (``language``, ``quality:<rule>``, ``contaminated``,
``exact_duplicate``, ``near_duplicate``, ``mix``), the kept document a duplicate copies, what was measured. The
report holds curation's removals only: what the reader itself drops (bad JSON, a document with no tokens, ...) is
counted in the manifest as before. The manifest's ``totals.dropped`` counts each curation reason from the same rows
the lines are written from, so the two agree by construction; ``curation_section`` asserts it.

One item (one writer per output): the parts are small next to the corpus and streamed, one unit at a time.
"""
from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

from curate.contract import CONTAMINATED, EXACT, LANGUAGE, MIX, NEAR, QUALITY
from curate.report import DROPPED_FILE, EDITED_FILE
from pipeline.curation.filters import REPORTS_DIR, eval_index, report_line, reports_url
from pipeline.docs import docs_url
from pipeline.drops import read_drop_list
from pipeline.executor import Stage
from pipeline.markers import Marker, marker, write_marker
from pipeline.state import BuildState
from pipeline.work import StepContext
from storage.fs import join, list_names, open_atomic, read_bytes
from storage.redact import redact, redact_url

OUT_DIR = "reports"  # OUTPUT/reports/
CURATION_REASONS = (LANGUAGE, CONTAMINATED, EXACT, NEAR, MIX)  # and QUALITY + <rule>


@marker("reports")
class ReportMarker(Marker):
    dropped: dict[str, int]
    """dropped.jsonl's lines by reason; the manifest's curation counts in ``totals.dropped`` must equal it."""
    edited: int
    """edited.jsonl's lines, one per document the decontamination cut edited (0 without --decontaminate-mode cut)."""
    with_edits: bool
    """Whether edited.jsonl was written: --decontaminate-mode cut with evaluation sets to match against."""

    @property
    def key(self) -> str:
        return "report"


@dataclasses.dataclass(frozen=True)
class ReportStep:
    """Join the units' parts into the report files (the module's docstring)."""

    ctx: StepContext
    """Where _work and the output are, and the build's writer lease (proved before the marker is committed)."""
    units: tuple[tuple[str, str], ...]
    """(unit id, its input's redacted path) of every read unit, in unit order: the order of the report's lines.
    A unit that lost all its documents is still listed."""
    dropped: frozenset[str]
    """The docs files that the curate stage gave a drop list; their removals follow the read pass's lines."""
    with_edits: bool
    """--decontaminate-mode cut with evaluation sets: write edited.jsonl, empty or not."""

    def __call__(self, item: str) -> ReportMarker:
        ctx, ep = self.ctx, self.ctx.endpoint_url
        parts = set(list_names(ctx.url(REPORTS_DIR), ep))
        counts: Counter = Counter()
        with open_atomic(join(ctx.output, OUT_DIR, DROPPED_FILE), ep) as f:
            for uid, path in self.units:
                lines = []
                if f"{uid}.dropped.jsonl" in parts:
                    lines += read_bytes(reports_url(ctx, uid, "dropped"), ep).decode("utf-8").splitlines()
                docs = docs_url(ctx, uid)
                if docs in self.dropped:
                    lines += [report_line({"id": r["doc_id"], "reason": r["reason"], "duplicate_of": r["duplicate_of"],
                                           "detail": r["detail"]}, path) for r in read_drop_list(docs, ctx).to_pylist()]
                counts.update(json.loads(x)["reason"] for x in lines)
                if lines:
                    f.write(("\n".join(lines) + "\n").encode("utf-8"))
        edited = 0
        if self.with_edits:
            with open_atomic(join(ctx.output, OUT_DIR, EDITED_FILE), ep) as f:
                for uid, _ in self.units:
                    if f"{uid}.edited.jsonl" in parts:
                        data = read_bytes(reports_url(ctx, uid, "edited"), ep)
                        edited += data.count(b"\n")
                        f.write(data)
        marker = ReportMarker(dropped=dict(sorted(counts.items())), edited=edited, with_edits=self.with_edits)
        write_marker(ctx.work, marker, ep, ctx.fence)
        return marker


def reports_stage(s: BuildState) -> Stage | None:
    if not s.cfg.curate.enabled:
        return None
    units = tuple((m.uid, m.path) for m in s.markers["read"])  # every unit: one may have lost all its documents
    step = ReportStep(s.ctx, units, s.dropped, s.cfg.curate.decontamination.mode == "cut"
                      and bool(s.cfg.curate.decontamination.paths))
    return Stage("reports", step, {"report": "report"}, ReportMarker, noun="report")


def curation_section(s: BuildState, dropped: Counter) -> dict[str, Any] | None:
    """The manifest's ``curation``: what was asked, the evaluation sets matched against, the reports (file, lines,
    lines by reason) and the mix's shares; None for a build that curates nothing."""
    from pipeline.curation.stage import mix_shares

    c = s.cfg.curate
    if not c.enabled:
        return None
    (report,) = s.markers["reports"]
    curated = {k: v for k, v in dropped.items() if k in CURATION_REASONS or k.startswith(QUALITY)}
    assert curated == report.dropped, f"totals.dropped {curated} != the report's lines {report.dropped}"  # type: ignore
    out: dict[str, Any] = {"config": redact(dataclasses.asdict(c)), "reports": {
        "dropped": {"file": f"{OUT_DIR}/{DROPPED_FILE}", "lines": sum(report.dropped.values()),  # type: ignore
                    "by_reason": report.dropped}}}  # type: ignore[attr-defined]
    if report.with_edits:  # type: ignore[attr-defined]
        out["reports"]["edited"] = {"file": f"{OUT_DIR}/{EDITED_FILE}", "lines": report.edited}  # type: ignore
    if c.decontamination.paths:
        index = eval_index(s.cfg)
        out["eval_sets"] = {"sha256": index.digest(), "ngrams": index.size, "texts": index.texts,
                            "too_short": index.too_short,
                            "files": {redact_url(f): n for f, n in zip(index.files, index.checked, strict=False)}}
    if shares := mix_shares(s):
        out["mix"] = redact(shares)  # keyed by --mix SOURCE: a URL with its credentials, which only read
    return out
