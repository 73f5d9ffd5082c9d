"""Every GPU figure of the project, in calls that each fit 8 minutes of a lent H100 (issue 33), compiles included.

    python benchmarks/gpu_suite.py --call 1    # kernels at training shapes, the step on/off beside transformers, memory
    python benchmarks/gpu_suite.py --call 2    # seq 512 padded and packed, the real job fresh and resumed (cold node)
    python benchmarks/gpu_suite.py --call 3    # pytest -m gpu tests
    python benchmarks/gpu_suite.py --call 2 --parts job_fresh,job_resumed --budget 200   # what a cut-short call left
    python benchmarks/gpu_suite.py --dry-run --call 1   # on a CPU: the same parts at tiny shapes (the tests run this)

Each part is a subprocess with its own time limit; the limits of a call's parts add up to its budget (480 s), and
none outlives what is left of --budget, so a hang costs that part only and the call ends in time. A call ends with
a table of ratios (MFU and HFU, bert_core / compiled transformers, kernels on / off, peak / estimate of GPU memory,
process start to first step), then the parts (status, seconds, what each gave) and one line saying how it ran:
the device, whether Ray and MLflow were there. Full output of part P: WORK/P.log (--work, default /tmp/gpu_suite;
copy it to $OUT on the device machine).

The parts, most decisive first in each call:
- call 1: kernels (each fused kernel forward and backward against the PyTorch composition at 128 x 256 rows, H 768
  and 1,024, fp32 and bf16 residual, and the bytes per site); memory (`memory_fit.py --gpu`); step (the compiled
  BERT-base step at 128 x 256, Inductor's composition, the default, beside compiled transformers); step_fused and
  step_fused_bf16 (the same with the fused op, `--fused-kernels on`, and with its bf16 residual): the suite always
  measures both, and the fused op becomes the default only at >= 3% more seq/s;
- call 2: data (seq-128 and seq-512 builds of data/sample, the builder in-process: `--no-ray --no-mlflow`);
  seq512_padded (length buckets, beside compiled transformers) and seq512_packed; job_fresh (60 steps of
  BERT-base at 256 x 128, checkpoint, compiled artifacts into --compile-cache) and job_resumed (the same run to
  step 80 with empty Inductor and Triton caches: a cold node, compiled artifacts only from --compile-cache).
  The job is `jobs/pretrain.py --use-gpu` on Ray Train with MLflow on a local sqlite store when both import,
  `--no-ray` when Ray does not, and `benchmarks/gpu_job.py` (the same flags, config and loop, no MLflow run)
  when MLflow does not: the lent machine without the device bundle;
- call 3: `pytest -m gpu tests` (a test module needing a missing stack is skipped by name).

On a CPU (--dry-run) the parts run at tiny shapes (compiled variants with the aot_eager backend, the kernels in
Triton's interpreter), one after another two at a time; the limits there only guard against hangs (a slow or
busy box takes what it takes), and no budget is enforced.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_report import FIRST_STEP, PartResult, ratios, summary  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ROWS = 128 * 256
BUDGET = 480  # seconds per call: 8 minutes of a lent H100, compiles included
DRY_LIMIT = 900  # seconds per part on a CPU: a guard against a hang, never a speed check
JOB_STEPS = {False: (60, 80), True: (4, 8)}  # (fresh, resumed) --max-steps on the GPU / in a dry run


@dataclass
class Part:
    name: str
    call: int
    limit: int  # seconds on the GPU machine; a call's limits add up to BUDGET
    command: list[str]
    kind: str  # which figures its output gives (gpu_report.summary)
    env: dict[str, str] = field(default_factory=dict)
    after: str | None = None  # the part whose outputs it needs


@dataclass(frozen=True)
class Stack:
    """What this machine has: the job's path and what the table says about it."""

    ray: bool
    mlflow: bool

    @staticmethod
    def here() -> Stack:
        return Stack(importlib.util.find_spec("ray") is not None, importlib.util.find_spec("mlflow") is not None)

    def job(self, dry: bool) -> tuple[list[str], str]:
        """(the job's command head, how it runs). A dry run never starts Ray (2 CPUs: its start is most of it)."""
        if not self.mlflow:
            return (["benchmarks/gpu_job.py", "--no-ray"], "benchmarks/gpu_job.py --no-ray: jobs/pretrain.py's "
                    "config and loop in one process, no MLflow run (MLflow is not installed: carry the bundle)")
        if self.ray and not dry:
            return (["jobs/pretrain.py"],
                    "jobs/pretrain.py on Ray Train, MLflow on a local sqlite store (WORK/mlflow.db)")
        why = "a dry run" if self.ray else "Ray is not installed"
        return ["jobs/pretrain.py", "--no-ray"], f"jobs/pretrain.py --no-ray ({why}), MLflow on WORK/mlflow.db"


