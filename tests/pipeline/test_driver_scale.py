"""The driver holds at 1 TB (issue 41): waiting for units never lists a folder that grows with them nor reads their
markers back from storage (Ray hands each write task's markers to the driver), a big build's units go a few to a
Ray Data task (Ray Data's per-task cost in the driver divided) without changing a byte of the output, a task of
several units commits them one at a time, and the markers the driver keeps are compact and equal to what came.
``benchmarks/build_driver_scale.py`` measures the same at 250,000 units."""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import tracemalloc
from collections import Counter

import pyarrow as pa
import pytest
from _corpus import ships_corpus

from corpus.create_instances import InstanceConfig
from pipeline import BuildConfig, build
from pipeline.executor import LocalExecutor
from pipeline.markers import Counts, Marker, compact, marker


def _cfg(tmp_path, corpus, sample_dir, name):
    return BuildConfig(inputs=(corpus,), output=str(tmp_path / name), dupe_factor=2, num_shards=3, pool_tokens=1500,
                       vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"), unit_bytes=1024,
                       instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10))


def _counting(monkeypatch):
    """LIST calls by folder name and GETs of marker files, in this (the driver's) process only."""
    import fsspec.implementations.local as local

    lists: Counter = Counter()
    gets = [0]
    ls, cat = local.LocalFileSystem.ls, local.LocalFileSystem.cat_file

    def counting_ls(self, path, *a, **kw):
        lists[os.path.basename(str(path).rstrip("/"))] += 1
        return ls(self, path, *a, **kw)

    def counting_cat(self, path, *a, **kw):
        gets[0] += str(path).endswith(".done.json")
        return cat(self, path, *a, **kw)

    monkeypatch.setattr(local.LocalFileSystem, "ls", counting_ls)
    monkeypatch.setattr(local.LocalFileSystem, "cat_file", counting_cat)
    return lists, gets


def _files(out):
    m = json.load(open(os.path.join(out, "manifest.json")))
    return m, {s["file"]: open(os.path.join(out, s["file"]), "rb").read() for s in m["shards"]}


@pytest.mark.timeout(600)
def test_waiting_for_units_lists_nothing_that_grows_and_grouped_units_change_no_byte(ray_local, tmp_path,
                                                                                     sample_dir, monkeypatch):
    """The attack: before, the driver listed each row pass's marker folder every 2 s while it ran and read every new
    marker back (a GET per unit); the LIST calls grew with the build's length and the GETs with its units."""
    from pipeline.ray_data import RayDataExecutor
    from pipeline.ray_data.datasource import units_per_task

    small = ships_corpus(tmp_path / "small.jsonl", 6, sentences=10)
    big = ships_corpus(tmp_path / "big.jsonl", 60, sentences=10)  # ~40 units of 1 KiB: grouped on one CPU
    build(_cfg(tmp_path, big, sample_dir, "plain"), LocalExecutor())
    m_plain, plain = _files(tmp_path / "plain")
    counts = []
    for corpus, name in ((small, "ray-small"), (big, "ray-big")):
        lists, gets = _counting(monkeypatch)
        build(_cfg(tmp_path, corpus, sample_dir, name), RayDataExecutor(num_cpus=1))
        counts.append((dict(lists), gets[0]))
        monkeypatch.undo()
    (small_lists, small_gets), (big_lists, big_gets) = counts
    units = len(json.load(open(tmp_path / "ray-big" / "manifest.json"))["inputs"]) and sum(
        1 for _ in range(0, os.path.getsize(big), 1024))
    assert units_per_task(units, 1) > 1, units  # the big build really ran several units per task
    assert small_gets == big_gets == 0, (small_gets, big_gets)
    assert small_lists == big_lists, (small_lists, big_lists)  # the same LISTs for 3 units as for 40
    assert big_lists.get("read", 0) <= 1, big_lists  # once: the resume's look for committed markers
    m_big, ray_big = _files(tmp_path / "ray-big")
    assert ray_big == plain  # grouped units: the same shards, byte for byte
    assert m_big["totals"] == m_plain["totals"]


def test_a_task_of_several_units_commits_each_as_the_next_one_begins():
    """A task's units come as a stream of blocks (one unit may span blocks): each unit is handed to the sink whole,
    and before the task's later units are read, so that a worker holds one unit at a time."""
    from pipeline.ray_data.datasource import UnitsDatasink

    events: list[str] = []

    class Sink:  # records what it is handed: the datasink under test is what groups the rows
        def write(self, tables):
            units = sorted(set(sum((t.column("unit").to_pylist() for t in tables), [])))
            events.append("write " + ",".join(units))
            return [units]

    def blocks():
        for uid, parts in (("u1", 2), ("u2", 1), ("u3", 3)):
            for p in range(parts):
                events.append(f"read {uid}.{p}")
                yield pa.table({"unit": [uid] * 2, "x": [p, p]})

    out = [pickle.loads(b) for b in UnitsDatasink(Sink()).write(blocks(), None)]
    assert out == [["u1"], ["u2"], ["u3"]]  # each unit whole, alone
    assert events == ["read u1.0", "read u1.1", "read u2.0", "write u1", "read u3.0", "write u2", "read u3.1",
                      "read u3.2", "write u3"]


@marker("scale_probe")
class _Probe(Marker):
    uid: str
    """The unit."""
    path: str
    """Its input."""
    rows: tuple[int, ...]
    """Rows per pass."""
    cuts: tuple[tuple[int, ...], ...]
    """Cut points per pass."""
    histogram: dict[str, int]
    """A histogram as workers send it."""
    dropped: dict[str, int]
    """A small count table."""


def _probe(i: int) -> _Probe:
    return _Probe(uid=f"00000-{i:05d}", path="/data/corpus/part-00000.txt", rows=(2928 + i % 7, 2912, 3199),
                  cuts=((0, 409, 856 + i % 3, 1226), (0, 417, 832, 1253)),
                  histogram={str(k): 1000 + k * 3 + i % 5 for k in range(10, 128)}, dropped={"no_tokens": i % 2})


def test_kept_markers_equal_what_came_and_are_bounded_per_unit():
    """What the driver keeps of a unit's marker (``compact``) reads and compares as the marker did, survives JSON and
    pickle, and costs at most ~1.5 KB for a marker whose dicts and ints came to ~10 KB once unpickled."""
    m = _probe(3)
    c = compact(pickle.loads(pickle.dumps(m)))
    assert c == m and isinstance(c.histogram, Counts) and c.histogram["20"] == m.histogram["20"]
    assert Counter(c.histogram) == Counter(m.histogram) and dict(c.histogram) == m.histogram
    assert _Probe.from_json(c.to_json()) == m and pickle.loads(pickle.dumps(c)) == m
    assert dataclasses.asdict(c)["histogram"] == m.histogram

    def held(n, keep):
        wire = [pickle.dumps(_probe(i)) for i in range(n)]
        tracemalloc.start()
        kept = [keep(pickle.loads(w)) for w in wire]
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert len(kept) == n
        return size / n

    raw, kept = held(2000, lambda x: x), held(2000, compact)
    assert raw > 8000, raw  # what the driver held per unit before
    assert kept < 2000, (kept, raw)
