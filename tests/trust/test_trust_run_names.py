"""Check trust-run-names (issue 43, item 3): a user-given path part (pre-training's --run-name) or output folder
(the --output of fine-tuning, whose last part names its checkpoint folder, and of the build) that would lead a
writer outside its place is refused with exit 2 and one line naming the flag, before anything is written, and
nothing is created outside --storage. Before: pre-training took `..` and `.` and wrote its checkpoints beside
--storage, and a NUL was answered "embedded null byte" without the flag.

Every case runs the job's own `main` (its parse is where the refusal is); one case per job also runs as a user runs
it, a process of its own, with the NUL coming from an @FILE (a command line cannot carry one)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage.names import check_output, check_path_part, path_part_problem

REPO = Path(__file__).resolve().parents[2]

RUN_NAMES = ["..", ".", "a/../../x", "/tmp/elsewhere", "C:x", "~x", "a\x00b", "a\nb", "", "a\\..\\x"]
OUTPUTS = ["..", ".", "out/..", "out\x00x", "out\nx"]


def _everything_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _refused(capsys, main, argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("name", RUN_NAMES)
def test_pretraining_refuses_a_run_name_outside_storage(tmp_path, capsys, monkeypatch, name):
    from jobs import pretrain

    monkeypatch.chdir(tmp_path)
    storage = tmp_path / "side" / "storage"
    line = _refused(capsys, pretrain.main, ["--data", str(tmp_path / "ds"), "--max-steps", "1", "--storage",
                                             str(storage), "--run-name", name, "--no-ray"])
    assert line.startswith("pretrain: error: --run-name ") and repr(name) in line
    assert _everything_under(tmp_path) == set()  # not even --storage: refused before anything is written


@pytest.mark.parametrize("output", OUTPUTS)
def test_the_build_refuses_an_output_that_is_not_a_folder_of_its_own(tmp_path, capsys, monkeypatch, output):
    from jobs import build_dataset

    work = tmp_path / "a" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    line = _refused(capsys, build_dataset.main, ["--input", str(tmp_path / "c.txt"), "--output", output])
    assert ": error: --output " in line and repr(output) in line  # its prog is the script's name
    assert _everything_under(tmp_path) == {"a", "a/work"}


@pytest.mark.parametrize("output", OUTPUTS)
def test_fine_tuning_refuses_an_output_that_is_not_a_folder_of_its_own(tmp_path, capsys, monkeypatch, output):
    from jobs import finetune

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    line = _refused(capsys, finetune.main, ["--task", "classification", "--train", str(tmp_path / "t.jsonl"),
                                            "--init", "random", "--preset", "bert_tiny", "--output", output])
    assert line.startswith("finetune: error: --output ") and repr(output) in line
    assert _everything_under(tmp_path) == {"work"}


@pytest.mark.parametrize("job, argv, flag", [
    ("pretrain", ["--data", "ds", "--max-steps", "1", "--storage", "side/storage", "--no-ray"], "--run-name"),
    ("build_dataset", ["--input", "c.txt"], "--output"),
    ("finetune", ["--task", "classification", "--train", "t.jsonl", "--init", "random", "--preset", "bert_tiny"],
     "--output"),
])
def test_a_nul_from_an_args_file_as_a_user_runs_it(tmp_path, job, argv, flag):
    args = tmp_path / "more.args"
    args.write_text(f"{flag}\nrun\x00x\n")
    work = tmp_path / "work"
    work.mkdir()
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", f"jobs.{job}", *argv, f"@{args}"], cwd=work, capture_output=True,
                          text=True, timeout=120)
    took = time.monotonic() - began
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith((f"{job}: error: ", f"{job}.py: error: ")), line
    assert f"error: {flag} 'run\\x00x': a control character" in line
    assert "embedded null byte" not in done.stderr
    assert _everything_under(tmp_path) == {"more.args", "work"}
    print(f"{job}: refused in {took:.1f} s")  # shown with -s; the check asks <= 20 s on a quiet machine


def test_the_rule_itself():
    for good in ("run-1", "pretrain-bert_tiny-20261206-101010", "a.b", "..a", "a..", "é"):
        assert path_part_problem(good) is None and check_path_part(good, "--run-name") == good
    for bad in RUN_NAMES + [None, "a\x7f"]:
        assert path_part_problem(bad) is not None
    for good in ("out", "./out", "../data/out", "/abs/out/", "s3://bucket/prefix", "s3://bucket"):
        assert check_output(good, "--output") == good
    for bad in OUTPUTS + ["s3://bucket/..", "/", "", "s3://"]:
        with pytest.raises(ValueError, match="^--output "):
            check_output(bad, "--output")
