"""A job started outside the project's environment (a fresh shell: the system's python3, no venv) says in one line
how to enter it, instead of a ModuleNotFoundError traceback."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOBS = sorted(p.name for p in (REPO / "jobs").glob("*.py") if not p.name.startswith("_"))


def pythons_without_the_project() -> list[list[str]]:
    """This interpreter without its site-packages (-S: no torch, no ray), and the system's python3 when it lacks
    them too (what a fresh shell runs)."""
    found = [[sys.executable, "-S"]]
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system and subprocess.run([system, "-c", "import torch"], capture_output=True).returncode != 0:
        found.append([system])
    return found


@pytest.mark.parametrize("python", pythons_without_the_project(), ids=lambda p: " ".join(p))
@pytest.mark.parametrize("job", JOBS)
def test_a_job_outside_the_venv_says_how_to_enter_it(job, python, tmp_path):
    out = subprocess.run([*python, str(REPO / "jobs" / job), "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "/bin/activate" in lines[0] and "torch" in lines[0] and f"jobs/{job}" in lines[0]


def test_in_the_venv_help_still_works():
    out = subprocess.run([sys.executable, str(REPO / "jobs" / "train_tokenizer.py"), "--help"], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0 and "--vocab-size" in out.stdout
