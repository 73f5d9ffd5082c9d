"""The cost of each stage of a build job, from its own log and a CPU series sampled while it ran
(``build_throughput.py`` prints it per run): wall seconds from one stage's end to the next (a stage's planning
included: the curate stage's dedup decision is made while it is planned) and the CPU-seconds of every process
watched over that span (interpolated between samples), plus the row passes' operators' own CPU-seconds as the job
counted them (``<stage> operators: ...`` lines); with a third figure per sample (the largest private memory of any
one Ray worker then, MB), each stage's peak of it, to tell which stage a worker's memory grows in.

    series = [(seconds since start, CPU-seconds so far[, worker private MB]), ...]   # sampled by the benchmark
    costs = stage_costs(log_text, series)   # {stage: {"wall_s", "cpu_s", "ops": {op: cpu_s}[, "worker_private_mb"]}}
"""
from __future__ import annotations

import bisect
import re

_DONE = re.compile(r"^(\d+) ms pipeline\.executor: ([\w-]+): .* done in [\d.]+ s wall")
_START = re.compile(r"^(\d+) ms pipeline\.executor: read: \d+ \w+ to run")
_OPS = re.compile(r"^\d+ ms pipeline\.executor: ([\w-]+) operators: (.*)$")
_OP = re.compile(r"(\w+) [\d,]+ -> [\d,]+ rows, [\d.]+ MB out, ([\d.]+) CPU-s")


def cpu_at(series: list[tuple[float, float]], t: float) -> float:
    """CPU-seconds so far at time ``t``, linear between samples."""
    if not series:
        return 0.0
    times = [s[0] for s in series]
    k = bisect.bisect_left(times, t)
    if k == 0:
        return series[0][1]
    if k >= len(series):
        return series[-1][1]
    (t0, c0), (t1, c1) = series[k - 1][:2], series[k][:2]
    return c0 + (c1 - c0) * (t - t0) / max(t1 - t0, 1e-9)


def stage_costs(log_text: str, series: list[tuple[float, float]]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    last = None
    for line in log_text.splitlines():
        if last is None and (m := _START.match(line)):
            last = int(m.group(1)) / 1e3
        elif (m := _DONE.match(line)) and last is not None:
            end = int(m.group(1)) / 1e3
            out[m.group(2)] = {"wall_s": round(end - last, 2),
                               "cpu_s": round(cpu_at(series, end) - cpu_at(series, last), 2), "ops": {}}
            mem = [s[2] for s in series if len(s) > 2 and last < s[0] <= end]
            if mem:
                out[m.group(2)]["worker_private_mb"] = round(max(mem))
            last = end
        elif (m := _OPS.match(line)) and m.group(1) in out:
            out[m.group(1)]["ops"] = {op: float(cpu) for op, cpu in _OP.findall(m.group(2))}
    return out


def stage_line(costs: dict[str, dict]) -> str:
    return "stages: " + "; ".join(
        f"{name} {c['wall_s']:.1f} s wall, {c['cpu_s']:.1f} CPU-s"
        + (f", worker private {c['worker_private_mb']} MB" if "worker_private_mb" in c else "")
        + (f" (operators: {', '.join(f'{op} {v:.1f}' for op, v in c['ops'].items())})" if c["ops"] else "")
        for name, c in costs.items())
