"""Exports are all-or-nothing (storage/publish.py through training/export.py): on local disk and on a real
S3-protocol server (moto on loopback), an export interrupted part-way leaves the previous complete export readable
(or nothing, when there was none), never a mix of the two; `from_pretrained(local export)` keeps working."""
from __future__ import annotations

import json
import os

import boto3
import pytest
import torch

import storage.publish
from bert_core import BertForPreTraining, bert_tiny
from storage import fs as storage_fs
from storage.publish import MARKER, VERSIONS
from tracking.runs import open_run
from training.export import PRETRAIN_LINEAGE, export_model
from training.model_fetch import fetch_model


def _model(tmp_path, seed: int):
    torch.manual_seed(seed)
    model = BertForPreTraining(bert_tiny(vocab_size=60))
    out = tmp_path / f"model-{seed}"
    model.save_pretrained(out)
    return model, out


def _same_weights(loaded, model) -> None:
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


def test_a_local_export_is_replaced_whole(tmp_path, mlflow_uri):
    run = open_run(mlflow_uri, "export", "r")
    first, first_dir = _model(tmp_path, 1)
    second, second_dir = _model(tmp_path, 2)
    dest = tmp_path / "models" / "bert"
    export_model(first_dir, str(dest), run, PRETRAIN_LINEAGE)
    _same_weights(BertForPreTraining.from_pretrained(dest), first)
    export_model(second_dir, str(dest), run, PRETRAIN_LINEAGE)
    _same_weights(BertForPreTraining.from_pretrained(dest), second)
    # No staging folder, no old copy left; the destination's lease record stays, released.
    assert sorted(os.listdir(dest.parent)) == ["bert", "bert.lease.json"]


def test_a_local_export_killed_mid_swap_leaves_the_previous_one(tmp_path, mlflow_uri, monkeypatch):
    """Where the atomic exchange is unavailable the old folder is renamed aside first: a kill between the two renames
    leaves the destination missing, and the next export (or check) restores the previous export before anything."""
    run = open_run(mlflow_uri, "export", "r")
    first, first_dir = _model(tmp_path, 1)
    _, second_dir = _model(tmp_path, 2)
    dest = tmp_path / "bert"
    export_model(first_dir, str(dest), run, PRETRAIN_LINEAGE)
    before = _files(dest)
    monkeypatch.setattr(storage.publish, "_exchange", lambda a, b: False)
    real_rename, renames = os.rename, []

    def killed_on_second_rename(src, dst):
        renames.append((src, dst))
        if len(renames) == 2:
            raise KeyboardInterrupt("killed between the renames")
        return real_rename(src, dst)

    monkeypatch.setattr(storage.publish.os, "rename", killed_on_second_rename)
    with pytest.raises(KeyboardInterrupt):
        export_model(second_dir, str(dest), run, PRETRAIN_LINEAGE)
    monkeypatch.setattr(storage.publish.os, "rename", real_rename)
    assert not dest.exists() and (tmp_path / ".bert.previous").is_dir()  # the window the kill hit
    from training.export import check_destination

    check_destination(str(dest))  # what the next job does first
    assert _files(dest) == before
    _same_weights(BertForPreTraining.from_pretrained(dest), first)


def test_a_local_export_uses_an_atomic_exchange_where_there_is_one(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "f").write_text("a")
    (b / "f").write_text("b")
    if not storage.publish._exchange(a, b):
        pytest.skip("this file system has no renameat2(RENAME_EXCHANGE); the rename-aside fallback is tested above")
    assert (a / "f").read_text() == "b" and (b / "f").read_text() == "a"


