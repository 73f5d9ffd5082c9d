"""One pre-training job, as `jobs/pretrain.py` and the workflow run it: the steps of `training.job.run_job` (check
where it will write, open or resume its MLflow run, launch the training on Ray Train workers or in this process,
export the final model, diagnose a collapse, end the run) with pre-training's parts.

The run is found again by its checkpoint folder (`--storage`/`--run-name`, the `bert.run_checkpoints` tag): running
the same job again with the same storage and run name resumes from its last checkpoint into the same MLflow run.
One job at a time: the folder's writer lease (storage/lease.py) is held from before that lookup until the
run ends.
Its params are the command line as given plus the flattened `PretrainConfig` (the one `asdict` the checkpoints hold
too).
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert_core.config import BertConfig
from corpus.schema import read_manifest
from pretraining.config import ModelConfig, PretrainConfig
from pretraining.loop import SLOWED_TAG, STOPPED_TAG, fit
from storage.fs import is_url
from tracking.datasets import log_dataset
from tracking.lineage import pretraining_lineage
from tracking.params import flatten_params
from tracking.runs import RUN_NAME_TAG, Run, metric_history, run_metrics, run_tags
from tracking.store import DEFAULT_EXPERIMENT
from training.collapse import Collapse, mlm_check
from training.defaults import default_lr
from training.export import PRETRAIN_LINEAGE, read_lineage
from training.job import JobParts, Prepared, run_job
from training.launch import LaunchConfig
from training.model_fetch import local_model_dir

log = logging.getLogger(__name__)

# The figures a finished job reports on its last line (and the workflow puts on its summary). Throughput is the
# run's steady mean (compile warm-up excluded: `run_*`), not the last logging window's.
KEY_METRICS = ("loss", "mlm_accuracy", "nsp_accuracy", "eval_loss", "eval_mlm_accuracy", "eval_nsp_accuracy",
               "eval_mlm_top_token_share", "sequences_per_second", "mfu")
RUN_MEAN = {"sequences_per_second": "run_sequences_per_second", "mfu": "run_mfu"}


@dataclass(frozen=True)
class PretrainJob:
    config: PretrainConfig
    """The run's whole config, final (the micro-batch already planned); logged flattened as the MLflow params."""
    launch: LaunchConfig
    """Where and on how many workers it trains; its `name` is the run name: the checkpoint folder and the MLflow
    run."""
    tracking_uri: str
    """The MLflow tracking URI (a server URL or a local store)."""
    experiment: str = DEFAULT_EXPERIMENT
    """The MLflow experiment: one for the whole pipeline, so the build's, pre-training's and fine-tuning's runs sit
    side by side."""
    parent_run_id: str | None = None
    """Log the run as a child of this MLflow run (e.g. the workflow's); None: a top-level run."""
    export: str | None = None
    """Where the final model goes (local folder or URL); None: the MLflow artifact only."""
    flags: Mapping[str, Any] = field(default_factory=dict)
    """The command line as given, logged beside the config."""

    def __post_init__(self) -> None:
        for world in range(self.launch.fewest_workers, self.launch.num_workers + 1):
            self.config.data.for_world(world)  # every world size the run may get shares the batch, or says the fix


@dataclass(frozen=True)
class JobResult:
    run_id: str
    """The MLflow run's id."""
    checkpoints: str
    """The run's checkpoint folder (local or URL)."""
    export: str | None
    """Where the final model was exported (the job's `export`); None: the MLflow artifact only."""
    metrics: dict[str, float]
    """The KEY_METRICS the run logged last (throughput: the run's mean)."""
    stopped: str | None = None
    """E.g. "--max-minutes at step 400 of 1500" when the budget ended it early; None: not stopped early."""
    collapse: str | None = None
    """Set when held-out MLM accuracy is stuck at the most frequent token's share: what to try; None otherwise."""
    slowed: str | None = None
    """Set when the machine's load made the run slow (`training.progress.Progress.machine_note`); None otherwise."""


def params_of(job: PretrainJob) -> dict[str, Any]:
    config, data = job.config, job.config.data
    # The datasets are the run's MLflow dataset inputs (`log_inputs`): named here, not their whole manifests.
    datasets = {"data.train": data.train, "eval.data": config.eval.data if config.eval else None}
    params = {k: v for k, v in flatten_params(config).items() if not k.startswith(tuple(f"{d}." for d in datasets))}
    for prefix, m in datasets.items():
        if m is not None:
            params |= {f"{prefix}.url": m.url, f"{prefix}.sha256": m.sha256, f"{prefix}.instances": m.instances,
                       f"{prefix}.max_seq_length": m.max_seq_length}
    return {**{k: v for k, v in job.flags.items() if v is not None}, **params,
            "micro_batch_size_resolved": data.micro_batch_size, "grad_accumulation_steps": data.accum}