def _py(*args: str) -> list[str]:
    return [sys.executable, *args]


def parts(work: Path, dry: bool, stack: Stack) -> list[Part]:
    """Every part of every call; `dry` shrinks them to tiny shapes on the CPU."""
    d128, d512 = str(work / "d128"), str(work / "d512")
    if dry:
        step = ["benchmarks/gpu_step.py", "--device", "cpu", "--preset", "bert_tiny", "--steps", "1", "--warmup",
                "0", "--batches", "1", "--compile-backend", "aot_eager"]
        shape, seq512 = ["--shapes", "16x2x3"], ["--data", d512, "--batch", "2"]
        kernels = ["--device", "cpu", "--rows", "40", "--hidden", "32", "--intermediate", "64", "--residuals", "fp32"]
        job_model = ["--preset", "bert_tiny", "--batch-size", "4", "--log-every", "1", "--no-system-metrics",
                     "--compile", "--compile-backend", "aot_eager", "--checkpoint-every", "4"]
        interp = {"TRITON_INTERPRET": "1"}
    else:
        step = ["benchmarks/gpu_step.py", "--steps", "15", "--warmup", "2"]
        shape, seq512 = ["--shapes", "128x256x20"], ["--data", d512, "--batch", "32"]
        kernels = ["--device", "cuda", "--rows", str(ROWS), "--hidden", "768,1024", "--intermediate", "3072,4096"]
        job_model = ["--preset", "bert_base", "--batch-size", "256", "--use-gpu", "--log-every", "10",
                     "--peak-tflops", "989", "--checkpoint-every", str(JOB_STEPS[False][0])]
        interp = {}
    head, _ = stack.job(dry)
    job = [*head, "--data", d128, *job_model, "--length-buckets", "128", "--storage", str(work / "runs"),
           "--run-name", "suite", "--compile-cache", str(work / "compile-cache")]
    if head[0] == "jobs/pretrain.py":
        job += ["--mlflow-tracking-uri", f"sqlite:///{work / 'mlflow.db'}"]
    fresh, resumed = JOB_STEPS[dry]
    both = "bert_core_compiled,transformers_compiled"
    return [
        Part("kernels", 1, 60, _py(__file__, "--child-kernels", *kernels), "kernels", interp),
        Part("memory", 1, 20, _py("benchmarks/memory_fit.py", "--gpu"), "memory"),
        Part("step", 1, 180, _py(*step, *shape, "--variants", both), "step"),
        Part("step_fused", 1, 110, _py(*step, *shape, "--variants", "bert_core_compiled", "--fused-kernels", "on"),
             "step", interp),
        Part("step_fused_bf16", 1, 110, _py(*step, *shape, "--variants", "bert_core_compiled", "--fused-kernels", "on",
                                            "--low-precision-residual"), "step", interp),
        Part("data", 2, 40, _py(__file__, "--child-data", "--work", str(work)), "data"),
        Part("seq512_padded", 2, 150, _py(*step, *seq512, "--variants", both), "step", after="data"),
        Part("seq512_packed", 2, 90, _py(*step, *seq512, "--packing", "--variants", "bert_core_compiled"), "step",
             after="data"),
        # The fresh run compiles into its own empty caches; the resumed one starts on empty ones too (a cold node):
        # only --compile-cache carries the compiled artifacts across.
        Part("job_fresh", 2, 120, _py(*job, "--max-steps", str(fresh)), "job", _cold(work, "fresh"), after="data"),
        Part("job_resumed", 2, 80, _py(*job, "--max-steps", str(resumed)), "job", _cold(work, "resumed"),
             after="job_fresh"),
        Part("pytest_gpu", 3, BUDGET, _py("-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
                                          "tests"), "pytest"),
    ]


def _cold(work: Path, tag: str) -> dict[str, str]:
    return {"TORCHINDUCTOR_CACHE_DIR": str(work / f"inductor-{tag}"), "TRITON_CACHE_DIR": str(work / f"triton-{tag}")}


