"""Issue 43, item 10, written as the attack: a credentials @FILE that every user of the machine can read was used
without a word. Now a job refuses it in one line naming the fix (`chmod 600 FILE`), as ssh refuses a private key
others can read; the same file made private is accepted, and an @FILE without a credential is not a concern."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SIGNED = "https://h/corpus.txt?X-Amz-Signature=CANARYSIG"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_credentials_file_others_can_read_is_refused_naming_chmod_600(tmp_path, capsys, mode):
    from jobs import build_dataset

    args = tmp_path / "secret.args"
    args.write_text(f"--input\n{SIGNED}\n")
    args.chmod(mode)
    with pytest.raises(SystemExit) as e:
        build_dataset.parse_args([f"@{args}", "--output", str(tmp_path / "out")])
    assert e.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"chmod 600 {args}" in line and f"mode {mode:04o}" in line and "CANARY" not in line
    assert not (tmp_path / "out").exists()


def test_the_same_file_made_private_is_accepted_and_a_file_without_credentials_needs_nothing(tmp_path):
    from jobs import build_dataset

    args = tmp_path / "secret.args"
    args.write_text(f"--input\n{SIGNED}\n")
    args.chmod(0o600)
    assert build_dataset.parse_args([f"@{args}", "--output", str(tmp_path / "out")]).input == [SIGNED]
    plain = tmp_path / "plain.args"
    plain.write_text("--input\ncorpus.txt\n")
    plain.chmod(0o644)
    assert build_dataset.parse_args([f"@{plain}", "--output", str(tmp_path / "out")]).input == ["corpus.txt"]


def test_as_a_user_runs_it(tmp_path):
    args = tmp_path / "secret.args"
    args.write_text(f"--train\n{SIGNED}\n")
    args.chmod(0o644)
    done = subprocess.run([sys.executable, "-m", "jobs.finetune", "--task", "classification", f"@{args}", "--init",
                           "m", "--output", str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("finetune: error: @") and f"chmod 600 {args}" in line and "CANARY" not in line
