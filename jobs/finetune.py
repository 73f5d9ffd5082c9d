"""Fine-tune BERT on a downstream task: sequence / pair classification, regression, token tagging, extractive QA.

    python jobs/finetune.py --task classification --train data.jsonl.gz --split-eval-from-train 0.1 \
        --init /path/to/export_or_checkpoint_or_hf_dir [--epochs 3 --lr 5e-5 --batch-size 32] [--output DIR]

Flags -> `finetuning.FinetuneConfig` -> `finetuning.finetune_job.run_finetuning`, shaped like pre-training: it
checks everything that can be wrong with the inputs (files, columns, labels, vocabulary, MLflow) before any worker
starts, runs `finetuning.fit` on Ray Train workers (DDP) or, with `--no-ray`, in this process, exports the best
epoch's model in the Hugging Face layout with its label map, and records one MLflow run (params, per-epoch
metrics, final metrics, the model) linked to the pre-training run the weights came from. `--init random --preset P`
trains the architecture from scratch. The last line on stdout is the final evaluation metrics as one JSON object.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # `python jobs/X.py` from any shell: find the project; outside its venv, say how in one line
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from jobs._preflight import require_project_env

    require_project_env(__file__)

from finetuning.config import FinetuneConfig
from finetuning.examples import TASKS, TaskColumns
from finetuning.finetune_job import FinetuneJob, run_finetuning
from finetuning.prepare import FeatureConfig, TaskConfig
from finetuning.records import FORMATS
from finetuning.schedule import ScheduleConfig
from finetuning.task_model import DEFAULT_VOCAB, HeadConfig, hidden_size_of
from jobs._common import (
    HelpFormatter,
    finite,
    refuse_bad_names,
    refuse_secrets,
    run_main,
    setup_logging,
)
from jobs._fields import add_field
from storage.fs import absolute, is_url
from storage.redact import redact
from tracking.store import resolve_tracking_uri
from training.defaults import lr_or_default
from training.launch import LaunchConfig

log = logging.getLogger("finetune")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="finetune", description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                formatter_class=HelpFormatter, fromfile_prefix_chars="@")
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--train", required=True, help="training data URL (any fsspec URL)")
    p.add_argument("--eval", help="evaluation data URL")
    p.add_argument("--split-eval-from-train", type=finite(above=0, maximum=1), metavar="FRACTION",
                   help="hold out this seeded fraction of --train for evaluation (tasks shipped without a split)")
    p.add_argument("--data-format", choices=FORMATS, help="force the file format (default: from the file name)")
    p.add_argument("--init", required=True, help="HF BERT dir, our export or checkpoint dir (a path or a URL such as "
                   "s3://bucket/model, fetched beside --output into .init-cache), or 'random'")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint of an s3:// --init or --output (MinIO, Ceph, ...)")
    p.add_argument("--preset", help="architecture for --init random: bert_tiny, bert_mini, ... or a model dir")
    p.add_argument("--vocab", help=f"vocab.txt for --init random (default: bert-base-uncased's, {DEFAULT_VOCAB.name})")
    p.add_argument("--text-column")
    p.add_argument("--text-pair-column")
    add_field(p, "--label-column", TaskColumns)
    add_field(p, "--tokens-column", TaskColumns)
    add_field(p, "--tags-column", TaskColumns)
    add_field(p, "--epochs", ScheduleConfig, type=int, help_suffix="A small or briefly pre-trained model that stays "
              "at the majority class may need more (the job names a collapsed model at the end).")
    # --lr defaults to None, not to ScheduleConfig.lr: the job chooses it for the model's width (job_from).
    p.add_argument("--lr", type=finite(above=0),
                   help="peak learning rate (AdamW, linear decay). Default: chosen for the model's width, 1e-3 for "
                        "bert_tiny (H=128) down to 5e-5 for bert_base (H=768) (training/defaults.py, "
                        "docs/learning-rates.md); the value used is logged. Too low and a small model predicts one "
                        "class; too high and the loss jumps: try a factor of 3 either way")
    add_field(p, "--batch-size", ScheduleConfig, type=int,
              help_suffix="With a larger batch, raise --lr roughly in proportion.")
    add_field(p, "--eval-batch-size", ScheduleConfig, type=int)
    add_field(p, "--max-seq-length", FeatureConfig, type=int)
    add_field(p, "--doc-stride", FeatureConfig, type=int)
    add_field(p, "--max-query-length", FeatureConfig, type=int)
    add_field(p, "--max-answer-length", ScheduleConfig, type=int)
    add_field(p, "--warmup-ratio", ScheduleConfig, type=finite(minimum=0, maximum=1),
              help_suffix="0 turns warm-up off (a high --lr without warm-up can wreck the pre-trained weights in the "
              "first steps).")
    add_field(p, "--weight-decay", ScheduleConfig, type=finite(minimum=0))
    add_field(p, "--seed", FinetuneConfig, type=int)
    add_field(p, "--split-seed", TaskConfig, type=int,
              help_suffix="(--split-eval-from-train, --max-*-examples)")
    add_field(p, "--num-workers", LaunchConfig, type=int)
    p.add_argument("--cpus-per-worker", type=finite(above=0),
                   help="CPUs (and torch threads) per worker; default: the cluster's CPUs / workers. On a box shared "
                        "with other work use 1: oversubscribed OpenMP threads ran ~25x slower here")
    add_field(p, "--use-gpu", LaunchConfig)
    add_field(p, "--no-ray", LaunchConfig, help_suffix="The same training loop, for debugging and quick tests.")
    p.add_argument("--max-train-examples", type=int, help="seeded subset, for quick runs")
    p.add_argument("--max-eval-examples", type=int)
    p.add_argument("--mlflow-tracking-uri")
    add_field(p, "--experiment", FinetuneJob)
    p.add_argument("--parent-run-id")
    p.add_argument("--output", help="where the best model goes (HF layout; a folder or a URL); default "
                   "./finetune_output/RUN_NAME")
    p.add_argument("--storage-path", help="where the epochs' checkpoints go (local, or shared by all nodes on a "
                   "cluster: s3://...), kept; default: a hidden folder beside a local --output, removed at the end")
    refuse_secrets(p, argv)
    a = p.parse_args(argv)
    refuse_bad_names(p, outputs={"--output": a.output, "--storage-path": a.storage_path})
    return a


def data_name(url: str) -> str:
    """A task file's name without its suffixes: rt_sentiment.jsonl.gz -> rt_sentiment."""
    name = Path(url.split("?", 1)[0].rstrip("/")).name
    return name.split(".", 1)[0] or name


