"""Fine-tune BERT on a downstream task: sequence / pair classification, regression, token tagging, extractive QA.

    python jobs/finetune.py --task classification --train data.jsonl.gz --split-eval-from-train 0.1 \
        --init /path/to/export_or_checkpoint_or_hf_dir [--epochs 3 --lr 5e-5 --batch-size 32] [--output DIR]

Everything that can be wrong with the inputs (flags, files, columns, labels, vocabulary, MLflow) is checked here,
before any worker starts. Training runs under Ray Train (``finetuning.loop`` in ``training.launch``) on one or many workers; the
best epoch's model is exported in the Hugging Face layout with its label map; one MLflow run records params,
per-epoch metrics, final metrics and the model, linked to the pre-training run the weights came from. The last
line on stdout is the final evaluation metrics as one JSON object. ``--no-ray`` runs the very same loop in this
process (one worker) for debugging and quick runs; ``--init random --preset P`` trains the architecture from scratch.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs._common import setup_logging
from pipeline.storage import is_url, upload_tree
from finetuning.examples import TASKS, TaskColumns
from finetuning.features import TaskTokenizer
from finetuning.prepare import FeatureConfig, PreparedTask, prepare_task
from finetuning.records import FORMATS, read_records, split_train_eval, subsample
from training.tracking import Run, check_tracking_reachable, flatten_params, open_run, resolve_tracking_uri

log = logging.getLogger("finetune")

REPO = Path(__file__).resolve().parent.parent
# For --init random: the vocabulary of bert-base-uncased (and of all-MiniLM), shipped with the repo.
DEFAULT_VOCAB = REPO / "data" / "sample" / "reference" / "bert-base-uncased-vocab.txt"
PRETRAIN_LINEAGE_FILE = "bert_pretrain_run.json"
FINETUNE_LINEAGE_FILE = "bert_finetune_run.json"


@dataclass(frozen=True)
class FinetuneConfig:
    task: str
    train: str
    init: str
    eval: str | None = None
    split_eval_from_train: float | None = None
    data_format: str | None = None
    preset: str | None = None
    vocab: str | None = None
    columns: TaskColumns = TaskColumns()
    features: FeatureConfig = FeatureConfig()
    max_answer_length: int = 30
    epochs: int = 3
    lr: float = 5e-5
    batch_size: int = 32
    eval_batch_size: int = 64
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    seed: int = 42
    split_seed: int = 0
    num_workers: int = 1
    cpus_per_worker: float | None = None
    use_gpu: bool = False
    no_ray: bool = False
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    mlflow_tracking_uri: str | None = None
    experiment: str = "finetune"
    parent_run_id: str | None = None
    output: str | None = None
    storage_path: str | None = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"--task {self.task!r}: use one of {', '.join(TASKS)}")
        if (self.eval is None) == (self.split_eval_from_train is None):
            raise ValueError("give exactly one of --eval URL or --split-eval-from-train FRACTION (e.g. 0.1)")
        if self.init == "random":
            from bert_core.config import PRESETS

            if self.preset not in PRESETS and not (self.preset and Path(self.preset, "config.json").is_file()):
                raise ValueError(f"--init random needs --preset, one of {', '.join(PRESETS)}, or a model directory "
                                 "whose config.json gives the architecture")
        elif self.preset is not None:
            raise ValueError("--preset only applies to --init random (a pre-trained model brings its own config)")
        if self.data_format is not None and self.data_format not in FORMATS:
            raise ValueError(f"--data-format {self.data_format!r}: use one of {', '.join(FORMATS)}")
        for name in ("epochs", "batch_size", "eval_batch_size", "num_workers", "max_answer_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        if self.no_ray and self.num_workers != 1:
            raise ValueError("--no-ray runs one worker in this process; drop --num-workers or --no-ray")
        if self.batch_size % self.num_workers:
            raise ValueError(f"--batch-size {self.batch_size} (global) must divide evenly over "
                             f"--num-workers {self.num_workers}")
        if not self.lr > 0 or not 0 <= self.warmup_ratio <= 1 or self.weight_decay < 0:
            raise ValueError("need --lr > 0, 0 <= --warmup-ratio <= 1 and --weight-decay >= 0")
        if self.cpus_per_worker is not None and not (
                0 < self.cpus_per_worker <= 1 or float(self.cpus_per_worker).is_integer()):
            raise ValueError("--cpus-per-worker must be a fraction <= 1 or a whole number (Ray's rule)")


def parse_args(argv: list[str] | None = None) -> FinetuneConfig:
    p = argparse.ArgumentParser(prog="finetune", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--train", required=True, help="training data URL (any fsspec URL)")
    p.add_argument("--eval", help="evaluation data URL")
    p.add_argument("--split-eval-from-train", type=float, metavar="FRACTION",
                   help="hold out this seeded fraction of --train for evaluation (tasks shipped without a split)")
    p.add_argument("--data-format", choices=FORMATS, help="force the file format (default: from the file name)")
    p.add_argument("--init", required=True, help="HF BERT dir, our export or checkpoint dir, or 'random'")
    p.add_argument("--preset", help="architecture for --init random: bert_tiny, bert_mini, ... or a model dir")
    p.add_argument("--vocab", help=f"vocab.txt for --init random (default: bert-base-uncased's, {DEFAULT_VOCAB.name})")
    p.add_argument("--text-column")
    p.add_argument("--text-pair-column")
    p.add_argument("--label-column", default="label")
    p.add_argument("--tokens-column", default="tokens")
    p.add_argument("--tags-column", default="tags")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=32, help="global batch (split over workers)")
    p.add_argument("--eval-batch-size", type=int, default=64)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--doc-stride", type=int, default=64, help="QA: tokens between window starts")
    p.add_argument("--max-query-length", type=int, default=64)
    p.add_argument("--max-answer-length", type=int, default=30)
    p.add_argument("--warmup-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42, help="weights of new heads / random init, dropout, data order")
    p.add_argument("--split-seed", type=int, default=0,
                   help="seed of --split-eval-from-train and of --max-*-examples subsets (fixed across --seed)")
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--cpus-per-worker", type=float,
                   help="CPUs (and torch threads) per worker; default: the cluster's CPUs / workers. On a box shared "
                        "with other work use 1: oversubscribed OpenMP threads ran ~25x slower here")
    p.add_argument("--use-gpu", action="store_true")
    p.add_argument("--no-ray", action="store_true",
                   help="run the same training loop in this process without Ray (one worker; debugging, quick tests)")
    p.add_argument("--max-train-examples", type=int, help="seeded subset, for quick runs")
    p.add_argument("--max-eval-examples", type=int)
    p.add_argument("--mlflow-tracking-uri")
    p.add_argument("--experiment", default="finetune")
    p.add_argument("--parent-run-id")
    p.add_argument("--output", help="where the best model goes (HF layout); default ./finetune_output/TASK-RUNID")
    p.add_argument("--storage-path", help="Ray Train storage (shared by all nodes on a cluster); default a temp dir")
    a = p.parse_args(argv)
    columns = TaskColumns(text_column=a.text_column, text_pair_column=a.text_pair_column,
                          label_column=a.label_column, tokens_column=a.tokens_column, tags_column=a.tags_column)
    features = FeatureConfig(max_seq_length=a.max_seq_length, doc_stride=a.doc_stride,
                             max_query_length=a.max_query_length)
    return FinetuneConfig(
        task=a.task, train=a.train, init=a.init, eval=a.eval, split_eval_from_train=a.split_eval_from_train,
        data_format=a.data_format, preset=a.preset, vocab=a.vocab, columns=columns, features=features,
        max_answer_length=a.max_answer_length, epochs=a.epochs, lr=a.lr, batch_size=a.batch_size,
        eval_batch_size=a.eval_batch_size, warmup_ratio=a.warmup_ratio, weight_decay=a.weight_decay, seed=a.seed,
        split_seed=a.split_seed,
        num_workers=a.num_workers, cpus_per_worker=a.cpus_per_worker, use_gpu=a.use_gpu, no_ray=a.no_ray,
        max_train_examples=a.max_train_examples, max_eval_examples=a.max_eval_examples,
        mlflow_tracking_uri=a.mlflow_tracking_uri, experiment=a.experiment, parent_run_id=a.parent_run_id,
        output=a.output, storage_path=a.storage_path,
    )


# ---- inputs ------------------------------------------------------------------------------------------------------
def resolve_init(cfg: FinetuneConfig) -> tuple[Path | None, TaskTokenizer, int]:
    """(model dir or None for random, tokenizer, model vocab size); the vocabulary must fit the embeddings."""
    if cfg.init == "random":
        vocab = Path(cfg.vocab) if cfg.vocab else DEFAULT_VOCAB
        tok = TaskTokenizer(vocab)
        return None, tok, tok.vocab_size
    from bert_core.config import BertConfig
    from bert_core.hf import resolve_model_dir

    if not Path(cfg.init).exists():
        raise ValueError(f"--init {cfg.init}: no such directory; pass an HF BERT dir, our export/checkpoint, or random")
    model_dir = resolve_model_dir(cfg.init)
    tok = TaskTokenizer.from_model_dir(model_dir)
    vocab_size = BertConfig.from_json_file(model_dir / "config.json").vocab_size
    if tok.vocab_size > vocab_size:
        raise ValueError(f"{model_dir}/vocab.txt has {tok.vocab_size} entries but the model embeds only {vocab_size}: "
                         "they do not belong together")
    return model_dir, tok, vocab_size


def load_task(cfg: FinetuneConfig, tokenizer: TaskTokenizer) -> PreparedTask:
    train = read_records(cfg.train, cfg.data_format)
    if cfg.split_eval_from_train is not None:
        train, evals = split_train_eval(train, cfg.split_eval_from_train, cfg.split_seed)
        train_src = f"{cfg.train} (train part of a seeded {1 - cfg.split_eval_from_train:.0%} split)"
        eval_src = f"{cfg.train} (held-out {cfg.split_eval_from_train:.0%}, split seed {cfg.split_seed})"
    else:
        evals = read_records(cfg.eval, cfg.data_format)
        train_src, eval_src = cfg.train, cfg.eval
    train = subsample(train, cfg.max_train_examples, cfg.split_seed)
    evals = subsample(evals, cfg.max_eval_examples, cfg.split_seed)
    return prepare_task(cfg.task, train, evals, cfg.columns, tokenizer, cfg.features, train_src, eval_src)


def find_pretrain_lineage(init: str, model_dir: Path | None) -> dict[str, str] | None:
    """The pre-training run that produced ``--init`` (``bert_pretrain_run.json`` beside the weights or above)."""
    if model_dir is None:
        return None
    for d in dict.fromkeys([Path(init), model_dir, model_dir.parent]):
        f = d / PRETRAIN_LINEAGE_FILE
        if f.is_file():
            try:
                info = json.loads(f.read_text())
            except json.JSONDecodeError:
                log.warning("ignoring unreadable %s", f)
                return None
            if info.get("mlflow_run_id"):
                return {"mlflow_run_id": str(info["mlflow_run_id"]), "tracking_uri": str(info.get("tracking_uri", ""))}
    return None


# ---- MLflow ------------------------------------------------------------------------------------------------------
def start_run(cfg: FinetuneConfig, tracking_uri: str, lineage: dict[str, str] | None, extra: dict[str, Any]) -> Run:
    """The job's one MLflow run, tagged with where its weights came from so the UI shows the lineage."""
    from training.tracking import run_exists

    tags = {"job": "finetune", "task": cfg.task, "lineage.init": cfg.init}
    parent = cfg.parent_run_id
    if lineage:
        tags["lineage.pretrain_run_id"] = lineage["mlflow_run_id"]
        tags["lineage.pretrain_tracking_uri"] = lineage["tracking_uri"]
        # Nest under the pre-training run when it lives in this store and no workflow parent was given.
        if not parent and lineage["tracking_uri"] in ("", tracking_uri):
            if run_exists(tracking_uri, lineage["mlflow_run_id"]):
                parent = lineage["mlflow_run_id"]
            else:
                log.warning("pre-training run %s is not in %s; lineage kept as a tag only",
                            lineage["mlflow_run_id"], tracking_uri)
    # Named by task, starting weights and time, so the runs of one experiment can be told apart.
    source = f"random-{Path(cfg.preset).name}" if cfg.init == "random" else Path(cfg.init.rstrip("/")).name
    name = f"finetune-{cfg.task}-{source}-{time.strftime('%Y%m%d-%H%M%S')}"
    return open_run(tracking_uri, cfg.experiment, name, params={**flatten_params(cfg), **extra}, tags=tags,
                    parent_run_id=parent)


