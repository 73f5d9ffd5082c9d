"""What the build's MLflow run adds to the job's wall time: the same ~1.2 MB build (Moby Dick, the bundled
bert-base-uncased vocabulary) with no tracking, with a fresh sqlite store (the first run ever: the store's tables
are created) and with an existing store, interleaved, each a fresh process as a user runs it; as a plain loop
(--no-ray: nothing to hide MLflow's start-up behind) and with the local Ray the job starts (the laptop default).

    python benchmarks/build_tracking_cost.py [--repeats 3] [--modes no-ray,local-ray]

Prints the median wall time of each and the difference to the untracked job, and the job's own figure: how long it
waited for the MLflow thread after the build ("the job waited X s (wall) for it after the build"), which does not
depend on how busy the machine was before that. The run opens in a background thread at the job's start and draws
its figures after the build, before Ray (when there is one) shuts down, so what remains on the critical path is that
wait.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "sample"


def run(out: Path, tracking: str | None, mode: str) -> tuple[float, float | None]:
    """(the job's wall time, how long it waited for MLflow after the build, None without tracking)."""
    cmd = [sys.executable, str(REPO / "jobs" / "build_dataset.py"), "--input",
           str(SAMPLE / "corpus" / "mobydick.jsonl.gz"), "--output", str(out), "--vocab",
           str(SAMPLE / "reference" / "bert-base-uncased-vocab.txt"), "--dupe-factor", "1", "--num-shards", "2",
           "--log-level", "INFO", "--progress", "lines"] + (["--no-ray"] if mode == "no-ray" else [])
    cmd += ["--mlflow-tracking-uri", tracking] if tracking else ["--no-mlflow"]
    env = os.environ | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # loopback only
    env.pop("RAY_ADDRESS", None)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if p.returncode != 0:
        raise SystemExit(f"the job failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    wall = time.perf_counter() - t0
    waited = re.search(r"the job waited ([\d.]+) s \(wall\) for it after the build", p.stderr)
    return wall, float(waited.group(1)) if waited else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default="no-ray,local-ray")
    args = p.parse_args()
    for mode in args.modes.split(","):
        kinds = ("no tracking", "fresh sqlite store", "existing sqlite store")
        times: dict[str, list[float]] = {k: [] for k in kinds}
        waits: dict[str, list[float]] = {k: [] for k in kinds}
        with tempfile.TemporaryDirectory(prefix="tracking-cost-") as d:
            root = Path(d)
            existing = f"sqlite:///{root / 'existing.db'}"
            run(root / "warm", existing, mode)  # creates the store (and warms the page cache), not timed
            for i in range(args.repeats):
                for kind, uri in zip(kinds, (None, f"sqlite:///{root / f'fresh-{i}.db'}", existing), strict=False):
                    wall, waited = run(root / f"{i}-{kinds.index(kind)}", uri, mode)
                    times[kind].append(wall)
                    if waited is not None:
                        waits[kind].append(waited)
                    shutil.rmtree(root / f"{i}-{kinds.index(kind)}")
        base = statistics.median(times["no tracking"])
        print(f"{mode}: job wall time, median of {args.repeats} (one process each, ~1.2 MB build):")
        for kind in kinds:
            med = statistics.median(times[kind])
            waited = f"; waited for MLflow after the build: median {statistics.median(waits[kind]):.1f} s" \
                if waits[kind] else ""
            print(f"  {kind:24s} {med:6.2f} s  ({med - base:+.2f} s, {med / base:.2f}x){waited}   runs: "
                  + ", ".join(f"{t:.2f}" for t in times[kind]))

if __name__ == "__main__":
    main()
