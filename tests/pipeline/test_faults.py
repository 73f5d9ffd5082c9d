"""Faults: a build killed mid-way (SIGKILL, or a failure injected in any stage) and rerun gives exactly the rows of
an uninterrupted build; bad inputs fail naming the file, or are dropped and counted with on_error='skip'."""
from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import pipeline.instances
import pipeline.read
import pipeline.shards
from corpus.create_instances import InstanceConfig
from corpus.readers import InputError, ReadOptions
from pipeline import BuildConfig, build

REPO = str(Path(__file__).resolve().parents[2])
LEASE_STALE_ENV, LEASE_STALE_S = "BERT_LEASE_STALE_SECONDS", 3.0  # a killed build's lease, stale soon


def _corpus(path, n_docs=40, sentences=15):
    words = "apple river house music water garden silver winter doctor castle".split()
    with open(path, "w") as f:
        for i in range(n_docs):
            w = words[i % len(words)]
            f.write(json.dumps({"text": " ".join(f"The {w} saw {i} ships on day {j}." for j in range(sentences))}))
            f.write("\n")
    return str(path)


def _cfg(tmp_path, corpus, name, sample_dir, **kw):
    kw.setdefault("unit_bytes", 4096)
    return BuildConfig(inputs=(corpus,), output=str(tmp_path / name), dupe_factor=2, num_shards=4,
                       vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"),
                       instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10), **kw)


def _rows(out):
    m = json.load(open(os.path.join(out, "manifest.json")))
    return m, [pq.read_table(os.path.join(out, s["file"])) for s in m["shards"]]


def _same(a, b):
    (ma, ta), (mb, tb) = _rows(a), _rows(b)
    assert ma["totals"] == mb["totals"], (ma["totals"], mb["totals"])
    assert ma["shards"] == mb["shards"], (ma["shards"], mb["shards"])
    assert all(x.equals(y) for x, y in zip(ta, tb, strict=False))
    assert not os.path.exists(os.path.join(b, "_work"))


@pytest.mark.parametrize("module, stage", [(pipeline.read, "write_docs"),
                                           (pipeline.instances, "write_unit"),
                                           (pipeline.shards, "write_shard")])
def test_failure_in_any_stage_then_rerun_gives_the_same_rows(tmp_path, sample_dir, monkeypatch, module, stage):
    corpus = _corpus(tmp_path / "c.jsonl")
    real = getattr(module, stage)
    calls, fail_at = [], [None]

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == fail_at[0]:
            raise RuntimeError("injected failure")
        return real(*a, **k)

    monkeypatch.setattr(module, stage, flaky)
    build(_cfg(tmp_path, corpus, "clean", sample_dir))
    total, fail_at[0] = len(calls), 3
    assert total >= 4
    calls.clear()
    cfg = _cfg(tmp_path, corpus, "killed", sample_dir)
    with pytest.raises(RuntimeError, match="injected"):
        build(cfg)
    assert not os.path.exists(tmp_path / "killed" / "manifest.json")
    with pytest.raises(ValueError, match="unfinished build with a different config"):
        build(dataclasses.replace(cfg, dupe_factor=3))
    calls.clear()
    fail_at[0] = None
    build(cfg)
    assert len(calls) == total - 2  # the two units committed before the failure are not redone
    _same(tmp_path / "clean", tmp_path / "killed")