def test_an_s3_export_interrupted_between_files_reads_as_the_previous_one(tmp_path, mlflow_uri, s3_bucket,
                                                                           monkeypatch):
    endpoint, bucket = s3_bucket
    url = f"s3://{bucket}/models/bert"
    run = open_run(mlflow_uri, "export", "r")
    first, first_dir = _model(tmp_path, 1)
    _, second_dir = _model(tmp_path, 2)
    export_model(first_dir, url, run, PRETRAIN_LINEAGE, endpoint)
    fetched = fetch_model(url, tmp_path / "cache", endpoint)
    _same_weights(BertForPreTraining.from_pretrained(fetched), first)
    first_files = _files(fetched)

    fs, _ = storage_fs.filesystem_for(url, endpoint)
    _killed_after(2, fs, monkeypatch, lambda: export_model(second_dir, url, run, PRETRAIN_LINEAGE, endpoint))
    s3 = boto3.client("s3", endpoint_url=endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="models/bert/")["Contents"]]
    assert len({k.split("/")[3] for k in keys if k.startswith(f"models/bert/{VERSIONS}/")}) == 2  # half a new one

    again = fetch_model(url, tmp_path / "cache2", endpoint)  # a fresh reader: the previous complete export
    assert _files(again) == first_files
    _same_weights(BertForPreTraining.from_pretrained(again), first)


def _killed_after(files: int, fs, monkeypatch, export) -> None:
    """``export()`` with its upload killed (a KeyboardInterrupt, as from a signal) once ``files`` files are up;
    ``fs`` is the cached filesystem instance the export uses. The upload is restored afterwards."""
    real_put, puts = fs.put_file, []

    def killed(lpath, rpath, *a, **k):
        puts.append(rpath)
        if len(puts) == files + 1:
            raise KeyboardInterrupt("killed between files")
        return real_put(lpath, rpath, *a, **k)

    monkeypatch.setattr(fs, "put_file", killed)
    with pytest.raises(KeyboardInterrupt):
        export()
    monkeypatch.setattr(fs, "put_file", real_put)


def test_an_interrupted_first_s3_export_is_refused(tmp_path, mlflow_uri, s3_bucket, monkeypatch):
    endpoint, bucket = s3_bucket
    url = f"s3://{bucket}/models/first"
    run = open_run(mlflow_uri, "export", "r")
    _, model_dir = _model(tmp_path, 3)
    fs, _ = storage_fs.filesystem_for(url, endpoint)
    _killed_after(1, fs, monkeypatch, lambda: export_model(model_dir, url, run, PRETRAIN_LINEAGE, endpoint))
    assert not storage_fs.exists(f"{url}/{MARKER}", endpoint)
    with pytest.raises(ValueError, match=r"^s3://.*/models/first holds an incomplete export .*export to it again$"):
        fetch_model(url, tmp_path / "cache", endpoint)


def test_old_versions_are_pruned_and_the_pointer_is_checked(tmp_path, mlflow_uri, s3_bucket):
    endpoint, bucket = s3_bucket
    url = f"s3://{bucket}/m"
    run = open_run(mlflow_uri, "export", "r")
    for seed in (1, 2, 3):
        export_model(_model(tmp_path, seed)[1], url, run, PRETRAIN_LINEAGE, endpoint)
    s3 = boto3.client("s3", endpoint_url=endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="m/")["Contents"]]
    assert len({k.split("/")[2] for k in keys if k.startswith(f"m/{VERSIONS}/")}) == 2  # the current and previous
    pointer = json.loads(s3.get_object(Bucket=bucket, Key=f"m/{MARKER}")["Body"].read())
    pointer["files"]["../../other/secret"] = 1  # a pointer edited to reach outside the export
    s3.put_object(Bucket=bucket, Key=f"m/{MARKER}", Body=json.dumps(pointer).encode())
    with pytest.raises(ValueError, match=r"export.json: file '../../other/secret' is not a relative name"):
        fetch_model(url, tmp_path / "cache", endpoint)


