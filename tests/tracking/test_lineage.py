"""Lineage both ways in a real MLflow store, read back with MlflowClient: a build's run is found by its dataset's
manifest digest in any experiment; the pre-training run's description links it back; each earlier run lists the
later ones under "Used by", second in its description (where MLflow shows it without "Show more")."""
from __future__ import annotations

from types import SimpleNamespace

from tracking.lineage import DATASET_SHA_TAG, USED_BY_HEADING, find_build_run, finetuning_lineage, pretraining_lineage
from tracking.notes import NOTE_TAG
from tracking.runs import open_run, run_summary

SHA = "ab" * 32


def manifest(name: str, sha: str) -> SimpleNamespace:
    return SimpleNamespace(url=f"/data/{name}", sha256=sha, instances=5281, max_seq_length=64)


def test_links_both_ways_from_build_to_pretraining_to_finetuning(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    build = open_run(uri, "datasets", "build moby-64 seq64", tags={"job": "build_dataset", DATASET_SHA_TAG: SHA,
                                                                   "dataset.result": "built",
                                                                   NOTE_TAG: "Dataset build of x.\n\nFigures."})
    build.end("FINISHED")
    rerun = open_run(uri, "datasets", "build moby-64 seq64", tags={"job": "build_dataset", DATASET_SHA_TAG: SHA,
                                                                   "dataset.result": "already complete"})
    rerun.end("FINISHED")
    assert find_build_run(uri, SHA)["run_id"] == build.run_id  # the run that built it, not the rerun
    assert find_build_run(uri, "cd" * 32) is None

    pre = open_run(uri, "bert", "tiny-moby")  # another experiment than the build's
    pretraining_lineage(uri, pre.run_id, manifest("moby-64", SHA), manifest("held-out", "ef" * 32), "/exports/t")
    note = client.get_run(pre.run_id).data.tags[NOTE_TAG]
    assert (f"Training data: `moby-64`, 5,281 sequences of at most 64 tokens, built by run [build moby-64 seq64]"
            f"(#/experiments/{build.experiment_id}/runs/{build.run_id}?workflowType=machine_learning).") in note
    assert "Eval data: `held-out`, 5,281 sequences of at most 64 tokens (its build has no run in this store)." in note
    assert client.get_run(pre.run_id).data.tags["lineage.training_build_run_id"] == build.run_id
    build_note = client.get_run(build.run_id).data.tags[NOTE_TAG].split("\n\n")
    assert build_note[0] == "Dataset build of x." and build_note[2] == "Figures."
    assert build_note[1] == (f"{USED_BY_HEADING} [pre-training run tiny-moby](#/experiments/{pre.experiment_id}"
                             f"/runs/{pre.run_id}?workflowType=machine_learning).")

    for name in ("ft-a", "ft-b"):
        ft = open_run(uri, "bert", name)
        finetuning_lineage(uri, ft.run_id, name, "classification", run_summary(uri, pre.run_id))
    used = client.get_run(pre.run_id).data.tags[NOTE_TAG].split("\n\n")[1]
    assert used.startswith(USED_BY_HEADING) and "[fine-tuning run ft-a (classification)]" in used
    assert "[fine-tuning run ft-b (classification)]" in used
    # A resumed pre-training run remakes its description and keeps what was made from it.
    pretraining_lineage(uri, pre.run_id, manifest("moby-64", SHA), None, "/exports/t")
    again = client.get_run(pre.run_id).data.tags[NOTE_TAG]
    assert "ft-a" in again and "ft-b" in again and "Eval data" not in again
