"""Issue 30, item 13: no credential on a job's command line, where every user of the machine reads it (ps) and Ray's
job table keeps it. Each job refuses one in a single line that shows it redacted and says where credentials go;
the same URL given in an @FILE is accepted."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SIGNED = "https://h/corpus.txt?X-Amz-Credential=AKIACANARY&X-Amz-Signature=CANARYSIG"


@pytest.mark.parametrize("job, argv", [
    ("build_dataset", ["--input", SIGNED, "--output", "out"]),
    ("build_dataset", ["--input", "c.txt", "--output", "out", "--endpoint-url", "http://key:CANARYPW@127.0.0.1:9"]),
    ("pretrain", ["--data", "ds", "--max-steps", "1", "--mlflow-tracking-uri", "https://u:CANARYPW@mlflow.example"]),
    ("finetune", ["--task", "classification", f"--train={SIGNED}", "--init", "m", "--output", "o"]),
    ("train_tokenizer", ["--input", SIGNED, "--output", "vocab.txt"]),
])
def test_a_credential_on_the_command_line_is_refused_in_one_line(job, argv):
    done = subprocess.run([sys.executable, "-m", f"jobs.{job}", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "a credential on the command line is readable by every user of this machine (ps)" in line
    assert "AWS_SECRET_ACCESS_KEY" in line and "@FILE" in line and "REDACTED" in line
    assert "CANARY" not in done.stderr + done.stdout


def test_the_same_url_in_an_args_file_is_accepted(tmp_path):
    from jobs import build_dataset

    args = tmp_path / "secret.args"
    args.write_text(f"--input\n{SIGNED}\n")
    args.chmod(0o600)  # only ours to read (a credentials file others can read is refused: tests/trust)
    parsed = build_dataset.parse_args([f"@{args}", "--output", str(tmp_path / "out")])
    assert parsed.input == [SIGNED]
