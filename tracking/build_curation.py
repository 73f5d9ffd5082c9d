"""Curation in the dataset build's MLflow run (``tracking/build_run.py``): what the build's curation removed, beside
the counts by reason (``dropped.<reason>`` metrics and the ``dropped.png`` bars, logged for every build).

- metrics ``curate.report_lines`` (= the curation reasons' counts), ``curate.edited`` (cut mode) and, with
  ``--mix``, each SOURCE's asked and made share of the tokens (``curate.mix.<k>.asked_share`` / ``.share``, k in the
  order of the manifest's ``curation.mix``; the SOURCEs themselves are the ``curate.mix.<k>`` params);
- the report itself as the ``reports/`` artifact (``dropped.jsonl``, ``edited.jsonl``) when it is at most
  ``MAX_ARTIFACT_BYTES``, else a ``curate.report`` tag naming where it is, so a big corpus's report is never copied
  into the tracking store by accident; beside it ``reports/by_input.json``, the manifest's ``curation.by_input``
  (per input file: documents read and the report's lines by reason), always.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from storage.fs import filesystem_for, join

MAX_ARTIFACT_BYTES = 64 << 20
ARTIFACT_DIR = "reports"
BY_INPUT = "by_input.json"


def log_curation(run: Any, output: str, manifest: Any, endpoint_url: str | None, tmp: str) -> None:
    """Log a curated build's figures and report on ``run`` (nothing for a build that curates nothing)."""
    c = manifest.curation
    if not c:
        return
    reports = c["reports"]
    metrics = {"curate.report_lines": reports["dropped"]["lines"]}
    if "edited" in reports:
        metrics["curate.edited"] = reports["edited"]["lines"]
    params = {}
    for k, (source, s) in enumerate(c.get("mix", {}).items()):
        params[f"curate.mix.{k}"] = f"{source} x{s['weight']:g}"
        metrics |= {f"curate.mix.{k}.asked_share": s["asked_share"], f"curate.mix.{k}.share": s["share"]}
    run.log_metrics(metrics)
    if params:
        run.log_params(params)
    folder = Path(tmp) / ARTIFACT_DIR
    folder.mkdir(exist_ok=True)
    if "by_input" in c:  # per input file: documents read and the report's lines by reason (the manifest's table)
        (folder / BY_INPUT).write_text(json.dumps(c["by_input"], indent=1, sort_keys=True))
    files = [join(output, r["file"]) for r in reports.values()]
    sizes = [filesystem_for(f, endpoint_url)[0].size(filesystem_for(f, endpoint_url)[1]) for f in files]
    if sum(sizes) > MAX_ARTIFACT_BYTES:
        run.set_tags({"curate.report": join(output, reports["dropped"]["file"])})
        files = []
    for f in files:
        fs, path = filesystem_for(f, endpoint_url)
        fs.get(path, str(folder / Path(path).name))
    run.log_artifacts(folder, ARTIFACT_DIR)
