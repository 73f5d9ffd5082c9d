"""Compiled artifacts come only from where the operator trusts them, never from a checkpoint.

- A checkpoint folder holding a hostile `compile_cache.bin` (a pickle that runs a command, artifacts keyed by
  absolute paths; `crafted_compile_cache.py`), first shown to run a command and write outside the cache when handed
  to torch as the old fast restart did: a compiled run resumed from that checkpoint completes and neither side effect
  happens. With `aot_eager` (no code generation: seconds), and again in the slow inductor test below.
- Fast restart from the operator's trusted folder (`--compile-cache`): a resumed run in a fresh process, with an
  empty Inductor cache directory, gets its compiled graphs from that folder (cache hits, no code generation), and
  nothing compiled is written into the checkpoint. Counted on Dynamo's counters, never on time. Inductor generates
  and compiles C++ here: one width, 74 CPU-seconds (3.1 minutes of wall time at load 5 on this shared 2-core box),
  hence the slow marker.
- The default Inductor cache folder is this user's, mode 0700, and one owned by someone else is refused.
"""
from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pretraining.crafted_compile_cache import craft, prove_it_runs

REPO = Path(__file__).resolve().parents[2]


def run(dataset: str, checkpoints: Path, steps: int, inductor_cache: Path, backend: str = "inductor",
        trusted: Path | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)}
    args = [dataset, str(checkpoints), str(steps), backend, *([str(trusted)] if trusted else [])]
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("compile_cache_scenario.py")), *args],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def plant(checkpoints: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A hostile compile_cache.bin in every checkpoint folder, proven live first. Returns (marker, outside)."""
    marker, outside = tmp_path / "pwned", tmp_path / "outside"
    outside.mkdir()
    crafted = craft(marker, outside)
    probe = tmp_path / "probe.bin"
    probe.write_bytes(crafted)
    prove_it_runs(probe, outside, tmp_path / "probe-inductor")
    assert marker.exists() and (outside / "autotune-file").exists(), "the crafted file should run as code in torch"
    marker.unlink()
    for p in list(outside.iterdir()):
        subprocess.run(["rm", "-rf", str(p)], check=True)
    for ckpt in checkpoints.glob("checkpoint-*"):
        (ckpt / "compile_cache.bin").write_bytes(crafted)
    return marker, outside


def test_a_hostile_compile_cache_in_a_checkpoint_is_never_loaded(tiny_pretrain_data, tmp_path):
    first = run(tiny_pretrain_data["train"], tmp_path / "ckpt", 1, tmp_path / "inductor", backend="aot_eager")
    assert first["resumed_from"] == 0 and "compile_cache.bin" not in first["files"]
    marker, outside = plant(tmp_path / "ckpt", tmp_path)
    second = run(tiny_pretrain_data["train"], tmp_path / "ckpt", 2, tmp_path / "inductor", backend="aot_eager")
    assert second["resumed_from"] == 1 and second["steps"] == [2]
    assert not marker.exists()
    assert list(outside.iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_resume_loads_compiled_artifacts_from_the_trusted_folder_only(tiny_pretrain_data, tmp_path):
    trusted = tmp_path / "trusted"
    first = run(tiny_pretrain_data["train"], tmp_path / "ckpt", 1, tmp_path / "inductor-a", trusted=trusted)
    assert first["resumed_from"] == 0
    assert first["inductor"].get("fxgraph_cache_miss", 0) > 0 and not first["inductor"].get("fxgraph_cache_hit")
    assert "compile_cache.bin" not in first["files"]
    assert [p.name for p in trusted.iterdir()][0].startswith("compile-")
    marker, outside = plant(tmp_path / "ckpt", tmp_path)
    # A new process on a cold Inductor cache directory: everything it compiles comes from the trusted folder's file,
    # nothing from the checkpoint's.
    second = run(tiny_pretrain_data["train"], tmp_path / "ckpt", 2, tmp_path / "inductor-b", trusted=trusted)
    assert second["resumed_from"] == 1 and second["steps"] == [2]
    assert second["inductor"].get("fxgraph_cache_hit", 0) == first["inductor"]["fxgraph_cache_miss"]
    assert not second["inductor"].get("fxgraph_cache_miss")
    assert second["aot_autograd"].get("autograd_cache_hit", 0) >= 1
    assert not second["aot_autograd"].get("autograd_cache_miss")
    assert not marker.exists() and list(outside.iterdir()) == []


def test_the_default_inductor_cache_is_private(tmp_path, monkeypatch):
    from pretraining.compile import private_inductor_cache

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    directory = private_inductor_cache()
    assert directory == tmp_path / "cache" / "bert-pretrain" / "inductor"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(directory)
    directory.chmod(0o777)  # loosened by someone: tightened again before use
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert stat.S_IMODE(private_inductor_cache().stat().st_mode) == 0o700


def test_an_inductor_cache_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    from pretraining import compile as compile_mod

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "cache" / "bert-pretrain" / "inductor").mkdir(parents=True)
    # Not root here, so another owner cannot be made with chown: this process's uid is what "not ours" compares to.
    monkeypatch.setattr(compile_mod.os, "getuid", lambda: os.stat(tmp_path).st_uid + 1)
    with pytest.raises(ValueError, match="belongs to uid .* TORCHINDUCTOR_CACHE_DIR"):
        compile_mod.private_inductor_cache()


def test_compile_cache_must_be_a_folder_not_a_url():
    from pretraining.config import RuntimeConfig

    with pytest.raises(ValueError, match="--compile-cache s3://b/c: name a folder"):
        RuntimeConfig(compile_cache="s3://b/c")


def test_compile_key_is_the_same_after_a_resume_and_differs_with_the_graph(tiny_pretrain_data, tmp_path):
    """A resumed run reads its config back from the checkpoint's config.json (which names `architectures`): it must
    find the artifacts the first run saved; another model shape must not."""
    import torch

    from bert_core import BertConfig, BertForPreTraining
    from corpus.schema import read_manifest
    from pretraining.compile import compile_key
    from pretraining.config import RuntimeConfig
    from pretraining.loader import DataConfig

    shards = read_manifest(tiny_pretrain_data["train"])
    data = DataConfig(train=shards, micro_batch_size=4, mask_id=4, length_buckets=(shards.max_seq_length,))
    bert = BertConfig(vocab_size=600, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    BertForPreTraining(bert).save_pretrained(tmp_path / "model")
    reloaded = BertForPreTraining.from_pretrained(tmp_path / "model").config
    rt, cpu = RuntimeConfig(compile=True), torch.device("cpu")
    assert reloaded.architectures and compile_key(rt, data, reloaded, cpu) == compile_key(rt, data, bert, cpu)
    wider = dataclasses.replace(bert, hidden_size=64, intermediate_size=128)
    assert compile_key(rt, data, wider, cpu) != compile_key(rt, data, bert, cpu)


def test_torchs_own_tmp_default_is_not_taken_for_the_operators_choice(tmp_path, monkeypatch):
    """Issue 30, item 9: torch sets TORCHINDUCTOR_CACHE_DIR to /tmp/torchinductor_<user> the first time anything asks
    for its cache (building a fused optimizer does). That is torch's default, not the operator's folder: the job's
    private folder replaces it."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    from pretraining.compile import private_inductor_cache

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cache_dir() == os.path.abspath(default_cache_dir())  # what torch leaves in the environment
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == os.path.abspath(default_cache_dir())
    directory = private_inductor_cache()
    assert directory == tmp_path / "cache" / "bert-pretrain" / "inductor"
    assert cache_dir() == str(directory) and stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_an_operators_cache_that_others_can_write_is_refused(tmp_path, monkeypatch):
    from pretraining.compile import private_inductor_cache

    shared = tmp_path / "shared-cache"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    with pytest.raises(ValueError, match=r"can be written by other users \(mode 777\).*chmod 700"):
        private_inductor_cache()
    shared.chmod(0o700)
    assert private_inductor_cache() == shared
