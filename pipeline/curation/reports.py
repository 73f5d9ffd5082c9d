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
import logging
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

log = logging.getLogger(__name__)

OUT_DIR = "reports"  # OUTPUT/reports/
MAX_DROP_SHARE = 0.5  # of an input's documents one reason may remove before the build warns and (by default) stops
CURATION_REASONS = (LANGUAGE, CONTAMINATED, EXACT, NEAR, MIX)  # and QUALITY + <rule>


@marker("reports")
class ReportMarker(Marker):
    dropped: dict[str, int]
    """dropped.jsonl's lines by reason; the manifest's curation counts in ``totals.dropped`` must equal it."""
    edited: int
    """edited.jsonl's lines, one per document the decontamination cut edited (0 without --decontaminate-mode cut)."""
    with_edits: bool
    """Whether edited.jsonl was written: --decontaminate-mode cut with evaluation sets to match against."""
    by_input: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    """dropped.jsonl's lines by input file (redacted, as the lines' ``source``) and reason: the same lines as
    ``dropped``, split per input."""

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
        by_input: dict[str, Counter] = {}
        with open_atomic(join(ctx.output, OUT_DIR, DROPPED_FILE), ep) as f:
            for uid, path in self.units:
                lines = []
                if f"{uid}.dropped.jsonl" in parts:
                    lines += read_bytes(reports_url(ctx, uid, "dropped"), ep).decode("utf-8").splitlines()
                docs = docs_url(ctx, uid)
                if docs in self.dropped:
                    lines += [report_line({"id": r["doc_id"], "reason": r["reason"], "duplicate_of": r["duplicate_of"],
                                           "detail": r["detail"]}, path) for r in read_drop_list(docs, ctx).to_pylist()]
                reasons = [json.loads(x)["reason"] for x in lines]
                counts.update(reasons)
                by_input.setdefault(path, Counter()).update(reasons)
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
        marker = ReportMarker(dropped=dict(sorted(counts.items())), edited=edited, with_edits=self.with_edits,
                              by_input={p: dict(sorted(c.items())) for p, c in sorted(by_input.items()) if c})
        write_marker(ctx.work, marker, ep, ctx.fence)
        return marker


def reports_stage(s: BuildState) -> Stage | None:
    if not s.cfg.curate.enabled:
        return None
    units = tuple((m.uid, m.path) for m in s.markers["read"])  # every unit: one may have lost all its documents
    step = ReportStep(s.ctx, units, s.dropped, s.cfg.curate.decontamination.mode == "cut"
                      and bool(s.cfg.curate.decontamination.paths))
    return Stage("reports", step, {"report": "report"}, ReportMarker, noun="report", after=check_drops)


def input_documents(s: BuildState) -> dict[str, int]:
    """Documents the reader gave per input file (redacted path), before any filter."""
    out: Counter = Counter()
    for m in s.markers["read"]:
        out[m.path] += m.read_documents
    return dict(out)


def large_drops(s: BuildState) -> list[tuple[str, str, int, int]]:
    """(input, reason, removed, documents) for every curation reason that removed more than ``MAX_DROP_SHARE`` of
    an input's documents (``--mix`` aside: a weight below 1 asks for it), and for an input that lost more than that
    share to several reasons together (reason ``curation``)."""
    (report,) = s.markers["reports"]
    docs = input_documents(s)
    out = []
    for path, reasons in report.by_input.items():  # type: ignore[attr-defined]
        total = docs.get(path, 0)
        if not total:
            continue
        counted = {r: n for r, n in reasons.items() if r != MIX}
        big = [(path, r, n, total) for r, n in sorted(counted.items(), key=lambda x: (-x[1], x[0]))
               if n > MAX_DROP_SHARE * total]
        if not big and sum(counted.values()) > MAX_DROP_SHARE * total:
            big = [(path, "curation", sum(counted.values()), total)]
        out += big
    return out


def check_drops(s: BuildState) -> BuildState:
    """The reports stage's hook: warn for every input a rule removed more than half of (naming the input, the rule
    and the share); unless --allow-drop, stop the build there, before the pool and the shards, with one line naming
    the flag: nothing is in the output but the report."""
    found = large_drops(s)
    for path, reason, n, total in found:
        s = s.warned(f"curation removed {n / total:.0%} of {path} ({n} of {total} documents) by {reason}")
        log.warning("%s", s.warnings[-1])
    if found and not s.cfg.checks.allow_drop:
        path, reason, n, total = found[0]
        more = f" (and {len(found) - 1} more, in the log)" if len(found) > 1 else ""
        raise DropTooLarge(f"curation would remove {n / total:.0%} of {path} ({n} of {total} documents) by {reason}"
                           f"{more}; the build stopped before the pool and shards, and {OUT_DIR}/{DROPPED_FILE} in "
                           f"the output says what went: pass --allow-drop to build anyway{_fix(reason)}")
    return s


def _fix(reason: str) -> str:
    if reason.startswith(QUALITY):
        rule = reason.removeprefix(QUALITY)
        return f", or --quality-skip {rule} (or its --quality-* threshold) to keep them"
    if reason == LANGUAGE:
        return ", or add the input's language to --languages (or lower --language-threshold)"
    return ""


class DropTooLarge(ValueError):
    """A curation rule removed more than half of an input and --allow-drop was not given (a ValueError: the job
    prints its one line and exits 2)."""


def curation_section(s: BuildState, dropped: Counter) -> dict[str, Any] | None:
    """The manifest's ``curation``: what was asked, the evaluation sets matched against, the reports (file, lines,
    lines by reason) and the mix's shares; None for a build that curates nothing."""
    from pipeline.curation.stage import mix_shares

    c = s.cfg.curate
    if not c.enabled:
        return None
    (report,) = s.markers["reports"]
    curated = {k: v for k, v in dropped.items() if k in CURATION_REASONS or k.startswith(QUALITY)}
    assert curated == dict(report.dropped), f"totals.dropped {curated} != the report's lines {report.dropped}"  # type: ignore
    out: dict[str, Any] = {"config": redact(dataclasses.asdict(c)), "reports": {
        "dropped": {"file": f"{OUT_DIR}/{DROPPED_FILE}", "lines": sum(report.dropped.values()),  # type: ignore
                    "by_reason": dict(report.dropped)}}}  # type: ignore[attr-defined]
    # Per input file (redacted, as the report's ``source``): documents read and the report's lines by reason.
    docs = input_documents(s)
    out["by_input"] = {redact_url(p): {"documents": n, "dropped": dict(report.by_input.get(p, {}))}  # type: ignore
                       for p, n in sorted(docs.items())}
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
