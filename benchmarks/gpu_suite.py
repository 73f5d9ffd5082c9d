"""Every GPU figure of the project in one command (issue 24), for a lent GPU machine's short window.

    python benchmarks/gpu_suite.py                        # on the GPU machine: every part, 480 s in all
    python benchmarks/gpu_suite.py --parts step_off,job_fresh,job_resumed --budget 400   # the rest, if cut short
    python benchmarks/gpu_suite.py --dry-run              # on a CPU: every part at tiny shapes (the test runs this)

Each part is a subprocess with its own time limit (and none outlives what is left of --budget), so a hang costs
that part only; at the end a table: part, status, seconds, the figures parsed from its output. The full output of
part P is in WORK/P.log (WORK: --work, default /tmp/gpu_suite; keep it: copy it to $OUT on the device machine).

Parts, in order (the most decisive first, in case the window closes):
- data: seq-128 and seq-512 builds of data/sample with the bert-base-uncased vocabulary (`--no-ray`, seconds);
- kernels: each fused kernel forward and backward against the PyTorch composition at 128 x 256 rows, H 768 and
  1,024 (`bert_core.kernels.self_check`), and the byte count per site (`bert_core.kernels.traffic`);
- step_on / step_off / step_bf16: the compiled BERT-base step at 128 x 256 (`benchmarks/gpu_step.py`): MFU and HFU
  with the kernels on (beside compiled transformers), off, and with the bf16 residual stream;
- seq512_padded / seq512_packed: the compiled step at seq 512 on the seq-512 build, padded and packed rows;
- job_fresh / job_resumed: `jobs/pretrain.py --use-gpu` (Ray Train when Ray imports, else `--no-ray`): time from
  process start to the first step, fresh and resumed from its checkpoint (compiled artifacts included), its MFU
  of real tokens and data wait;
- pytest_gpu: `pytest -m gpu tests`.

Part limits add up to more than the default budget: what the budget does not reach is listed as not run, with the
`--parts` to run it. On the device machine, see docs/benchmarks.md § GPU for the bundle and the call.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROWS = 128 * 256


@dataclass
class Part:
    name: str
    limit: int  # seconds on the GPU machine
    command: list[str]
    parse: str  # which figures to read from its output: kernels, pytest, step, job, data
    env: dict[str, str] = field(default_factory=dict)
    after: str = "data"  # the part whose outputs it needs (None: none)


def _py(*args: str) -> list[str]:
    return [sys.executable, *args]


def parts(work: Path, dry: bool, ray: bool) -> list[Part]:
    """The suite; `dry` shrinks every part to tiny shapes on the CPU (the Triton interpreter for the kernels)."""
    d128, d512, ckpt = str(work / "d128"), str(work / "d512"), str(work / "ckpt")
    vocab = str(REPO / "data/sample/reference/bert-base-uncased-vocab.txt")
    build = ["jobs/build_dataset.py", "--input", str(REPO / "data/sample/corpus"), "--vocab", vocab, "--no-ray",
             "--dupe-factor", "1", "--log-level", "WARNING"]
    data = _py("-c", "import subprocess, sys; [subprocess.run([sys.executable, *a], check=True) for a in "
                     f"{[build + ['--output', d128, '--max-seq-length', '128', '--max-predictions-per-seq', '20'], build + ['--output', d512, '--max-seq-length', '512', '--max-predictions-per-seq', '80']]!r}]")
    if dry:
        step = ["benchmarks/gpu_step.py", "--device", "cpu", "--preset", "bert_tiny", "--steps", "1", "--warmup",
                "0", "--batches", "1"]
        shape = ["--shapes", "32x4x3"]
        compiled = ["--variants", "bert_core"]
        seq512 = ["--data", d512, "--batch", "2", "--variants", "bert_core"]
        kernels = _py(__file__, "--child-kernels", "--device", "cpu", "--rows", "40", "--hidden", "32",
                      "--intermediate", "64", "--residuals", "fp32")
        job = ["jobs/pretrain.py", "--data", d128, "--preset", "bert_tiny", "--batch-size", "4", "--no-ray",
               "--length-buckets", "128", "--log-every", "1", "--no-system-metrics"]
        job_steps = ("2", "3")
        pytest = _py("-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                     "tests/bert_core/test_kernel_training_shapes_gpu.py")
        interp = {"TRITON_INTERPRET": "1"}
    else:
        step = ["benchmarks/gpu_step.py", "--steps", "15", "--warmup", "2"]
        shape = ["--shapes", "128x256x20"]
        compiled = ["--variants", "bert_core_compiled"]
        seq512 = ["--data", d512, "--batch", "32", "--variants", "bert_core_compiled"]
        kernels = _py(__file__, "--child-kernels", "--device", "cuda", "--rows", str(ROWS), "--hidden", "768,1024",
                      "--intermediate", "3072,4096")
        job = ["jobs/pretrain.py", "--data", d128, "--preset", "bert_base", "--batch-size", "256", "--use-gpu",
               "--length-buckets", "128", "--log-every", "10", "--peak-tflops", "989"]
        job = job + ([] if ray else ["--no-ray"])
        job_steps = ("60", "80")
        pytest = _py("-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests")
        interp = {}
    job = job + ["--storage", ckpt, "--run-name", "suite", "--checkpoint-every", job_steps[0],
                 "--mlflow-tracking-uri", f"sqlite:///{work / 'mlflow.db'}"]
    return [
        Part("data", 60, data, "data", after=None),
        Part("kernels", 60, kernels, "kernels", interp, after=None),
        Part("step_on", 200, _py(*step, *shape, "--variants",
                                 "bert_core,transformers" if dry else "bert_core_compiled,transformers_compiled"),
             "step"),
        Part("step_off", 100, _py(*step, *shape, *compiled, "--fused-kernels", "off"), "step"),
        Part("step_bf16", 100, _py(*step, *shape, *compiled, "--low-precision-residual"), "step"),
        Part("seq512_padded", 100, _py(*step, *seq512), "step"),
        Part("seq512_packed", 100, _py(*step, *seq512, "--packing"), "step"),
        Part("job_fresh", 180, _py(*job, "--max-steps", job_steps[0]), "job"),
        Part("job_resumed", 90, _py(*job, "--max-steps", job_steps[1]), "job", after="job_fresh"),
        Part("pytest_gpu", 240, pytest, "pytest", interp, after=None),
    ]


# ---- reading figures from the parts' output ------------------------------------------------------------------------

def figures(kind: str, out: str) -> str:
    if kind == "kernels":
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return "; ".join(f"{r['kernel']}@{r['shape']} {'ok' if r['ok'] else 'FAILED'}" for r in rows) or "-"
    if kind == "pytest":
        found = re.findall(r"^=*\s*(\d+ (?:passed|failed|skipped|error).*?)(?: in [\d.]+s.*)?=*$", out, re.M)
        return found[-1].strip() if found else "-"
    if kind == "step":
        cells = []
        for m in re.finditer(r"^(bert_core\S*|transformers\S*)\s+([\d.]+)\s+(\S+)\s+(\S+)\s+(\S+)\s+([\d.]+)", out,
                             re.M):
            cells.append(f"{m[1]} {m[2]} seq/s MFU {m[3]} HFU {m[4]} 1st {m[6]} s")
        return "; ".join(cells) or "-"
    if kind == "job":
        first = re.search(r"first step done ([\d.]+) s after the process started", out)
        run = re.search(r"run throughput after warm-up: (.*)", out)
        got = dict(kv.split("=", 1) for kv in run[1].split()) if run else {}
        parts = [f"first step {first[1]} s" if first else "first step -"]
        parts += [f"{k} {got[k]}" for k in ("mfu", "hfu", "sequences_per_second", "data_wait_fraction") if k in got]
        return ", ".join(parts)
    return "built" if "instances" in out else "-"


# ---- running ---------------------------------------------------------------------------------------------------------

def run_part(part: Part, work: Path, seconds: int) -> tuple[str, float, str]:
    env = {**os.environ, **part.env, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"), "HF_HUB_OFFLINE": "1"}
    log = work / f"{part.name}.log"
    t0 = time.monotonic()
    with open(log, "w") as f:
        # A new session: on timeout the whole group goes (a job's Ray workers, pytest's children).
        proc = subprocess.Popen(part.command, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=seconds)
            status = "ok" if rc == 0 else f"failed (rc {rc})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            status = f"timeout ({seconds} s)"
    elapsed = time.monotonic() - t0
    return status, elapsed, figures(part.parse, log.read_text(errors="replace"))


def run_all(todo: list[Part], work: Path, deadline: float, jobs: int) -> dict[str, tuple[str, float, str]]:
    """Every part of `todo` once its `after` part is done (or not asked for), `jobs` at a time, in list order."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    names = {x.name for x in todo}
    results: dict[str, tuple[str, float, str]] = {}
    pending, running = list(todo), {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while pending or running:
            for part in list(pending):
                if len(running) >= jobs:
                    break
                if part.after in names and part.after not in results:
                    continue
                pending.remove(part)
                remaining = int(deadline - time.monotonic())
                if remaining < 20:
                    results[part.name] = ("not run (budget spent)", 0.0, "-")
                    continue
                running[pool.submit(run_part, part, work, min(part.limit, remaining))] = part
            if not running:
                continue
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                part = running.pop(future)
                results[part.name] = future.result()
                status, seconds, figs = results[part.name]
                print(f"{part.name}: {status} in {seconds:.0f} s: {figs}", flush=True)
    return results


def child_kernels(args: argparse.Namespace) -> None:
    """The kernels part: self_check at each width, one JSON line per kernel; then the byte table."""
    import torch

    from bert_core.kernels import KernelOptions
    from bert_core.kernels.self_check import self_check
    from bert_core.kernels.traffic import table

    device = torch.device(args.device)
    for hidden, inter in zip(map(int, args.hidden.split(",")), map(int, args.intermediate.split(","))):
        for bf16 in [r == "bf16" for r in args.residuals.split(",")]:
            options = KernelOptions(fused=True, fused_bias_gelu=True, low_precision_residual=bf16)
            for name, r in self_check(args.rows, hidden, inter, device, options).items():
                print(json.dumps({"kernel": name + ("[bf16 residual]" if bf16 else ""), "ok": r.ok,
                                  "shape": f"{args.rows}x{hidden}", "figure": r.figure}), flush=True)
    print("\n".join(table(ROWS, 768)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="every part at tiny shapes on the CPU")
    p.add_argument("--parts", default=None, help="comma-separated subset of the parts (default: all, in order)")
    p.add_argument("--budget", type=int, default=480, help="seconds for all parts together")
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu_suite"), help="builds, checkpoints, logs")
    p.add_argument("--child-kernels", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--rows", type=int, default=ROWS, help=argparse.SUPPRESS)
    p.add_argument("--hidden", default="768", help=argparse.SUPPRESS)
    p.add_argument("--intermediate", default="3072", help=argparse.SUPPRESS)
    p.add_argument("--residuals", default="fp32,bf16", help=argparse.SUPPRESS)
    p.add_argument("--jobs", type=int, default=None,
                   help="parts run at once (default: 1 on a GPU, whose timings need it alone; 2 in a dry run)")
    args = p.parse_args(argv)
    if args.child_kernels:
        child_kernels(args)
        return 0
    try:
        import ray  # noqa: F401

        ray_ok = True
    except ImportError:
        ray_ok = False
    suite = parts(args.work, args.dry_run, ray_ok)
    names = [x.name for x in suite]
    wanted = names if args.parts is None else [x.strip() for x in args.parts.split(",")]
    unknown = set(wanted) - set(names)
    if unknown:
        p.error(f"unknown parts {sorted(unknown)}: choose from {names}")
    if args.work.exists() and (args.parts is None or "data" in wanted):
        shutil.rmtree(args.work)  # a fresh run: job_fresh must not resume an earlier suite's checkpoint
    args.work.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    todo = [x for x in suite if x.name in wanted]
    results = run_all(todo, args.work, deadline, args.jobs or (2 if args.dry_run else 1))
    rows = [(x.name, *results[x.name]) for x in todo]
    left_out = [name for name, status, _, _ in rows if status.startswith("not run")]
    print(f"\n| part | status | s | figures |\n|---|---|---:|---|")
    for name, status, seconds, figs in rows:
        print(f"| {name} | {status} | {seconds:.0f} | {figs} |")
    if left_out:
        print(f"\nnot run: python benchmarks/gpu_suite.py --parts {','.join(left_out)}")
    print(f"\nlogs: {args.work}/<part>.log; {'dry run on CPU, tiny shapes' if args.dry_run else 'GPU'}, "
          f"Ray {'on' if ray_ok else 'off (--no-ray)'}")
    return 0 if all(r[1] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
