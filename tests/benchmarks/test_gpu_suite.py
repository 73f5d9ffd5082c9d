"""benchmarks/gpu_suite.py, the GPU figures in calls that each fit 8 minutes of a lent H100 (issue 33).

- Each call's part limits add up to its budget; the job's path follows what is installed (Ray Train, `--no-ray`,
  or benchmarks/gpu_job.py without MLflow); the resumed job starts on empty Inductor and Triton caches with the
  fresh run's --compile-cache; the GPU job command parses with jobs/pretrain.py's own flags.
- A part that hangs is stopped at its limit; the time to a job's first step is the suite's clock.
- `--dry-run --call 1` (kernels in Triton's interpreter, the step on / off beside transformers, memory), and
  `--dry-run --call 2` and `--call 3` as the lent machine runs them without the device bundle (Ray, MLflow, boto3
  hidden: tests/_bare.py): data builds, seq 512 padded and packed, the job fresh then resumed from its checkpoint,
  `pytest -m gpu`; each ends in its table of ratios. On a CPU the parts' limits only guard against hangs, so a
  slow or busy box passes (no timing is asserted); only the shapes and the device differ from the GPU run.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _bare import bare_env

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_suite  # noqa: E402
from gpu_suite import BUDGET, Part, Stack, parts, run_part  # noqa: E402

CALLS = {1: ["kernels", "memory", "step", "step_fused", "step_fused_bf16"],
         2: ["data", "seq512_padded", "seq512_packed", "job_fresh", "job_resumed"], 3: ["pytest_gpu"]}


def test_each_call_fits_its_budget(tmp_path):
    suite = parts(tmp_path, dry=False, stack=Stack(ray=True, mlflow=True))
    for call, names in CALLS.items():
        mine = [x for x in suite if x.call == call]
        assert [x.name for x in mine] == names
        assert sum(x.limit for x in mine) == BUDGET == 480, (call, [(x.name, x.limit) for x in mine])


def test_the_job_runs_as_the_machine_allows_and_resumes_on_a_cold_node(tmp_path):
    def job(stack: Stack, dry: bool = False) -> list[str]:
        return next(x for x in parts(tmp_path, dry, stack) if x.name == "job_fresh").command

    assert job(Stack(ray=True, mlflow=True))[1] == "jobs/pretrain.py" and "--no-ray" not in job(Stack(True, True))
    assert job(Stack(ray=False, mlflow=True))[1:3] == ["jobs/pretrain.py", "--no-ray"]
    assert job(Stack(ray=True, mlflow=True), dry=True)[1:3] == ["jobs/pretrain.py", "--no-ray"]
    bare = job(Stack(ray=False, mlflow=False))
    assert bare[1:3] == ["benchmarks/gpu_job.py", "--no-ray"] and "--mlflow-tracking-uri" not in bare
    suite = {x.name: x for x in parts(tmp_path, False, Stack(ray=True, mlflow=True))}
    fresh, resumed = suite["job_fresh"], suite["job_resumed"]
    assert resumed.after == "job_fresh" and fresh.after == "data"
    cache = fresh.command[fresh.command.index("--compile-cache") + 1]
    assert resumed.command[resumed.command.index("--compile-cache") + 1] == cache
    # A cold node: nothing compiled is shared but --compile-cache.
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert fresh.env[key] != resumed.env[key] and cache not in (fresh.env[key], resumed.env[key])
    # The GPU job command is jobs/pretrain.py's own flags (a renamed flag fails here, not on the lent machine).
    from jobs.pretrain import parse_args

    args = parse_args(fresh.command[2:] + ["--max-steps", "1"])
    assert args.use_gpu and args.preset == "bert_base" and args.compile_cache == cache and args.fused_kernels == "auto"


def test_a_hanging_part_is_stopped_and_the_first_step_is_timed_by_the_suite(tmp_path):
    hang = Part("hang", 9, 2, [sys.executable, "-c", "import time; print('first step done 0.1 s after the process "
                                                     "started', flush=True); time.sleep(600)"], "job")
    result = run_part(hang, tmp_path, 2)
    assert result.status == "timeout (2 s)" and result.seconds < 60
    assert result.first_step_s is not None and result.first_step_s <= result.seconds
    assert "first step done" in (tmp_path / "hang.log").read_text()


def test_a_call_or_parts_is_required():
    with pytest.raises(SystemExit):
        gpu_suite.main(["--dry-run"])


def _table(stdout: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """({part: [status, s, figures]}, {ratio: value}) from a call's output."""
    parts_, ratios = {}, {}
    section = None
    for line in stdout.splitlines():
        if line.startswith("| ratio |") or line.startswith("| part |"):
            section = line.split("|")[1].strip()
            continue
        if line.startswith("| ") and section:
            cells = [c.strip() for c in line.split("|")[1:-1]]
            (parts_ if section == "part" else ratios)[cells[0]] = cells[1:] if section == "part" else cells[1]
    return parts_, ratios