# ---- training ----------------------------------------------------------------------------------------------------
def loop_config(cfg: FinetuneConfig, model_dir: Path | None, tokenizer: TaskTokenizer, vocab_size: int,
                run_id: str, tracking_uri: str, threads: int):
    """What every worker needs (the prepared data travels separately)."""
    from training.config import TrackingConfig
    from finetuning.loop import FinetuneLoopConfig

    return FinetuneLoopConfig(
        init=str(model_dir) if model_dir else "random", preset=cfg.preset, vocab_size=vocab_size,
        vocab_file=str(tokenizer.vocab_file), do_lower_case=tokenizer.do_lower_case, pad_id=tokenizer.pad_id,
        seed=cfg.seed, epochs=cfg.epochs, lr=cfg.lr, batch_size=cfg.batch_size, eval_batch_size=cfg.eval_batch_size,
        warmup_ratio=cfg.warmup_ratio, weight_decay=cfg.weight_decay, max_answer_length=cfg.max_answer_length,
        threads_per_worker=threads, tracking=TrackingConfig(tracking_uri=tracking_uri, run_id=run_id),
    )


def train_with_ray(cfg: FinetuneConfig, prepared: PreparedTask, loop_cfg, storage: str,
                   best_dir: Path) -> None:
    """Ray Train over ``--num-workers`` (DDP); the best epoch's checkpoint is copied to ``best_dir``."""
    import ray
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from finetuning.loop import fit
    from training.launch import finetune_worker, init_ray

    init_ray(dashboard=True)
    cpus = cfg.cpus_per_worker
    if cpus is None:
        per = ray.cluster_resources().get("CPU", 1) / cfg.num_workers
        # Ray accepts fractions up to 1 or whole numbers.
        cpus = float(math.floor(per)) if per >= 1 else max(0.25, math.floor(per * 4) / 4)
    loop_cfg = dataclasses.replace(loop_cfg, threads_per_worker=max(1, int(cpus)))
    trainer = TorchTrainer(
        finetune_worker,
        train_loop_config={"fit": fit, "config": loop_cfg, "prepared_ref": ray.put(prepared)},
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                     resources_per_worker={"CPU": cpus}),
        # Only the best epoch reports a checkpoint, so keeping one keeps the best.
        run_config=RunConfig(name=f"finetune-{loop_cfg.tracking.run_id}", storage_path=storage,
                             checkpoint_config=CheckpointConfig(num_to_keep=1)),
    )
    log.info("training on %d worker(s) x %s CPU%s", cfg.num_workers, cpus, " + GPU" if cfg.use_gpu else "")
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError("training finished without a checkpoint; see the worker logs above")
    result.checkpoint.to_directory(str(best_dir))


