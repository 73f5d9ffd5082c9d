"""One fine-tuning job, as `jobs/finetune.py` and the workflow run it: the steps of `training.job.run_job`, as
pre-training's job, with fine-tuning's parts: check everything that can be wrong with the inputs before any worker
starts (the task data prepared once, here), open the job's MLflow run (nested under the pre-training run its weights
came from), launch `finetuning.fit` (Ray Train workers or this process) with the prepared task, export the best
epoch's model in the Hugging Face layout with its label map, log the final metrics, end the run.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetuning.config import FinetuneConfig
from finetuning.evaluation import MAIN_METRIC
from finetuning.loop import BEST_METRICS_FILE, fit
from finetuning.prepare import PreparedTask
from finetuning.prepare import prepare as prepare_task
from finetuning.task_model import hidden_size_of, model_dir_of, tokenizer_for
from tracking.datasets import log_task_data
from tracking.lineage import finetuning_lineage
from tracking.notes import NOTE_TAG, finetune_note
from tracking.params import flatten_params
from tracking.runs import Run, run_summary
from tracking.store import DEFAULT_EXPERIMENT
from training.collapse import Collapse, diagnose
from training.defaults import default_lr
from training.export import FINETUNE_LINEAGE, read_lineage
from training.job import JobParts, Prepared, run_job
from training.launch import LaunchConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinetuneJob:
    config: FinetuneConfig
    """The run's configuration: task data, starting weights, schedule, seed."""
    launch: LaunchConfig
    """Where the workers run. Its `name` is the run name; its storage keeps the epochs' checkpoints."""
    tracking_uri: str
    """The MLflow tracking store the run is logged to."""
    output: str
    """Where the best epoch's model goes, in the Hugging Face layout with its label map (a local folder or a URL)."""
    experiment: str = DEFAULT_EXPERIMENT
    """The MLflow experiment: by default the one the build and pre-training log to as well, so the pipeline's runs
    sit side by side."""
    parent_run_id: str | None = None
    """The MLflow run to nest under (the workflow's); None: the pre-training run the weights came from, when it is in
    this store."""
    keep_checkpoints: bool = False
    """False: the launch's checkpoint folder is removed once the model is exported (jobs/finetune.py keeps it only
    with --storage-path)."""
    flags: Mapping[str, Any] = field(default_factory=dict)
    """The command line as given, logged as params beside the config (flags left unset are not)."""


@dataclass(frozen=True)
class FinetuneResult:
    run_id: str
    """The job's MLflow run."""
    output: str
    """Where the best epoch's model was exported."""
    final: dict[str, float]
    """The best epoch's evaluation (without the `eval_` prefix), its number `best_epoch` and the job's `job_seconds`."""
    collapse: str | None = None
    """None, or what the best model does wrong (predicts one class, a constant, only O) and what to try."""


def _parent_and_tags(job: FinetuneJob) -> tuple[str | None, dict[str, str], dict[str, str] | None]:
    """The run's parent (the workflow's, else the pre-training run the weights came from, when in this store), the
    lineage tags, and the pre-training run as its description links it (None without one)."""
    model, parent = job.config.model, job.parent_run_id
    tags = {"job": "finetune", "task": job.config.data.task, "lineage.init": model.init}
    model_dir = model_dir_of(model)
    lineage = read_lineage(model.init, model_dir, model_dir.parent) if model_dir is not None else None
    pretrain = None
    if lineage:
        tags["lineage.pretrain_run_id"] = lineage["mlflow_run_id"]
        tags["lineage.pretrain_tracking_uri"] = lineage["tracking_uri"]
        pretrain = {"run_id": lineage["mlflow_run_id"], "tracking_uri": lineage["tracking_uri"]}
        if lineage["tracking_uri"] in ("", job.tracking_uri):
            found = run_summary(job.tracking_uri, lineage["mlflow_run_id"])
            if found:
                pretrain = found
                parent = parent or found["run_id"]
            else:
                log.warning("pre-training run %s is not in %s; lineage kept as a tag only",
                            lineage["mlflow_run_id"], job.tracking_uri)
    return parent, tags, pretrain


def _log_data(job: FinetuneJob, run: Run, prepared: PreparedTask) -> None:
    """The task data as the run's dataset inputs (the runs table's Dataset column): the training file, and the
    evaluation file or the held-out part of the training file, each with what selects its rows."""
    data = job.config.data
    rows = {"split_eval_from_train": data.split_eval_from_train, "split_seed": data.split_seed}
    train_profile = {**rows, "max_train_examples": data.max_train_examples,
                     "examples": prepared.train.num_examples}
    log_task_data(job.tracking_uri, run.run_id, data.train, context="training", profile=train_profile,
                  name=Path(data.train).name, endpoint_url=job.launch.endpoint_url)
    eval_profile = {**rows, "max_eval_examples": data.max_eval_examples, "examples": prepared.eval.num_examples}
    eval_name = (Path(data.eval).name if data.eval else
                 f"{Path(data.train).name} (held-out {data.split_eval_from_train:g})")
    log_task_data(job.tracking_uri, run.run_id, data.eval or data.train, context="eval", profile=eval_profile,
                  name=eval_name, endpoint_url=job.launch.endpoint_url)