def _dry(call: int, work: Path, env: dict | None = None) -> tuple[dict, dict, str]:
    done = subprocess.run([sys.executable, "benchmarks/gpu_suite.py", "--dry-run", "--call", str(call), "--work",
                           str(work)], cwd=REPO, capture_output=True, text=True, timeout=1700, env=env)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    table, ratios = _table(done.stdout)
    assert list(table) == CALLS[call] and all(row[0] == "ok" for row in table.values()), table
    return table, ratios, done.stdout


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_dry_run_call_1(tmp_path):
    table, ratios, out = _dry(1, tmp_path / "w")
    assert table["kernels"][2].count(" ok") == 2 and "FAILED" not in table["kernels"][2]  # LayerNorm, GELU
    assert "bert_core_compiled " in table["step"][2] and "transformers_compiled " in table["step"][2]
    for ratio in ("bert_core / transformers compiled, seq/s at 128 x 256",
                  "kernels on / off (fused op / composition), seq/s", "kernels on with bf16 residual / off, seq/s"):
        assert float(ratios[ratio]) > 0, (ratio, ratios)
    assert ratios["kernels agreeing with the composition at training shapes"] == "2 of 2"
    assert ratios["estimate / measured, the 2026-11-24 H100 peaks"] == "1.08, 1.15, 1.12"
    assert ratios["process start to first step (compile included), bert_core compiled"].endswith(" s")
    assert "MFU / HFU, bert_core compiled, seq 128 x 256 (default)" in ratios  # "- / -" on a CPU (no peak)
    assert "fused kernels on" in (tmp_path / "w" / "step_fused.log").read_text()
    assert "fused kernels auto" in (tmp_path / "w" / "step.log").read_text()  # the default: the composition


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_dry_run_calls_2_and_3_without_the_bundle(tmp_path):
    env = bare_env(tmp_path / "bare")
    table, ratios, out = _dry(2, tmp_path / "w", env)
    assert "Ray not installed, MLflow not installed" in out and "job: benchmarks/gpu_job.py --no-ray" in out
    assert "data: the builder in-process, --no-ray --no-mlflow" in out
    assert table["data"][2].count("instances") == 2
    assert float(ratios["packed / padded, real sequences/s at seq 512"]) > 0
    assert float(ratios["bert_core / transformers compiled, seq/s at seq 512 (real sequences)"]) > 0
    for label in ("fresh", "resumed on a cold node"):
        assert ratios[f"process start to first step, the job, {label}"].endswith(" s"), ratios
    assert ratios["the resumed run's start"].startswith("step 4,")  # the fresh run's checkpoint
    resumed = (tmp_path / "w" / "job_resumed.log").read_text()
    assert "no MLflow run: MLflow is not installed here" in resumed and "run throughput after warm-up" in resumed
    table, ratios, out = _dry(3, tmp_path / "w", env)
    assert "skipped" in table["pytest_gpu"][2] and "error" not in table["pytest_gpu"][2]  # collected, no GPU here
