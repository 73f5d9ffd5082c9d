"""Exports: a run's final model in the Hugging Face layout, logged to its MLflow run and published where the user
asked (a local folder, or any fsspec URL such as s3://bucket/models/name), with a lineage file that names the run.

A later stage reads the lineage file beside the weights it starts from (`read_lineage`) to link its own run to
the one that made them. Publishing is all-or-nothing (storage/publish.py): a local export is staged beside its
destination and swapped in by renames; an upload goes under a new version prefix and `export.json`, written last,
points readers at it. One export writes a destination at a time: it holds the destination's lease
(`<destination>.lease.json`, storage/lease.py) while it publishes, and proves it (storage/fence.py)
right before each switch: an export stalled past the lease's stale time never swaps in or points at its files.
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import torch

from storage.fs import check_writable, is_url
from storage.lease import holding, lease_url_beside
from storage.publish import publish_remote, recover_local, swap_in_local
from storage.redact import redact_url
from storage.untrusted import read_local_bounded
from tracking.runs import Run
from training.guard import safetensors_tensors

log = logging.getLogger(__name__)

PRETRAIN_LINEAGE = "bert_pretrain_run.json"
FINETUNE_LINEAGE = "bert_finetune_run.json"
# How long a finished run waits for another export to the same destination (seconds of uploading, usually) before
# it refuses: failing would throw away the training it just did.
EXPORT_WAIT_SECONDS = 600.0
MAX_LINEAGE_BYTES = 64 << 10  # a lineage file names a run (~150 bytes)


def check_destination(dest: str, endpoint_url: str | None = None) -> None:
    """Refuse, at start, a destination that an export would damage or that cannot be written (a missing bucket)."""
    if is_url(dest):
        check_writable(dest, endpoint_url)
        return
    target = Path(dest.removeprefix("file://"))
    recover_local(target.resolve())
    if target.is_file() or (target.is_dir() and any(target.iterdir()) and not (target / "config.json").is_file()):
        raise ValueError(f"{dest} exists and holds something other than a model (an export replaces it): "
                         "choose a new directory")


def export_model(model_dir: Path, dest: str | None, run: Run, lineage: str,
                 endpoint_url: str | None = None) -> None:
    """Copy `model_dir` (config.json, model.safetensors, vocab.txt, ...) with `lineage` naming `run`, log it as the
    run's `model` artifact, and publish it to `dest` (None: the artifact only). A model holding a NaN or inf is
    refused: no export is ever non-finite (checkpoints are checked when written; this checks the files)."""
    bad = [name for name, tensor in safetensors_tensors(model_dir) if not torch.isfinite(tensor).all()]
    if bad:
        raise RuntimeError(f"refusing to export {model_dir}: NaN or inf in {', '.join(bad[:5])}")
    local = dest is not None and not is_url(dest)
    target = Path(dest.removeprefix("file://")).resolve() if local else None
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
    # Staged beside a local destination, so that publishing it is a rename on one filesystem.
    with tempfile.TemporaryDirectory(prefix=".export-", dir=target.parent if target else None) as tmp:
        staged = Path(tmp) / "model"
        shutil.copytree(model_dir, staged)
        (staged / lineage).write_text(json.dumps({"mlflow_run_id": run.run_id,  # a password in the URI stays here
                                                  "tracking_uri": redact_url(run.tracking_uri)}) + "\n")
        run.log_artifacts(staged, artifact_path="model")
        if dest is not None:
            with holding(lease_url_beside(str(target or dest)), str(target or dest), "export", endpoint_url,
                         hint="or export somewhere else", wait=EXPORT_WAIT_SECONDS) as lease:
                prove = lambda: lease.fence.check(fresh=True)  # noqa: E731 - before each switch
                if target is not None:
                    swap_in_local(staged, target, prove)
                else:
                    publish_remote(staged, dest, endpoint_url, prove)
    if dest is not None:
        log.info("exported the model (Hugging Face layout) to %s", target or redact_url(dest))


def read_lineage(*model_dirs: str | Path, lineage: str = PRETRAIN_LINEAGE) -> dict[str, str] | None:
    """{"mlflow_run_id", "tracking_uri"} of the run that made a model: the first `lineage` file found in
    `model_dirs` (e.g. an --init directory, the model folder inside it, its parent); None when there is none."""
    for d in dict.fromkeys(Path(d) for d in model_dirs):
        f = d / lineage
        if not f.is_file():
            continue
        try:
            info = json.loads(read_local_bounded(f, MAX_LINEAGE_BYTES, "lineage file"))
            info = info if isinstance(info, dict) else {}
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            log.warning("ignoring unreadable %s", f)
            return None
        if info.get("mlflow_run_id"):
            return {"mlflow_run_id": str(info["mlflow_run_id"]), "tracking_uri": str(info.get("tracking_uri", ""))}
    return None