def job_from(a: argparse.Namespace) -> FinetuneJob:
    """The flags as typed configs (each validates itself) and where things go."""
    source = f"random-{Path(a.preset or 'none').name}" if a.init == "random" else Path(a.init.rstrip("/")).name
    # <task>-<data>-from-<parent>: a pre-training's "Used by" list tells its fine-tunings apart (the time: reruns).
    name = f"{a.task}-{data_name(a.train)}-from-{source}-{time.strftime('%m%d-%H%M%S')}"
    output = a.output or str(Path.cwd() / "finetune_output" / name)
    beside = Path.cwd() if is_url(output) else Path(output).resolve().parent  # the job's local folders
    # Per output: two jobs started in the same second (a sweep) have the same run name, never the same output.
    storage = a.storage_path or str(beside / ".finetune-checkpoints" / Path(output.rstrip("/")).name)
    columns = TaskColumns(text_column=a.text_column, text_pair_column=a.text_pair_column,
                          label_column=a.label_column, tokens_column=a.tokens_column, tags_column=a.tags_column)
    head = HeadConfig(init=a.init if a.init == "random" else absolute(a.init),
                      preset=absolute(a.preset) if a.preset and os.path.isdir(a.preset) else a.preset,
                      vocab=a.vocab and absolute(a.vocab), cache_dir=str(beside / ".init-cache"),
                      endpoint_url=a.endpoint_url)
    config = FinetuneConfig(
        data=TaskConfig(task=a.task, train=absolute(a.train), eval=a.eval and absolute(a.eval),
                        split_eval_from_train=a.split_eval_from_train,
                        data_format=a.data_format, split_seed=a.split_seed, max_train_examples=a.max_train_examples,
                        max_eval_examples=a.max_eval_examples, columns=columns,
                        features=FeatureConfig(max_seq_length=a.max_seq_length, doc_stride=a.doc_stride,
                                               max_query_length=a.max_query_length)),
        model=head,
        schedule=ScheduleConfig(epochs=a.epochs, batch_size=a.batch_size, eval_batch_size=a.eval_batch_size,
                                lr=lr_or_default(a.lr, hidden_size_of(head), "finetune"), warmup_ratio=a.warmup_ratio,
                                weight_decay=a.weight_decay, max_answer_length=a.max_answer_length),
        seed=a.seed)
    # Only the best epoch writes a checkpoint, so keeping one keeps the best.
    launch = LaunchConfig(num_workers=a.num_workers, cpus_per_worker=a.cpus_per_worker, use_gpu=a.use_gpu,
                          no_ray=a.no_ray, storage=storage, name=name, keep_checkpoints=1, max_failures=0,
                          endpoint_url=a.endpoint_url)
    return FinetuneJob(config, launch, resolve_tracking_uri(a.mlflow_tracking_uri), output, a.experiment,
                       a.parent_run_id, keep_checkpoints=bool(a.storage_path), flags=vars(a))


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args(argv)
    try:
        job = job_from(args)
        result = run_finetuning(job)
    except ValueError as e:  # users' mistakes: one line saying what to fix
        log.error("%s", e)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the run ends KILLED (training.job); a fine-tuning restarts from its start
        print("finetune: interrupted; its MLflow run ended KILLED. Run the same command again to fine-tune anew",
              file=sys.stderr, flush=True)
        return 130
    print(json.dumps(redact({"task": args.task, **result.final, "output": result.output,
                             "mlflow_run_id": result.run_id, "collapse": result.collapse})), flush=True)
    return 0


if __name__ == "__main__":
    run_main(main, "finetune")