# ---- running ---------------------------------------------------------------------------------------------------------

def run_part(part: Part, work: Path, seconds: int) -> PartResult:
    """The part's process, its output streamed into WORK/<part>.log; the moment a "first step done" line arrives is
    noted (the suite's clock from the process start)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
           "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"), "TRITON_CACHE_DIR": str(work / "triton"),
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **part.env}
    log, first = work / f"{part.name}.log", []
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write(f"$ {' '.join(part.command)}\n")
        f.flush()
        # A new session: on timeout the whole group goes (a job's Ray workers, pytest's children).
        proc = subprocess.Popen(part.command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)

        def pump() -> None:
            for line in proc.stdout:
                f.write(line)
                if not first and FIRST_STEP.search(line):
                    first.append(time.monotonic() - t0)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=seconds)
            status = "ok" if rc == 0 else f"failed (rc {rc})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            status = f"timeout ({seconds} s)"
        reader.join(timeout=30)  # a process it left (a Ray daemon) may hold the pipe: the log so far is kept
    return PartResult(status, time.monotonic() - t0, log.read_text(errors="replace"), first[0] if first else None)


def run_all(todo: list[Part], work: Path, deadline: float | None, jobs: int) -> dict[str, PartResult]:
    """Every part of `todo` once its `after` part is done (or not asked for), `jobs` at a time, in list order; with
    a `deadline`, none starts with under 20 s left and none outlives it."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    names = {x.name for x in todo}
    results: dict[str, PartResult] = {}
    pending, running = list(todo), {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while pending or running:
            for part in list(pending):
                if len(running) >= jobs:
                    break
                if part.after in names and part.after not in results:
                    continue
                pending.remove(part)
                if part.after in results and not results[part.after].ok:
                    results[part.name] = PartResult(f"not run ({part.after} did not succeed)", 0.0, "")
                    continue
                limit = part.limit if deadline is None else min(part.limit, int(deadline - time.monotonic()))
                if limit < 20:
                    results[part.name] = PartResult("not run (budget spent)", 0.0, "")
                    continue
                running[pool.submit(run_part, part, work, limit)] = part
            if not running:
                continue
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                part = running.pop(future)
                r = results[part.name] = future.result()
                print(f"{part.name}: {r.status} in {r.seconds:.0f} s: {summary(part.kind, r.out)}", flush=True)
    return results


# ---- children --------------------------------------------------------------------------------------------------------

def child_kernels(args: argparse.Namespace) -> None:
    """The kernels part: self_check at each width, one JSON line per kernel; then the byte table."""
    import torch

    from bert_core.kernels import KernelOptions
    from bert_core.kernels.self_check import self_check
    from bert_core.kernels.traffic import table

    device = torch.device(args.device)
    for hidden, inter in zip(map(int, args.hidden.split(",")), map(int, args.intermediate.split(",")), strict=False):
        for bf16 in [r == "bf16" for r in args.residuals.split(",")]:
            options = KernelOptions(fused=True, fused_bias_gelu=True, low_precision_residual=bf16)
            for name, r in self_check(args.rows, hidden, inter, device, options).items():
                print(json.dumps({"kernel": name + ("[bf16 residual]" if bf16 else ""), "ok": r.ok,
                                  "shape": f"{args.rows}x{hidden}", "figure": r.figure}), flush=True)
    print("\n".join(table(ROWS, 768)))


def child_data(work: Path) -> None:
    """The data part: data/sample built at seq 128 and 512 with the bert-base-uncased vocabulary by the builder's
    plain loop in this process (`--no-ray --no-mlflow`: a benchmark's input, nothing to track; `python
    jobs/build_dataset.py` itself refuses to start where Ray or MLflow is not installed)."""
    from jobs import build_dataset

    vocab = str(REPO / "data/sample/reference/bert-base-uncased-vocab.txt")
    for seq, predictions in ((128, 20), (512, 80)):
        rc = build_dataset.main(["--input", str(REPO / "data/sample/corpus"), "--vocab", vocab, "--no-ray",
                                 "--no-mlflow", "--dupe-factor", "1", "--log-level", "WARNING", "--output",
                                 str(work / f"d{seq}"), "--max-seq-length", str(seq), "--max-predictions-per-seq",
                                 str(predictions)])
        if rc:
            raise SystemExit(f"the seq-{seq} build failed ({rc})")


# ---- the call --------------------------------------------------------------------------------------------------------

def report(todo: list[Part], results: dict[str, PartResult], how: str, dry: bool) -> list[str]:
    lines = []
    for c in sorted({x.call for x in todo}):
        lines += [f"\n## call {c}: ratios\n", "| ratio | value | from |", "|---|---|---|"]
        lines += [f"| {what} | {value} | {where} |" for what, value, where in ratios(c, results, dry)]
    lines += ["\n| part | status | s | figures |", "|---|---|---:|---|"]
    lines += [f"| {x.name} | {results[x.name].status} | {results[x.name].seconds:.0f} | "
              f"{summary(x.kind, results[x.name].out)} |" for x in todo]
    left = [x.name for x in todo if results[x.name].status.startswith("not run")]
    if left:
        lines.append(f"\nnot run: python benchmarks/gpu_suite.py --parts {','.join(left)}")
    lines.append(f"\n{how}")
    return lines


def _device() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
        return f"CPU x{os.cpu_count()}, torch {torch.__version__}"
    except ImportError:
        return "torch not importable"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--call", type=int, choices=(1, 2, 3), help="which call's parts (each fits 8 minutes of an H100)")
    p.add_argument("--parts", default=None, help="comma-separated parts to run instead (of any call, in order)")
    p.add_argument("--dry-run", action="store_true", help="the parts at tiny shapes on the CPU (limits: hang guards)")
    p.add_argument("--budget", type=int, default=BUDGET,
                   help="seconds for the parts together (GPU; a dry run has none)")
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu_suite"), help="builds, checkpoints, caches, logs")
    p.add_argument("--jobs", type=int, default=None,
                   help="parts run at once (default: 1 on a GPU, whose timings need it alone; 2 in a dry run)")
    p.add_argument("--child-kernels", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-data", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--rows", type=int, default=ROWS, help=argparse.SUPPRESS)
    p.add_argument("--hidden", default="768", help=argparse.SUPPRESS)
    p.add_argument("--intermediate", default="3072", help=argparse.SUPPRESS)
    p.add_argument("--residuals", default="fp32,bf16", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_kernels:
        child_kernels(args)
        return 0
    if args.child_data:
        sys.path.insert(0, str(REPO))
        child_data(args.work)
        return 0
    if (args.call is None) == (args.parts is None):
        p.error("give --call 1, 2 or 3 (each fits 8 minutes of an H100), or --parts")
    stack = Stack.here()
    suite = parts(args.work, args.dry_run, stack)
    names = [x.name for x in suite]
    wanted = [x.name for x in suite if x.call == args.call] if args.call else [n.strip() for n in args.parts.split(",")]
    unknown = set(wanted) - set(names)
    if unknown:
        p.error(f"unknown parts {sorted(unknown)}: choose from {names}")
    todo = [x for x in suite if x.name in wanted]
    if args.dry_run:
        todo = [Part(x.name, x.call, DRY_LIMIT, x.command, x.kind, x.env, x.after) for x in todo]
    stale = (["d128", "d512"] if "data" in wanted else []) + (
        ["runs", "compile-cache", "inductor-fresh", "triton-fresh", "inductor-resumed", "triton-resumed",
         "mlflow.db"] if "job_fresh" in wanted else [])  # a fresh build; job_fresh starts a new run on cold caches
    for name in stale:
        target = args.work / name
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    deadline = None if args.dry_run else time.monotonic() + args.budget
    results = run_all(todo, args.work, deadline, args.jobs or (2 if args.dry_run else 1))
    _, job_how = stack.job(args.dry_run)
    how = [f"{'dry run on CPU, tiny shapes (no figures)' if args.dry_run else 'GPU'}: {_device()}",
           f"Ray {'installed' if stack.ray else 'not installed'}, "
           f"MLflow {'installed' if stack.mlflow else 'not installed'}"]
    if "data" in wanted:
        how.append("data: the builder in-process, --no-ray --no-mlflow")
    if {"job_fresh", "job_resumed"} & set(wanted):
        how.append(f"job: {job_how}")
    how = "; ".join(how + [f"logs: {args.work}/<part>.log"])
    print("\n".join(report(todo, results, how, args.dry_run)))
    return 0 if all(results[x.name].ok for x in todo) else 1


if __name__ == "__main__":
    sys.exit(main())
