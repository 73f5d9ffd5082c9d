"""The figures of `benchmarks/gpu_suite.py`'s parts, read from their output, and the table of ratios a call ends with.

Each part's output is its log (WORK/<part>.log); what is read from it:
- step parts (`benchmarks/gpu_step.py`): its `result {...}` JSON line per variant (seq/s, MFU, HFU, peak GPU memory
  and bert_core's `pretraining.memory.estimate` of it, first step, the process's age at the end of its first step);
- kernels: one JSON line per kernel checked against the composition (`bert_core.kernels.self_check`);
- memory: `benchmarks/memory_fit.py --gpu`'s `estimate/measured R` lines;
- job parts: the loop's `first step done` and `run throughput after warm-up:` lines, the resume and the compiled
  artifacts loaded; the time from the job's process start to its first step is the suite's own clock (the line's
  arrival), so it counts the driver, Ray's start and the workers', not only the worker's age;
- data: the builds' JSON lines; pytest: its summary line.

`ratios(call, parts)` turns them into rows (what, value, where from); a figure a part did not give is "-".
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

FIRST_STEP = re.compile(r"first step done ([\d.]+) s after the process started")
BAR = 1.03  # the fused op becomes the default only at >= 3% more seq/s than the composition (issue 33)


@dataclass
class PartResult:
    status: str  # ok, failed (rc N), timeout (N s), not run (...)
    seconds: float
    out: str  # the part's whole output
    first_step_s: float | None = None  # suite clock: the part's process start to its "first step done" line

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def step_results(out: str) -> dict[str, dict]:
    """{variant: its result line} of a gpu_step.py run (the last workload's, where it ran several)."""
    rows = [json.loads(line[len("result "):]) for line in out.splitlines() if line.startswith("result {")]
    return {r["variant"]: r for r in rows}


def kernel_results(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"kernel"')]


def job_figures(out: str) -> dict[str, str]:
    run = re.search(r"run throughput after warm-up: (.*)", out)
    got = dict(kv.split("=", 1) for kv in run[1].split()) if run else {}
    worker_age = FIRST_STEP.search(out)
    resumed = re.search(r"resumed from \S+ at step (\d+)", out)
    return {**got, "worker_age_s": worker_age[1] if worker_age else None,
            "resumed_at": resumed[1] if resumed else None,
            "artifacts_loaded": "loaded compiled artifacts" in out}


def summary(kind: str, out: str) -> str:
    """One cell of the parts table: what the part gave, briefly."""
    if kind == "step":
        return "; ".join(f"{v} {r['seq_per_s']} seq/s" for v, r in step_results(out).items()) or "-"
    if kind == "kernels":
        return "; ".join(f"{r['kernel']}@{r['shape']} {'ok' if r['ok'] else 'FAILED'}"
                         for r in kernel_results(out)) or "-"
    if kind == "pytest":
        found = re.findall(r"^=*\s*(\d+ (?:passed|failed|skipped|errors?|deselected).*?)(?: in [\d.]+s.*)?=*$", out,
                           re.M)
        return found[-1].strip() if found else "-"
    if kind == "memory":
        return f"{len(re.findall(r'estimate/measured', out))} measured peaks, {out.count('plan: ')} plans"
    if kind == "job":
        f = job_figures(out)
        keys = ("sequences_per_second", "mfu", "data_wait_fraction")
        return ", ".join(f"{k} {f[k]}" for k in keys if f.get(k)) or "-"
    if kind == "data":
        built = [json.loads(line) for line in out.splitlines() if line.startswith('{"output"')]
        return "; ".join(f"{b['instances']} instances" for b in built) or "-"
    return "-"


def _pct(x) -> str:
    return f"{float(x):.1%}" if x not in (None, "") else "-"


def _ratio(a, b) -> str:
    return f"{float(a) / float(b):.2f}" if a not in (None, "") and b not in (None, "", 0) else "-"


def _s(x) -> str:
    return f"{float(x):.1f} s" if x not in (None, "") else "-"


def _step(parts: dict[str, PartResult], name: str, variant: str) -> dict:
    part = parts.get(name)
    return step_results(part.out).get(variant, {}) if part is not None else {}


def _utilisation_rows(parts, name: str, variant: str, label: str) -> list[tuple[str, str, str]]:
    r = _step(parts, name, variant)
    return [(f"MFU / HFU, {label}", f"{_pct(r.get('mfu'))} / {_pct(r.get('hfu'))}", f"{name}: {variant}"),
            (f"peak / estimate GPU memory, {label}", _ratio(r.get("peak_gib"), r.get("estimate_gib")),
             f"{name}: {variant} (pretraining.memory.estimate)") if variant.startswith("bert_core") else None]


def ratios(call: int, parts: dict[str, PartResult], dry: bool = False) -> list[tuple[str, str, str]]:
    """The call's table: (what, value, where from). `dry`: a CPU dry run, whose values are no figures (no verdict)."""
    rows: list[tuple[str, str, str] | None] = []
    if call == 1:
        ours, theirs = _step(parts, "step", "bert_core_compiled"), _step(parts, "step", "transformers_compiled")
        fused, bf16 = _step(parts, "step_fused", "bert_core_compiled"), _step(parts, "step_fused_bf16",
                                                                             "bert_core_compiled")
        rows += _utilisation_rows(parts, "step", "bert_core_compiled", "bert_core compiled, seq 128 x 256 (default)")
        rows += [("MFU / HFU, transformers compiled, seq 128 x 256", f"{_pct(theirs.get('mfu'))} / "
                  f"{_pct(theirs.get('hfu'))}", "step: transformers_compiled")]
        rows += [("bert_core / transformers compiled, seq/s at 128 x 256",
                  _ratio(ours.get("seq_per_s"), theirs.get("seq_per_s")), "step")]
        on_off = _ratio(fused.get("seq_per_s"), ours.get("seq_per_s"))
        verdict = ("" if on_off == "-" or dry else f" (>= {BAR:.2f}: the fused op may become the default)"
                   if float(on_off) >= BAR else f" (< {BAR:.2f}: the composition stays the default)")
        rows += [("kernels on / off (fused op / composition), seq/s", on_off + verdict, "step_fused / step")]
        rows += [("kernels on with bf16 residual / off, seq/s", _ratio(bf16.get("seq_per_s"), ours.get("seq_per_s")),
                  "step_fused_bf16 / step")]
        rows += _utilisation_rows(parts, "step_fused", "bert_core_compiled", "fused op")[1:]
        rows += [("process start to first step (compile included), bert_core compiled",
                  _s(ours.get("process_age_s")), "step: its process's age")]
        checked = kernel_results(parts["kernels"].out) if "kernels" in parts else []
        rows += [("kernels agreeing with the composition at training shapes",
                  f"{sum(k['ok'] for k in checked)} of {len(checked)}" if checked else "-", "kernels")]
        memory = parts.get("memory")
        found = re.findall(r"estimate/measured ([\d.]+)", memory.out) if memory else []
        rows += [("estimate / measured, the 2026-11-24 H100 peaks", ", ".join(found) or "-", "memory")]
    elif call == 2:
        padded, theirs = (_step(parts, "seq512_padded", "bert_core_compiled"),
                          _step(parts, "seq512_padded", "transformers_compiled"))
        packed = _step(parts, "seq512_packed", "bert_core_compiled")
        rows += _utilisation_rows(parts, "seq512_padded", "bert_core_compiled", "seq 512, length buckets")
        rows += [("bert_core / transformers compiled, seq/s at seq 512 (real sequences)",
                  _ratio(padded.get("seq_per_s"), theirs.get("seq_per_s")), "seq512_padded")]
        rows += _utilisation_rows(parts, "seq512_packed", "bert_core_compiled", "seq 512, packed rows")
        rows += [("packed / padded, real sequences/s at seq 512", _ratio(packed.get("seq_per_s"),
                                                                        padded.get("seq_per_s")),
                  "seq512_packed / seq512_padded")]
        fresh, resumed = parts.get("job_fresh"), parts.get("job_resumed")
        for name, part in (("job_fresh", fresh), ("job_resumed", resumed)):
            f = job_figures(part.out) if part is not None else {}
            label = "the job, fresh" if name == "job_fresh" else "the job, resumed on a cold node"
            rows += [(f"process start to first step, {label}", _s(part.first_step_s if part else None),
                      f"{name}: the suite's clock (worker's own age {_s(f.get('worker_age_s'))})"),
                     (f"MFU / HFU of real tokens, {label}", f"{_pct(f.get('mfu'))} / {_pct(f.get('hfu'))}",
                      f"{name}: run throughput after warm-up"),
                     (f"data wait, {label}", _pct(f.get("data_wait_fraction")), name)]
        if resumed is not None:
            f = job_figures(resumed.out)
            rows += [("resumed / fresh, process start to first step",
                      _ratio(resumed.first_step_s, fresh.first_step_s if fresh else None), "job_resumed / job_fresh"),
                     ("the resumed run's start", f"step {f['resumed_at'] or '-'}, compiled artifacts "
                      f"{'loaded from --compile-cache' if f['artifacts_loaded'] else 'NOT loaded'}", "job_resumed")]
    elif call == 3:
        part = parts.get("pytest_gpu")
        rows += [("pytest -m gpu tests", summary("pytest", part.out) if part else "-", "pytest_gpu")]
    return [r for r in rows if r is not None]