def test_an_export_waits_for_another_export_then_refuses_leaving_it_alone(tmp_path, mlflow_uri, monkeypatch):
    import training.export
    from storage.lease import LeaseHeld, holding, lease_url_beside

    run = open_run(mlflow_uri, "export", "r")
    first, first_dir = _model(tmp_path, 1)
    _, second_dir = _model(tmp_path, 2)
    dest = tmp_path / "bert"
    export_model(first_dir, str(dest), run, PRETRAIN_LINEAGE)
    before = _files(dest)
    monkeypatch.setattr(training.export, "EXPORT_WAIT_SECONDS", 3.0)
    with holding(lease_url_beside(str(dest)), str(dest), "export"):  # another job is publishing there
        with pytest.raises(LeaseHeld, match=rf"^{dest} is being written by another export \(host .*pid {os.getpid()}"):
            export_model(second_dir, str(dest), run, PRETRAIN_LINEAGE)
    assert _files(dest) == before
    _same_weights(BertForPreTraining.from_pretrained(dest), first)


def test_is_complete_reads_the_pointer_on_s3_and_the_folder_locally(tmp_path, mlflow_uri, s3_bucket):
    """What the workflow asks before it skips a finished stage (workflows/specs.py)."""
    from storage.publish import is_complete

    endpoint, bucket = s3_bucket
    run = open_run(mlflow_uri, "export", "r")
    _, model_dir = _model(tmp_path, 1)
    names = ("config.json", "model.safetensors", PRETRAIN_LINEAGE)
    assert not is_complete(f"s3://{bucket}/e", names, endpoint) and not is_complete(str(tmp_path / "e"), names)
    export_model(model_dir, f"s3://{bucket}/e", run, PRETRAIN_LINEAGE, endpoint)
    export_model(model_dir, str(tmp_path / "e"), run, PRETRAIN_LINEAGE)
    assert is_complete(f"s3://{bucket}/e", names, endpoint) and is_complete(str(tmp_path / "e"), names)
    assert not is_complete(f"s3://{bucket}/e", ("tokenizer.json",), endpoint)


def test_an_export_that_lost_its_lease_mid_upload_never_switches(tmp_path, mlflow_uri, s3_bucket, monkeypatch):
    """An export stalls between its uploads and its pointer (the switch) past the lease's stale time, and another
    export takes the destination over: the stalled one proves the lease before the switch, fails (LeaseLost naming
    the taker) and leaves the previous export in place, unpointed files and all."""
    import time

    import storage.lease_record as lease_record
    from storage.lease import STALE_ENV, Lease, held
    from storage.lease_record import LeaseLost

    endpoint, bucket = s3_bucket
    url = f"s3://{bucket}/models/bert"
    monkeypatch.setenv(STALE_ENV, "4")  # a beat every second: a loaded machine's slow beats do not end the export early
    monkeypatch.setattr(lease_record, "exit_process", lambda message: None)  # step down without ending the test
    run = open_run(mlflow_uri, "export", "r")
    first, first_dir = _model(tmp_path, 1)
    _, second_dir = _model(tmp_path, 2)
    export_model(first_dir, url, run, PRETRAIN_LINEAGE, endpoint)
    before = storage_fs.read_bytes(f"{url}/{MARKER}", endpoint)
    uploading, takers = storage.publish.retrying, []

    def stalled(fn, doing, *args, **kwargs):
        if doing.startswith("upload") and not takers:  # the export stalls here, its lease's threads with it
            lease = held(url)
            lease._stop.set()
            for thread in lease._threads:
                thread.join()
            time.sleep(4 + 2.5)  # past the stale time by the store's clock (S3 dates are to the second)
            takers.append(Lease(lease.url, lease.target, "export", endpoint).acquire())
        return uploading(fn, doing, *args, **kwargs)

    monkeypatch.setattr(storage.publish, "retrying", stalled)
    try:
        with pytest.raises(LeaseLost, match=r"lost its writer lease to export on host .*pid"):
            export_model(second_dir, url, run, PRETRAIN_LINEAGE, endpoint)
    finally:
        for taker in takers:
            taker.release()
    assert storage_fs.read_bytes(f"{url}/{MARKER}", endpoint) == before
    _same_weights(BertForPreTraining.from_pretrained(fetch_model(url, tmp_path / "cache", endpoint)), first)
