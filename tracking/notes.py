"""Run descriptions (MLflow's `mlflow.note.content`, markdown, shown on a run's Overview): what a run did, from what,
with links a person can click. A link to another run of the same store is relative to the UI's page (`#/...`), so it
works wherever the UI is served (`mlflow ui` on any port, a team server)."""
from __future__ import annotations

from collections.abc import Mapping

from tracking.links import WORKFLOW_PARAM

NOTE_TAG = "mlflow.note.content"


def run_link(experiment_id: str, run_id: str, text: str) -> str:
    """A markdown link to a run of the same store, opening in the model-training view."""
    return f"[{text}](#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW_PARAM})"


def finetune_note(*, task: str, init: str, data: str, train_examples: int, eval_examples: int,
                  pretrain: Mapping[str, str] | None, final: Mapping[str, float] | None = None,
                  collapse: str | None = None) -> str:
    """The fine-tuning run's description: the task and data, the model it started from (a link to the
    pre-training run when that run is in this store), and once it ended its result (and a collapse, named)."""
    if pretrain and pretrain.get("experiment_id"):
        text = f"pre-training run {pretrain.get('name') or pretrain['run_id']}"
        source = f"{run_link(pretrain['experiment_id'], pretrain['run_id'], text)}, exported to `{init}`"
    elif pretrain:
        source = (f"`{init}`, made by pre-training run `{pretrain['run_id']}` of another store "
                  f"({pretrain.get('tracking_uri')})")
    else:
        source = f"`{init}`" if init != "random" else "random weights (no pre-training)"
    lines = [f"Fine-tuning for **{task}** on `{data}`: {train_examples:,} training and {eval_examples:,} evaluation "
             "examples (the Datasets section).",
             f"Started from {source}."]
    if final:
        lines.append("Result on the evaluation set (best epoch): " + ", ".join(
            f"{k} {v:.4g}" for k, v in final.items() if isinstance(v, (int, float))) + ".")
    if collapse:
        lines.append(f"**Warning:** {collapse}")
    return "\n\n".join(lines)