def train_in_process(cfg: FinetuneConfig, prepared: PreparedTask, loop_cfg, best_dir: Path) -> None:
    """The same loop without Ray (``--no-ray``): one worker in this process, for debugging and quick tests."""
    import torch

    from finetuning.loop import fit

    def keep_best(metrics: dict[str, float], checkpoint_dir: str | None) -> None:
        if checkpoint_dir:
            shutil.rmtree(best_dir, ignore_errors=True)
            shutil.copytree(checkpoint_dir, best_dir)

    threads = max(1, int(cfg.cpus_per_worker or torch.get_num_threads()))
    device = torch.device("cuda" if cfg.use_gpu else "cpu")
    before = torch.get_num_threads()
    try:
        fit(dataclasses.replace(loop_cfg, threads_per_worker=threads), prepared, 0, 1, device, keep_best)
    finally:
        torch.set_num_threads(before)  # the caller's process (a test session, a notebook) keeps its setting


def publish(best_dir: Path, output: str) -> None:
    """Move the best model (HF layout + label map) to ``output`` (a local path or any fsspec URL)."""
    if is_url(output):
        upload_tree(best_dir, output)
        return
    out = Path(output.removeprefix("file://"))
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(best_dir), out)  # a rename on one filesystem: the model appears complete or not at all


