"""Issue 43, item 6, each written as the attack: `python -m pretraining.batches --run` replays only the newest
checkpoint its job committed under the run's writer lease whose files still have the committed digest (what a resume
takes), says which, checks every field of its train state, and fetches no dataset the run did not record. Before: it
replayed the newest `checkpoint-*` folder, committed or not, unverified; a planted state changed the order silently,
`Infinity` or a missing key gave a traceback, and `../../etc` read `/etc/manifest.json`.

The run is made of real parts: a real dataset build (tiny_pretrain_data), checkpoint folders holding a
train_state.json, and commits through a real writer lease (storage/lease.py, the lease record beside the run)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from corpus.schema import read_manifest
from pretraining import batches
from storage.lease import Lease, lease_url_beside
from training.checkpoint import COMMITS, checkpoint_name, commit_entry


def _state(dataset: str, seed: int = 7, step: int = 3) -> dict:
    m = read_manifest(dataset)
    return {"step": step, "world_size": 1, "guard": {"skipped_batches": 0},
            "config": {"data": {"train": {"url": m.url, "sha256": m.sha256}, "micro_batch_size": 8, "batch_size": 8,
                                "length_bucketing": True, "dynamic_masking": False, "packing": False},
                       "runtime": {"seed": seed}, "model": {"bert": {"vocab_size": m.vocab.size}}}}


def _write(run: Path, step: int, state: dict | str) -> Path:
    folder = run / checkpoint_name(step)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train_state.json").write_text(state if isinstance(state, str) else json.dumps(state))
    (folder / "model.safetensors").write_bytes(b"weights of step %d" % step)
    return folder


def _commit(run: Path, *steps: int) -> None:
    lease = Lease(lease_url_beside(str(run)), str(run), "pre-training run", on_lost=lambda m: None).acquire()
    try:
        for step in steps:
            lease.fence.commit(COMMITS, commit_entry(step, run / checkpoint_name(step)))
    finally:
        lease.release()


def _replay(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = batches.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def _digests(text: str) -> list[str]:
    return re.findall(r"^step \d+: ([0-9a-f]{16})$", text, re.M)


@pytest.fixture
def run(tmp_path, tiny_pretrain_data):
    """A run with checkpoint 3 committed (seed 7)."""
    run = tmp_path / "runs" / "r"
    _write(run, 3, _state(tiny_pretrain_data["train"]))
    _commit(run, 3)
    return run


def _expected(data: str, capsys, seed: int = 7) -> list[str]:
    rc, out, _ = _replay(["--data", data, "--batch-size", "8", "--seed", str(seed), "--steps", "1:4"], capsys)
    assert rc == 0
    return _digests(out)


def test_a_committed_checkpoint_is_replayed_and_named(run, tiny_pretrain_data, capsys):
    rc, out, err = _replay(["--run", str(run), "--steps", "1:4"], capsys)
    assert rc == 0, err
    assert _digests(out) == _expected(tiny_pretrain_data["train"], capsys)
    assert "checkpoint-00000003 (step 3), committed by the run's job and verified" in err


def test_a_newer_folder_never_committed_is_not_replayed(run, tiny_pretrain_data, capsys):
    """A planted checkpoint-00000009 with another seed: before, it was the one replayed, silently."""
    _write(run, 9, _state(tiny_pretrain_data["train"], seed=99, step=9))
    rc, out, err = _replay(["--run", str(run), "--steps", "1:4"], capsys)
    assert rc == 0, err
    assert _digests(out) == _expected(tiny_pretrain_data["train"], capsys)
    assert _digests(out) != _expected(tiny_pretrain_data["train"], capsys, seed=99)
    assert "checkpoint-00000003" in err


def test_a_committed_checkpoint_whose_state_was_replaced_is_not_replayed(run, tiny_pretrain_data, capsys):
    _write(run, 6, _state(tiny_pretrain_data["train"], step=6))
    _commit(run, 3, 6)
    _write(run, 6, _state(tiny_pretrain_data["train"], seed=99, step=6))  # replaced after its commit
    rc, out, err = _replay(["--run", str(run), "--steps", "1:4"], capsys)
    assert rc == 0, err
    assert _digests(out) == _expected(tiny_pretrain_data["train"], capsys)
    assert "not replaying checkpoint-00000006: its files differ" in err and "checkpoint-00000003 (step 3)" in err


def test_a_run_with_nothing_committed_is_refused_in_one_line(tmp_path, tiny_pretrain_data, capsys):
    run = tmp_path / "runs" / "r"
    _write(run, 3, _state(tiny_pretrain_data["train"]))
    rc, out, err = _replay(["--run", str(run)], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "none of its checkpoint-* folders was committed" in err


@pytest.mark.parametrize("spoil, needle", [
    (lambda s: s.replace('"seed": 7', '"seed": Infinity'), "Infinity"),
    (lambda s: s.replace('"seed": 7', '"seed": NaN'), "NaN"),
    (lambda s: s.replace('"seed": 7', '"seed": 7.5'), "config.runtime.seed"),
    (lambda s: s.replace('"world_size": 1, ', ''), "no 'world_size'"),
    (lambda s: s.replace('"batch_size": 8', '"batch_size": "8"'), "config.data.batch_size"),
    (lambda s: s.replace('"packing": false', '"packing": 1'), "config.data.packing"),
    (lambda s: s.replace('"guard": {"skipped_batches": 0}', '"guard": 3'), "not a train state"),
])
def test_every_field_is_checked_in_one_line(tmp_path, tiny_pretrain_data, capsys, spoil, needle):
    """Committed by the job (so past the digest check) and still nonsense: one line, exit 2, no traceback."""
    run = tmp_path / "runs" / "r"
    _write(run, 3, spoil(json.dumps(_state(tiny_pretrain_data["train"]))))
    _commit(run, 3)
    rc, out, err = _replay(["--run", str(run)], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert "train_state.json" in err and needle in err and "Traceback" not in err


@pytest.mark.parametrize("url", ["../../etc", "/etc/../etc", "relative/data", "s3://bucket/../other"])
def test_no_dataset_the_run_did_not_record_is_fetched(tmp_path, tiny_pretrain_data, capsys, monkeypatch, url):
    run = tmp_path / "runs" / "r"
    state = _state(tiny_pretrain_data["train"])
    state["config"]["data"]["train"]["url"] = url
    _write(run, 3, state)
    _commit(run, 3)
    fetched = []
    monkeypatch.setattr(batches, "read_manifest", lambda *a, **k: fetched.append(a) or read_manifest(*a, **k))
    rc, out, err = _replay(["--run", str(run)], capsys)
    assert rc == 2 and fetched == [] and "not an absolute path or URL without '.' or '..' parts" in err
