"""The curation benchmarks run end to end in their small forms: benchmarks/curate_cost.py (every stage's cost
against the build's, near dedup on a local Ray, a worker's peak memory) and benchmarks/langid_candidates.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_curate_cost_smoke_prints_every_part():
    done = subprocess.run([sys.executable, "benchmarks/curate_cost.py", "--smoke", "--scales", "1",
                           "--ray-scales", "2", "--distinct", "--repeats", "2"], cwd=REPO,
                          capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for line in ("| **the build**", "| language |", "| quality |", "| decontaminate |",
                 "| dedup near: signatures", "| no dedup |", "| --dedup near |",
                 "MB (1x) |", "MB (2x) |", "adds ", "(medians of 2; budget: 30%)", "dedup's own stages"):
        assert line in out, line
    ray_rows = [ln for ln in out.splitlines() if "MB (2x) |" in ln]
    assert len(ray_rows) == 4 and "curate " in ray_rows[1] and "curate " not in ray_rows[0], ray_rows  # alternated
    peak = [ln for ln in out.splitlines() if "MB (1x) |" in ln][-1].split("|")  # part 3's row
    private, curate, shared, rss = (float(c.split()[0]) for c in peak[-5:-1])
    assert private > 50 and curate > 50  # a real worker's private memory was sampled, over the build and in curate
    assert rss >= private and rss > 50  # (shared can be 0: a tiny build may never map the store's pages)


@pytest.mark.timeout(300)
def test_langid_candidates_smoke():
    done = subprocess.run([sys.executable, "benchmarks/langid_candidates.py", "--smoke"], cwd=REPO,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [ln for ln in done.stdout.splitlines() if ln.startswith("| fastText") or ln.startswith("| ours")]
    assert len(rows) == 6 and all(float(r.split("|")[3]) >= 0.9 for r in rows), rows


def test_stage_costs_read_off_a_real_jobs_log(tmp_path, sample_dir):
    """benchmarks/build_throughput.py's cost per stage, from the log of a real build with --dedup near (the plain
    loop: the same log lines as on Ray) and a made-up CPU series of 1 CPU-s per second."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from stage_costs import stage_costs, stage_line

    launch = ("import logging, sys; logging.basicConfig(level=logging.INFO, format='%(relativeCreated)d ms "
              "%(name)s: %(message)s'); from jobs import build_dataset; sys.exit(build_dataset.main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", launch, "--input", str(sample_dir / "corpus" / "mobydick.jsonl.gz"),
                           "--output", str(tmp_path / "out"), "--vocab",
                           str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), "--dupe-factor", "1",
                           "--max-seq-length", "64", "--dedup", "near", "--no-ray", "--no-mlflow", "--progress",
                           "lines"], cwd=REPO, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    costs = stage_costs(done.stderr, [(t / 10, t / 10) for t in range(0, 3000)])
    assert list(costs) == ["read", "curate", "reports", "pool", "instances", "shards"]
    assert all(c["wall_s"] >= 0 and abs(c["cpu_s"] - c["wall_s"]) < 0.02 for c in costs.values())
    assert {"ReadCorpus", "SignatureColumns", "SplitTokenize"} <= costs["read"]["ops"].keys()
    assert "CountPairs" in costs["instances"]["ops"] and "curate " in stage_line(costs)
    assert not any("worker_private_mb" in c for c in costs.values())  # no memory figure without one in the series
    # With a worker's private memory in the series (here MB = 10 x seconds): each stage's peak is its last sample's.
    mem = stage_costs(done.stderr, [(t / 10, t / 10, float(t)) for t in range(0, 3000)])
    peaks = [c["worker_private_mb"] for c in mem.values() if "worker_private_mb" in c]
    assert "worker_private_mb" in mem["read"] and peaks == sorted(peaks) and len(set(peaks)) == len(peaks)
    stages = list(mem.values())
    # One stage ends where the next starts: peaks 10 x its wall apart.
    for before, c in zip(stages, stages[1:], strict=False):
        if "worker_private_mb" in before and "worker_private_mb" in c:
            assert abs(c["worker_private_mb"] - before["worker_private_mb"] - 10 * c["wall_s"]) <= 1.5, mem
    assert "worker private " in stage_line(mem)
