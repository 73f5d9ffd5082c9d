"""Progress lines: items done/total, MB of text, MB/s and an ETA, every duration marked wall or CPU, and lines
while nothing finishes (no silent minute)."""
from __future__ import annotations

import logging
import re
import time

import pipeline.progress as progress
from pipeline.progress import StageProgress


def test_a_line_says_items_bytes_rate_eta_and_wall(monkeypatch):
    p = StageProgress("instances", "units", total=4, total_bytes=40_000_000, lines=False)
    assert re.fullmatch(r"instances: 0/4 units, 0\.0/40\.0 MB of text, ETA -- \(\d+\.\d s wall\)", p.line())
    p.t0 -= 10.0  # ten seconds in: one unit of 10 MB done
    p.add(10_000_000)
    line = p.line()
    assert re.fullmatch(r"instances: 1/4 units, 10\.0/40\.0 MB of text, 1\.0 MB/s, ETA 30 s \(10\.\d s wall\)", line)
    summary = p.finish()
    assert "done in 10." in summary and "s wall" in summary and "driver CPU" in summary
    assert "since start)" not in summary  # the old line read CPU seconds as if they were wall time


def test_items_without_sizes_get_an_eta_from_items():
    p = StageProgress("shards", "shards", total=10, total_bytes=0, lines=False)
    p.t0 -= 4.0
    p.add(0)
    p.add(0)
    assert re.fullmatch(r"shards: 2/10 shards, ETA 16 s \(4\.\d s wall\)", p.line())


def test_lines_keep_coming_while_no_item_finishes(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger=progress.__name__)
    p = StageProgress("pool_parts", "units", total=3, total_bytes=3_000_000, first_interval=0.05)
    time.sleep(0.4)
    p.finish()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pool_parts: 0/3 units")]
    assert len(lines) >= 3, lines


def test_a_build_says_what_each_stage_did_in_wall_and_cpu_seconds(caplog, tmp_path, sample_dir):
    from corpus.create_instances import InstanceConfig
    from pipeline import BuildConfig, build

    caplog.set_level(logging.INFO)
    build(BuildConfig(inputs=(str(sample_dir / "corpus" / "austen.jsonl.gz"),), output=str(tmp_path / "out"),
                      vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), dupe_factor=1,
                      unit_bytes=1 << 20, instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10)))
    done = {m.split(":")[0]: m for m in (r.getMessage() for r in caplog.records) if " done in " in m}
    assert set(done) == {"pieces", "read", "pool", "instances", "shards"}, done
    for stage in ("read", "instances"):  # per-unit stages: the MB of text they went through
        assert re.match(rf"{stage}: \d+ units \(\d+\.\d MB of text\) done in \d+\.\d s wall, \d+\.\d MB/s; driver "
                        r"CPU \d\.\d\d s this stage, \d+\.\d s since the driver started", done[stage]), done[stage]
