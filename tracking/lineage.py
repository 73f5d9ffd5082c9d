"""Lineage both ways, as links a person clicks: the build's run <-> the pre-training runs trained on its dataset <->
the fine-tuning runs started from their models. Each run's description (`mlflow.note.content`) says where it came
from (a link back) and, in a "Used by" section kept up to date by the later runs, what was made from it (links
forward). Every link opens in the model-training view (`tracking.notes.run_link`).

    pretraining_lineage(uri, run_id, train, eval, export)   the pre-training job, once its run is open
    link_forward(uri, source_run_id, run_id, text)          a later run adds itself to an earlier run's "Used by"

A build's run is found by its dataset: the manifest's sha256, tagged on the build's run when it finishes
(`DATASET_SHA_TAG`; `tracking.build_run`), searched in every experiment of the store (a dataset built with
`--experiment A` and trained on in `B` is still found). A dataset built with no MLflow run, or in another store, is
named by its folder, without a link.
"""
from __future__ import annotations

import logging
from typing import Any

from tracking.notes import NOTE_TAG, run_link

log = logging.getLogger(__name__)

DATASET_SHA_TAG = "dataset.manifest_sha256"  # on the build's run (its output) and the pre-training run (its input)
USED_BY_PREFIX = "bert.used_by."  # + run id: "what made from this run" (its link text), one tag per later run
USED_BY_HEADING = "**Used by:**"


def _client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri)


def find_build_run(tracking_uri: str, manifest_sha256: str) -> dict[str, str] | None:
    """{"run_id", "experiment_id", "name"} of the finished run that built the dataset with this manifest (the one
    that built it, before any "already complete" rerun), or None."""
    client = _client(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments or not all(c in "0123456789abcdef" for c in manifest_sha256):
        return None
    runs = client.search_runs(experiments, filter_string=f"tags.`{DATASET_SHA_TAG}` = '{manifest_sha256}' and "
                              "tags.job = 'build_dataset' and attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time ASC"])
    if not runs:
        return None
    built = [r for r in runs if r.data.tags.get("dataset.result") == "built"] or runs
    r = built[0]
    return {"run_id": r.info.run_id, "experiment_id": r.info.experiment_id, "name": r.info.run_name or r.info.run_id}


def with_used_by(note: str, tags: dict[str, str], experiment_of: dict[str, str]) -> str:
    """`note` with its "Used by" paragraph (re)made from the run's USED_BY tags, a link per later run (by run
    id), second: MLflow shows the first lines of a description and hides the rest behind "Show more"."""
    paragraphs = [p for p in note.split("\n\n") if p and not p.startswith(USED_BY_HEADING)]
    used = sorted((k[len(USED_BY_PREFIX):], v) for k, v in tags.items() if k.startswith(USED_BY_PREFIX))
    links = [run_link(experiment_of[run_id], run_id, text) for run_id, text in used if run_id in experiment_of]
    if links:
        paragraphs.insert(1, f"{USED_BY_HEADING} " + ", ".join(links) + ".")
    return "\n\n".join(paragraphs)


def link_forward(tracking_uri: str, source_run_id: str, run_id: str, text: str) -> None:
    """Add run `run_id` (shown as `text`) to the "Used by" section of the earlier run `source_run_id`. Each later run
    has a tag of its own, so two writing at once lose nothing; the note is remade from all of them."""
    client = _client(tracking_uri)
    client.set_tag(source_run_id, f"{USED_BY_PREFIX}{run_id}", text)
    _refresh_used_by(client, source_run_id)


def _refresh_used_by(client: Any, run_id: str) -> None:
    """Remake run `run_id`'s "Used by" section from its tags."""
    run = client.get_run(run_id)
    experiment_of = {}
    for key in run.data.tags:
        if key.startswith(USED_BY_PREFIX):
            other = key[len(USED_BY_PREFIX):]
            try:
                experiment_of[other] = client.get_run(other).info.experiment_id
            except Exception:  # noqa: BLE001 (a later run since deleted: no link to it)
                continue
    client.set_tag(run_id, NOTE_TAG, with_used_by(run.data.tags.get(NOTE_TAG, ""), run.data.tags, experiment_of))


def pretraining_note(name: str, sources: dict[str, tuple[Any, dict[str, str] | None]], export: str | None,
                     init: str | None) -> str:
    """The pre-training run's description: what it was trained and evaluated on (links to the builds' runs), where
    its model goes."""
    lines = [f"Pre-training run **{name}**" + (f", from `{init}`." if init else ".")]
    for context, (manifest, build) in sources.items():
        label = f"`{manifest.url.rstrip('/').rsplit('/', 1)[-1]}`"
        made = (f", built by run {run_link(build['experiment_id'], build['run_id'], build['name'])}"
                if build else " (its build has no run in this store)")
        lines.append(f"{context.capitalize()} data: {label}, {manifest.instances:,} sequences of at most "
                     f"{manifest.max_seq_length} tokens{made}.")
    if export:
        lines.append(f"Model exported to `{export}` (fine-tuning runs started from it are listed below).")
    return "\n\n".join(lines)


def pretraining_lineage(tracking_uri: str, run_id: str, train: Any, eval_data: Any = None,
                        export: str | None = None, init: str | None = None) -> None:
    """The pre-training run's links both ways: its description names the build runs of its training and eval data
    (``corpus.schema.Manifest``s), and each build run lists it under "Used by". Tracking is never worth failing
    a training run for: a store error here is a warning."""
    try:
        client = _client(tracking_uri)
        run = client.get_run(run_id)
        sources = {"training": (train, find_build_run(tracking_uri, train.sha256))}
        if eval_data is not None:
            sources["eval"] = (eval_data, find_build_run(tracking_uri, eval_data.sha256))
        client.set_tag(run_id, NOTE_TAG, pretraining_note(run.info.run_name or run_id, sources, export, init))
        _refresh_used_by(client, run_id)  # a resumed run keeps the fine-tuning runs made from it so far
        linked = set()
        for context, (_, build) in sources.items():
            if build is not None:
                client.set_tag(run_id, f"lineage.{context}_build_run_id", build["run_id"])
                if build["run_id"] not in linked:  # (eval data of the same build: one link, as training)
                    linked.add(build["run_id"])
                    name = f"pre-training run {run.info.run_name or run_id}"
                    link_forward(tracking_uri, build["run_id"], run_id, name + (" (eval)" if context == "eval" else ""))
    except Exception as e:  # noqa: BLE001 - a link is not worth a training run
        log.warning("could not link MLflow run %s to the runs of its data: %s", run_id, e)


def finetuning_lineage(tracking_uri: str, run_id: str, run_name: str, task: str,
                       pretrain: dict[str, str] | None) -> None:
    """The fine-tuning run under "Used by" of the pre-training run it started from (`pretrain`: that run's
    summary, when it is in this store; its own description links back: `tracking.notes.finetune_note`)."""
    if not pretrain or not pretrain.get("experiment_id"):
        return
    try:
        link_forward(tracking_uri, pretrain["run_id"], run_id, f"fine-tuning run {run_name} ({task})")
    except Exception as e:  # noqa: BLE001 - a link is not worth a training run
        log.warning("could not link MLflow run %s to the pre-training run %s: %s", run_id, pretrain["run_id"], e)