def model_config(preset: str, init: str | None, vocab_size: int, init_cache: str | None = None,
                 endpoint_url: str | None = None) -> ModelConfig:
    """``init``'s architecture and vocabulary hash when given (the job fetches a URL once, into ``init_cache``),
    else the preset sized to ``vocab_size``. The config only names the model; the workers fetch it where they run."""
    from bert_core import PRESETS

    if init is None:
        if preset not in PRESETS:
            raise ValueError(f"unknown --preset {preset!r}; choose one of {sorted(PRESETS)}")
        return ModelConfig(PRESETS[preset](vocab_size=vocab_size))
    remote = is_url(init)
    if remote and not init_cache:
        raise ValueError(f"--init {init}: a URL needs a local folder to fetch it into (init_cache)")
    init = init if remote else str(Path(init).resolve())
    cache = str(Path(init_cache).resolve()) if remote else None
    model_dir = local_model_dir(init, cache, endpoint_url if remote else None)
    vocab = model_dir / "vocab.txt"
    sha = hashlib.sha256(vocab.read_bytes()).hexdigest() if vocab.is_file() else ""
    return ModelConfig(BertConfig.from_json_file(model_dir / "config.json"), init, sha, cache,
                       endpoint_url if remote else None)


def tags_of(job: PretrainJob) -> dict[str, str]:
    """The run's tags (its checkpoint folder's, `training.job.RUN_KEY_TAG`, is the skeleton's)."""
    train, ev, init = job.config.data.train, job.config.eval, job.config.model.init
    tags = {RUN_NAME_TAG: job.launch.name, "job": "pretrain", "dataset.url": train.url,
            "dataset.manifest_sha256": train.sha256, "dataset.config_hash": train.config_hash,
            "dataset.vocab_sha256": train.vocab.sha256}
    if ev is not None:
        tags.update({"eval_dataset.url": ev.data.url, "eval_dataset.manifest_sha256": ev.data.sha256})
    if init:
        tags["init"] = init
        m = job.config.model  # a URL's local copy (fetched already): the lineage file travels with the model
        init_dir = local_model_dir(m.init, m.init_cache, m.init_endpoint_url)
        lineage = read_lineage(init_dir, init_dir.parent)
        if lineage:
            tags["lineage.init_run_id"] = lineage["mlflow_run_id"]
    return tags


def log_inputs(job: PretrainJob, run: Run) -> None:
    """The datasets the run reads, as MLflow dataset inputs ("training", "eval"): the same name and digest as the
    build's run logged for its output, so the UI shows which build a model was trained on; and the run's lineage
    links (tracking.lineage: the build's run, the model it starts from, where the model goes)."""
    sets = {"training": job.config.data.train, "eval": job.config.eval.data if job.config.eval else None}
    for context, read in sets.items():
        if read is not None:
            now = read_manifest(read.url, job.config.data.endpoint_url)
            if now.sha256 != read.sha256:
                raise ValueError(f"{read.url}: the dataset changed after this job read it (its manifest's "
                                 "digest differs); run the job again")
            log_dataset(job.tracking_uri, run.run_id, read, context)
    pretraining_lineage(job.tracking_uri, run.run_id, job.config.data.train, sets["eval"], job.export,
                        job.config.model.init)


def _results(job: PretrainJob, run: Run) -> tuple[dict[str, float], str | None, str | None]:
    """The KEY_METRICS the run logged last (throughput: the run's mean), its `stopped_by` and `slowed_by` tags."""
    metrics = run_metrics(job.tracking_uri, run.run_id)
    metrics |= {k: metrics[mean] for k, mean in RUN_MEAN.items() if mean in metrics}
    tags = run_tags(job.tracking_uri, run.run_id)
    return {k: metrics[k] for k in KEY_METRICS if k in metrics}, tags.get(STOPPED_TAG), tags.get(SLOWED_TAG)


def run_pretraining(job: PretrainJob) -> JobResult:
    """The whole job (`training.job.run_job`'s steps). ValueError (before any work: an unreachable tracking
    server, an export that cannot be written, a bad --parent-run-id) says what to fix."""
    cfg = job.config
    done = run_job(JobParts(
        what="pre-training run", fit=fit, config=cfg, launch=job.launch, tracking_uri=job.tracking_uri,
        experiment=job.experiment, lineage=PRETRAIN_LINEAGE, destination=job.export, resume=True,
        prepare=lambda: Prepared(params_of(job), tags_of(job), job.parent_run_id),
        log_inputs=lambda run: log_inputs(job, run), diagnose=lambda run, _: diagnose(job, run)))
    metrics, stopped, slowed = _results(job, done.run)
    return JobResult(done.run.run_id, done.checkpoints, job.export, metrics, stopped,
                     done.collapse.message if done.collapse else None, slowed)


def diagnose(job: PretrainJob, run: Run) -> Collapse | None:
    """A collapsed MLM (training.collapse.mlm_check), for the skeleton's WARNING and `collapse` tag; a run still
    learning near its baseline is a note in the log, not a warning."""
    data, width = job.config.data, job.config.model.bert.hidden_size
    found = mlm_check(run_metrics(job.tracking_uri, run.run_id), metric_history(job.tracking_uri, run.run_id,
                      "mlm_loss"), lr=job.config.optimizer.lr, default_lr=default_lr(width, "pretrain"),
                      max_steps=job.config.max_steps, sequences_per_step=data.batch_size,
                      seq_len_histogram=data.train.seq_len_histogram)
    if found is not None and not found.collapsed:
        log.info("%s", found.message)
        return None
    return found
