"""Fast restart: compiled artifacts are kept beside every checkpoint and a resumed run in a fresh process, with an
empty Inductor cache directory, gets its compiled graphs from them (cache hits, no code generation). Counted on
Dynamo's counters, never on time. Inductor generates and compiles C++ here: one width, 74 CPU-seconds (3.1 minutes
of wall time at load 5 on this shared 2-core box), hence the slow marker."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def run(dataset: str, checkpoints: Path, steps: int, inductor_cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)}
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("compile_cache_scenario.py")), dataset,
                          str(checkpoints), str(steps)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_resume_loads_compiled_artifacts_from_the_checkpoint(tiny_pretrain_data, tmp_path):
    first = run(tiny_pretrain_data["train"], tmp_path / "ckpt", 1, tmp_path / "inductor-a")
    assert first["resumed_from"] == 0
    assert first["inductor"].get("fxgraph_cache_miss", 0) > 0 and not first["inductor"].get("fxgraph_cache_hit")
    assert "compile_cache.bin" in first["files"]
    # A new process on a cold Inductor cache directory: everything it compiles comes from the checkpoint's file.
    second = run(tiny_pretrain_data["train"], tmp_path / "ckpt", 2, tmp_path / "inductor-b")
    assert second["resumed_from"] == 1 and second["steps"] == [2]
    assert second["inductor"].get("fxgraph_cache_hit", 0) == first["inductor"]["fxgraph_cache_miss"]
    assert not second["inductor"].get("fxgraph_cache_miss")
    assert second["aot_autograd"].get("autograd_cache_hit", 0) >= 1
    assert not second["aot_autograd"].get("autograd_cache_miss")
