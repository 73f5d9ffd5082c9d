"""Every command in docs/benchmarks.md's GPU section (its code blocks) has a CPU smoke run here (issue 33): the
documented flags as written, then CPU overrides appended (argparse keeps the last: the device, a tiny preset and
shapes, one step, the `aot_eager` backend for compiled variants), so a renamed flag or a broken import fails here and
not on the next lent GPU. `benchmarks/gpu_suite.py --call N` is smoked by its dry runs (test_gpu_suite.py) and
`pytest -m gpu tests` by its bare collection (test_gpu_bare.py); a command of any other script fails this test
until it has a smoke.

The smokes run one after another in one child process (one import of torch and transformers): about a minute on an
idle 2-core box. No timing is asserted."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

# Placeholders and paths of the documented commands, as the smoke runs them.
PLACES = {"../shared/data/corpora": "data/sample/corpus", "../shared/data/reference/": "data/sample/reference/"}
SMOKED_ELSEWHERE = {"benchmarks/gpu_suite.py": "tests/benchmarks/test_gpu_suite.py (dry runs of calls 1, 2, 3)",
                    "pytest": "tests/benchmarks/test_gpu_bare.py (collection) and gpu_suite.py --call 3 --dry-run"}


def gpu_section_commands() -> list[str]:
    text = (REPO / "docs" / "benchmarks.md").read_text()
    section = text[text.index("\n## GPU\n"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    commands = []
    for block in re.findall(r"^```\n(.*?)^```", section, re.M | re.S):
        for line in block.splitlines():
            # A call's command on the device ends in `python3 benchmarks/gpu_suite.py --call N ...; tar ...`.
            for piece in line.split(";"):
                piece = piece.split("  #")[0].strip()
                if re.match(r"python3? ", piece):
                    commands.append(re.sub(r"^python3 ", "python ", piece))
    return commands


def smoke(command: str, tmp: Path) -> tuple[str, list[str]] | str:
    """(runner, argv) for the child, or the test that smokes it elsewhere."""
    argv = shlex.split(command)[1:]
    argv = [PLACES.get(a, a) for a in argv]
    for old, new in PLACES.items():
        argv = [a.replace(old, new) for a in argv]
    argv = [str(tmp / "d512") if a == "DIR512" else str(tmp / "prof") if a == "/tmp/prof" else a for a in argv]
    if argv[:2] == ["-m", "pytest"]:
        return SMOKED_ELSEWHERE["pytest"]
    if argv[:2] == ["-m", "bert_core.kernels.bench"]:
        return "bench", argv[2:] + ["--device", "cpu", "--rows", "16", "--iters", "2", "--no-compile"]
    script, args = argv[0], argv[1:]
    if script in SMOKED_ELSEWHERE:
        assert script != "benchmarks/gpu_suite.py" or args[args.index("--call") + 1] in ("1", "2", "3", "N"), command
        return SMOKED_ELSEWHERE[script]
    if script == "benchmarks/memory_fit.py":
        return "memory_fit", args
    if script == "jobs/build_dataset.py":
        return "build_dataset", args + ["--no-mlflow", "--log-level", "WARNING"]
    if script == "benchmarks/gpu_step.py":
        tiny = ["--device", "cpu", "--preset", "bert_tiny", "--steps", "1", "--warmup", "0", "--batches", "1",
                "--shapes", "16x2x3"]
        if "--micro-batch" in args:
            tiny += ["--micro-batch", "2"]
        if "--data" in args:
            tiny += ["--batch", "2"]
        if "--cuda-graphs" in args:  # Inductor's mode: the eager variants take the same flags on a CPU
            tiny += ["--variants", "bert_core,transformers"]
        else:
            tiny += ["--compile-backend", "aot_eager"]
        return "gpu_step", args + tiny
    if script == "benchmarks/train_loop.py":
        # 2 rows of at most 32 tokens (the built sample's length without --data): Triton's interpreter runs the fused
        # op row by row
        return "train_loop", args + ["--device", "cpu", "--preset", "bert_tiny", "--batch-size", "2", "--seq", "32",
                                     "--steps", "1", "--warmup", "1", "--log-every", "1", "--compile-backend",
                                     "aot_eager"]
    raise AssertionError(f"no CPU smoke for {command!r}: add one to {Path(__file__).name}")


CHILD = r"""
import json, os, sys, time, traceback
sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "benchmarks")]
import memory_fit, gpu_step, train_loop
from bert_core.kernels import bench
from jobs import build_dataset
runners = {"memory_fit": memory_fit.main, "gpu_step": gpu_step.main, "train_loop": train_loop.main,
           "bench": bench.main, "build_dataset": build_dataset.main}
for name, argv in json.loads(sys.argv[1]):
    t0 = time.perf_counter()
    try:
        rc = runners[name](argv)
        print("SMOKE", json.dumps({"argv": argv, "ok": rc in (0, None), "error": f"rc {rc}",
                                   "s": round(time.perf_counter() - t0, 1)}), flush=True)
    except BaseException as e:
        print("SMOKE", json.dumps({"argv": argv, "ok": False,
                                   "error": "".join(traceback.format_exception(e))[-3000:]}), flush=True)
"""


def test_every_gpu_command_of_the_docs_runs_on_cpu(tmp_path):
    commands = gpu_section_commands()
    assert len(commands) >= 15, commands
    smokes = {c: smoke(c, tmp_path) for c in commands}
    # DIR512 first: the build command makes the dataset the others read.
    todo = sorted((s for s in smokes.values() if isinstance(s, tuple)), key=lambda s: s[0] != "build_dataset")
    assert todo[0][0] == "build_dataset" and any("DIR512" in c for c in commands)
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(todo)], cwd=REPO, capture_output=True,
                          text=True, timeout=1150, env={**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"})
    results = [json.loads(line[len("SMOKE "):]) for line in done.stdout.splitlines() if line.startswith("SMOKE ")]
    assert len(results) == len(todo), done.stdout[-3000:] + done.stderr[-3000:]
    failed = [f"{' '.join(r['argv'])}\n{r['error']}" for r in results if not r["ok"]]
    assert not failed, "\n\n".join(failed)
    assert (tmp_path / "prof").is_dir()  # --profile wrote its trace