def check_output(output: str) -> None:
    if is_url(output):
        return
    out = Path(output.removeprefix("file://"))
    if out.exists() and any(out.iterdir()) and not (out / "config.json").exists():
        raise ValueError(f"--output {out} exists and holds something other than a model; choose a new directory")


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    cfg = parse_args(argv)
    tracking_uri = resolve_tracking_uri(cfg.mlflow_tracking_uri)
    check_tracking_reachable(tracking_uri)
    if cfg.output:
        check_output(cfg.output)
    model_dir, tokenizer, vocab_size = resolve_init(cfg)
    prepared = load_task(cfg, tokenizer)
    lineage = find_pretrain_lineage(cfg.init, model_dir)
    extra = {"num_labels": prepared.num_labels, "train_examples": prepared.train.num_examples,
             "eval_examples": prepared.eval.num_examples, "train_rows": len(prepared.train.features),
             "eval_rows": len(prepared.eval.features), "init_dir": model_dir or "random",
             "label_names": list(prepared.label_map.names) if prepared.label_map else None}
    run = start_run(cfg, tracking_uri, lineage, extra)
    run_id = run.run_id
    output = cfg.output or str(Path.cwd() / "finetune_output" / f"{cfg.task}-{run_id[:8]}")
    own_storage = cfg.storage_path is None
    storage = cfg.storage_path or tempfile.mkdtemp(prefix="finetune-ray-")
    local_out = not is_url(output)
    # Stage beside the output so publishing is a rename, not a copy.
    stage_root = Path(output.removeprefix("file://")).parent if local_out else Path(tempfile.gettempdir())
    stage_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".finetune-staging-", dir=stage_root))
    best_dir = staging / "best"
    loop_cfg = loop_config(cfg, model_dir, tokenizer, vocab_size, run_id, tracking_uri, 1)
    t0 = time.perf_counter()
    try:
        with run.ending():
            if cfg.no_ray:
                train_in_process(cfg, prepared, loop_cfg, best_dir)
            else:
                train_with_ray(cfg, prepared, loop_cfg, storage, best_dir)
            from finetuning.loop import BEST_METRICS_FILE

            best = json.loads((best_dir / BEST_METRICS_FILE).read_text())
            (best_dir / FINETUNE_LINEAGE_FILE).write_text(
                json.dumps({"mlflow_run_id": run_id, "tracking_uri": tracking_uri}) + "\n")
            run.log_artifacts(best_dir, artifact_path="model")
            publish(best_dir, output)
            final = {k.removeprefix("eval_"): v for k, v in best.items() if k.startswith("eval_")}
            final.update(best_epoch=int(best["epoch"]), job_seconds=round(time.perf_counter() - t0, 1))
            run.log_metrics({f"final_{k}": v for k, v in final.items()})
            run.set_tags({"model_output": output})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if own_storage:
            shutil.rmtree(storage, ignore_errors=True)
    log.info("best model (epoch %d) exported to %s; MLflow run %s", final["best_epoch"], output, run_id)
    print(json.dumps({"task": cfg.task, **final, "output": output, "mlflow_run_id": run_id}), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    sys.exit(main())
