"""Files other people could write are read with their names confined and their sizes bounded
(storage/untrusted.py and its callers): a dataset manifest naming a shard or a vocabulary outside its folder
(absolute, '..', a URL scheme) is refused in one line naming the manifest; oversized manifests, vocabularies,
config.json files, weight indexes, train states and workflow markers are refused naming the file, unread."""
from __future__ import annotations

import json
import shutil

import pytest

import corpus.schema
from corpus.schema import read_manifest
from storage.untrusted import check_relative_name, read_local_bounded


@pytest.mark.parametrize("name", ["shards/part-00000-of-00004.parquet", "vocab.txt", "a/b/c.parquet"])
def test_plain_relative_names_pass(name):
    assert check_relative_name(name, "m.json") == name


@pytest.mark.parametrize("name", ["/etc/passwd", "../outside.parquet", "shards/../../x.parquet", "s3://other/x",
                                  "file:///etc/passwd", "C:x.parquet", "shards//x", "", None, "a\\b", "~/x",
                                  "shards/./x", "x\n.parquet", 7])
def test_names_that_leave_the_folder_are_refused(name):
    with pytest.raises(ValueError, match=r"^m.json: shard file .* is not a relative name inside its folder"):
        check_relative_name(name, "m.json", "shard file")


@pytest.fixture
def dataset(tiny_pretrain_data, tmp_path):
    """A copy of a real built dataset whose manifest a test may edit."""
    folder = tmp_path / "ds"
    shutil.copytree(tiny_pretrain_data["train"], folder)
    return folder


def _edit(folder, change) -> None:
    path = folder / "manifest.json"
    m = json.loads(path.read_text())
    change(m)
    path.write_text(json.dumps(m))


@pytest.mark.parametrize("bad", ["/etc/hostname", "../train/shards/part-00000-of-00004.parquet", "s3://x/y.parquet"])
def test_a_manifest_naming_a_shard_outside_its_folder_is_refused(dataset, bad):
    read_manifest(str(dataset))  # the copy is a valid dataset

    def point_outside(m):
        m["shards"][0]["file"] = bad

    _edit(dataset, point_outside)
    with pytest.raises(ValueError) as refused:
        read_manifest(str(dataset))
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{dataset / 'manifest.json'}: shard file {bad!r}")


def test_a_manifest_naming_a_vocabulary_outside_its_folder_is_refused(dataset):
    _edit(dataset, lambda m: m["vocab"].update(file="../../../etc/passwd"))
    with pytest.raises(ValueError, match=r"manifest.json: vocab file '../../../etc/passwd' is not a relative name"):
        read_manifest(str(dataset))


def test_oversized_manifest_and_vocabulary_are_refused_unread(dataset, monkeypatch):
    size = (dataset / "manifest.json").stat().st_size
    monkeypatch.setattr(corpus.schema, "MAX_MANIFEST_BYTES", size - 1)
    with pytest.raises(ValueError, match=rf"^manifest {dataset / 'manifest.json'} is {size} bytes, more than"):
        read_manifest(str(dataset))
    monkeypatch.setattr(corpus.schema, "MAX_MANIFEST_BYTES", size)
    monkeypatch.setattr(corpus.schema, "MAX_VOCAB_BYTES", 100)
    with pytest.raises(ValueError, match=rf"^vocabulary {dataset / 'vocab.txt'} is \d+ bytes, more than the 100"):
        read_manifest(str(dataset))


def test_a_manifest_that_is_not_an_object_is_refused(dataset):
    (dataset / "manifest.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a JSON object"):
        read_manifest(str(dataset))


def test_model_folder_files_are_bounded_and_confined(tmp_path):
    from bert_core import bert_tiny
    from bert_core.config import MAX_CONFIG_BYTES, BertConfig
    from bert_core.hf import load_weights

    cfg = tmp_path / "config.json"
    bert_tiny().to_json_file(cfg)
    assert BertConfig.from_json_file(cfg).num_hidden_layers == 2
    cfg.write_text(json.dumps({"hidden_size": 128, "padding": " " * MAX_CONFIG_BYTES}))
    with pytest.raises(ValueError, match=rf"config.json is over {MAX_CONFIG_BYTES} bytes"):
        BertConfig.from_json_file(cfg)

    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {
        "bert.embeddings.word_embeddings.weight": "../../elsewhere.safetensors"}}))
    with pytest.raises(ValueError,
                       match=r"shard file '../../elsewhere.safetensors' is not a file name beside the index"):
        load_weights(tmp_path)


def test_train_state_and_workflow_markers_are_bounded(tmp_path, monkeypatch):
    import training.checkpoint
    from training.checkpoint import TRAIN_STATE_JSON, load_train_state

    (tmp_path / TRAIN_STATE_JSON).write_text(json.dumps({"step": 1, "pad": "x" * 1000}))
    monkeypatch.setattr(training.checkpoint, "MAX_TRAIN_STATE_JSON_BYTES", 100)
    with pytest.raises(ValueError, match=rf"^train state {tmp_path / TRAIN_STATE_JSON} is over 100 bytes"):
        load_train_state(tmp_path)

    marker = tmp_path / "m.json"
    marker.write_bytes(b"{}" + b" " * 200)
    assert read_local_bounded(marker, 202, "workflow marker") == marker.read_bytes()
    with pytest.raises(ValueError, match="workflow marker .*m.json is over 201 bytes"):
        read_local_bounded(marker, 201, "workflow marker")