def _note(job: FinetuneJob, prepared: PreparedTask, pretrain: dict[str, str] | None,
          final: dict[str, float] | None = None, collapse: str | None = None) -> str:
    data = job.config.data
    return finetune_note(task=data.task, init=job.config.model.init, data=Path(data.train).name,
                         train_examples=prepared.train.num_examples, eval_examples=prepared.eval.num_examples,
                         pretrain=pretrain, final=final, collapse=collapse)


def _facts(job: FinetuneJob, prepared: PreparedTask) -> dict[str, Any]:
    """What the data turned out to be, logged beside the config."""
    return {"num_labels": prepared.num_labels, "train_examples": prepared.train.num_examples,
            "eval_examples": prepared.eval.num_examples, "train_rows": len(prepared.train.features),
            "eval_rows": len(prepared.eval.features), "init_dir": model_dir_of(job.config.model) or "random",
            "label_names": list(prepared.label_map.names) if prepared.label_map else None}


def run_finetuning(job: FinetuneJob) -> FinetuneResult:
    """The whole job (`training.job.run_job`'s steps). ValueError, before any worker starts, names what to fix (a
    column, a label, a file, a flag)."""
    t0 = time.perf_counter()
    config, launch = job.config, job.launch
    task: dict[str, Any] = {}  # what preparing found, for the steps after it

    def prepare() -> Prepared:  # every check of the data, here, once, before the run exists
        if config.schedule.batch_size % launch.num_workers:
            raise ValueError(f"--batch-size {config.schedule.batch_size} (global) must divide evenly over "
                             f"--num-workers {launch.num_workers}")
        tokenizer, _ = tokenizer_for(config.model)
        task["prepared"] = prepared = prepare_task(config.data, tokenizer)
        parent, tags, task["pretrain"] = _parent_and_tags(job)
        params = {**{k: v for k, v in job.flags.items() if v is not None}, **flatten_params(config),
                  **_facts(job, prepared)}
        return Prepared(params, tags, parent, inputs=prepared)

    def log_inputs(run: Run) -> None:
        finetuning_lineage(job.tracking_uri, run.run_id, launch.name, config.data.task, task["pretrain"])
        _log_data(job, run, task["prepared"])
        run.set_tags({NOTE_TAG: _note(job, task["prepared"], task["pretrain"])})

    def outcome(run: Run, best: Path) -> dict[str, float]:
        """The best epoch's evaluation, its number and the job's seconds, logged as final_* metrics."""
        metrics = json.loads((best / BEST_METRICS_FILE).read_text())
        final = {k.removeprefix("eval_"): v for k, v in metrics.items() if k.startswith("eval_")}
        final.update(best_epoch=int(metrics["epoch"]), job_seconds=round(time.perf_counter() - t0, 1))
        run.log_metrics({f"final_{k}": v for k, v in final.items()})
        return final

    def closing_tags(final: dict[str, float], collapse: Collapse | None) -> dict[str, str]:
        shown = {k: v for k, v in final.items() if k in ("accuracy", "f1", "mcc", "pearson", "exact_match",
                                                        "majority_share", "best_epoch")}
        return {"model_output": job.output,
                NOTE_TAG: _note(job, task["prepared"], task["pretrain"], shown, collapse and collapse.message)}

    done = run_job(JobParts(
        what="fine-tuning run", fit=fit, config=config, launch=launch, tracking_uri=job.tracking_uri,
        experiment=job.experiment, lineage=FINETUNE_LINEAGE, destination=job.output,
        keep_checkpoints=job.keep_checkpoints, prepare=prepare, log_inputs=log_inputs, outcome=outcome,
        diagnose=lambda run, final: diagnose(config.data.task, final, config.schedule.lr, config.schedule.epochs,
                                             default_lr(hidden_size_of(config.model), "finetune")),
        closing_tags=closing_tags))
    final, collapse = done.outcome, done.collapse
    main = MAIN_METRIC[config.data.task]
    log.info("best model (epoch %d, %s %.4g%s) exported to %s; MLflow run %s%s", final["best_epoch"], main,
             final.get(main, float("nan")),
             f", majority class {final['majority_share']:.4g}" if "majority_share" in final else "", job.output,
             done.run.run_id, "; but it has COLLAPSED (see the warning above)" if collapse else "")
    return FinetuneResult(done.run.run_id, job.output, final, collapse.message if collapse else None)