@pytest.mark.timeout(240)
def test_sigkill_mid_build_then_rerun_gives_the_same_rows(tmp_path, sample_dir, monkeypatch):
    # The killed build's output lease (storage/lease.py) is taken over once its heartbeat is this old.
    monkeypatch.setenv(LEASE_STALE_ENV, str(LEASE_STALE_S))
    corpus = _corpus(tmp_path / "c.jsonl", n_docs=120)
    cfg = _cfg(tmp_path, corpus, "killed", sample_dir)
    code = (f"import sys; sys.path.insert(0, {REPO!r}); import pickle; from pipeline import build; "
            f"build(pickle.loads({repr(__import__('pickle').dumps(cfg))}))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ))
    work = tmp_path / "killed" / "_work" / "instances"
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if work.exists() and sum(n.endswith(".done.json") for n in os.listdir(work)) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the build ended before it could be killed"
    assert not (tmp_path / "killed" / "manifest.json").exists(), "the build finished before it could be killed"
    time.sleep(LEASE_STALE_S + 0.5)  # the dead build's lease goes stale
    build(cfg)
    build(_cfg(tmp_path, corpus, "clean", sample_dir))
    _same(tmp_path / "clean", tmp_path / "killed")


@pytest.mark.timeout(300)
def test_sigkill_of_a_ray_data_build_and_its_ray_then_rerun_on_ray_gives_the_same_rows(ray_local, tmp_path,
                                                                                       sample_dir, monkeypatch):
    """The job's whole process group (driver, its local Ray's daemons and workers) killed in the instances stage;
    the rerun, on another Ray, through Ray Data, equals an uninterrupted plain loop."""
    from pipeline.ray_data import RayDataExecutor

    monkeypatch.setenv(LEASE_STALE_ENV, str(LEASE_STALE_S))
    corpus = _corpus(tmp_path / "c.jsonl", n_docs=240)
    cfg = _cfg(tmp_path, corpus, "killed", sample_dir)
    ray_tmp = tempfile.mkdtemp(prefix="rk", dir="/tmp")  # short: Unix socket paths are limited to ~107 bytes
    code = (f"import sys; sys.path.insert(0, {REPO!r}); import pickle, ray; from pipeline import build; "
            "from pipeline.ray_data import RayDataExecutor; "
            f"init = lambda: ray.init(address='local', num_cpus=2, include_dashboard=False, _temp_dir={ray_tmp!r}); "
            f"build(pickle.loads({repr(__import__('pickle').dumps(cfg))}), RayDataExecutor(2, init=init))")
    log = tmp_path / "killed-build.log"  # what the build said, should it end before it is killed
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, start_new_session=True, stderr=out,
                                env=dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"))
    work = tmp_path / "killed" / "_work" / "instances"
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            if work.exists() and sum(n.endswith(".done.json") for n in os.listdir(work)) >= 2:
                break
            time.sleep(0.05)
    finally:
        alive = proc.poll() is None
        if alive:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and every process of its Ray
        proc.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert alive, f"the build ended (status {proc.returncode}) before it could be killed: {log.read_text()[-3000:]}"
    assert not (tmp_path / "killed" / "manifest.json").exists(), "the build finished before it could be killed"
    done = sum(n.endswith(".done.json") for n in os.listdir(work))
    assert done >= 2
    time.sleep(LEASE_STALE_S + 0.5)  # the dead build's lease goes stale
    build(cfg, RayDataExecutor(num_cpus=2))
    build(_cfg(tmp_path, corpus, "clean", sample_dir))
    _same(tmp_path / "clean", tmp_path / "killed")


def _bad_inputs(d):
    os.makedirs(d)
    good = _corpus(os.path.join(d, "good.jsonl"), n_docs=6)
    files = {"good": good}

    def put(name, data):
        files[name] = os.path.join(d, name)
        with open(files[name], "wb") as f:
            f.write(data)
    put("undecodable.txt", b"A fine line.\n\nbad \xff\xfe bytes here.\n\nAnother fine line.\n")
    put("empty.txt", b"")
    put("binary.txt", bytes(range(256)) * 8)
    put("badrows.jsonl", b'{"text": "The whale."}\n{"text": oops\n{"title": "x"}\n')
    # ~600 KB decompressed, cut at 2/3: more than one read chunk survives, then the stream ends early.
    whole = gzip.compress(b"".join(b"Sentence %d of the chapter. " % i + b"More words follow here. " * 10 + b"\n\n"
                                   for i in range(2000)))
    put("truncated.txt.gz", whole[: len(whole) * 2 // 3])
    with open(os.path.join(d, "huge.txt"), "wb") as f:
        f.write(b"A short document.\n\n" + b"y" * (100 << 20) + b"\n")
    files["huge.txt"] = os.path.join(d, "huge.txt")
    return files


EXPECT = {"undecodable.txt": "undecodable", "empty.txt": "empty_file", "binary.txt": "binary",
          "badrows.jsonl": "bad_json", "truncated.txt.gz": "corrupt_file", "huge.txt": "record_too_long"}


def test_bad_inputs_fail_naming_the_file_or_are_counted(tmp_path, sample_dir):
    files = _bad_inputs(tmp_path / "in")
    for name, reason in EXPECT.items():
        cfg = _cfg(tmp_path, files["good"], f"fail-{name}", sample_dir, unit_bytes=1 << 20)
        with pytest.raises(InputError, match=rf"{name}.*{reason}"):
            build(dataclasses.replace(cfg, inputs=(files["good"], files[name])))
    cfg = _cfg(tmp_path, files["good"], "skip", sample_dir, unit_bytes=1 << 20, read=ReadOptions(on_error="skip"))
    build(dataclasses.replace(cfg, inputs=tuple(files.values())))
    m = json.loads((tmp_path / "skip" / "manifest.json").read_text())
    dropped = m["totals"]["dropped"]
    assert dropped["empty_file"] == 1 and dropped["corrupt_file"] == 1 and dropped["record_too_long"] == 1
    assert dropped["bad_json"] == 1 and dropped["missing_text_field"] == 1 and dropped["undecodable"] == 1
    assert dropped.get("binary", 0) + dropped.get("undecodable", 0) >= 2
    assert sorted(m["skipped_files"].values()) == ["corrupt_file", "empty_file"]
    # Good documents of partly bad files are kept: 6 good + 2 + the readable part of the truncated file + 1 + 1.
    assert m["totals"]["documents"] > 6 + 2 + 1 + 1
