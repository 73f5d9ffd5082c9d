"""pipeline.inputs.pieces: one big compressed input is cut into pieces of about one unit, in bounded memory, and the
dataset built from it is byte-identical to the one built from the same text uncompressed; a killed pieces step
resumes; bad compressed inputs fail naming the file or are counted."""
from __future__ import annotations

import gzip
import json
import os
import shutil

import pytest

import pipeline.inputs.pieces as pieces_mod
from corpus.create_instances import InstanceConfig
from corpus.readers import InputError, ReadOptions
from pipeline import BuildConfig, build
from pipeline.inputs.pieces import CHUNK, PieceContext, PieceItem, PieceMarker, pieces_step, plan_pieces
from storage.fs import expand_inputs

UNIT = 128 << 10


@pytest.fixture(scope="module")
def moby(tmp_path_factory, sample_dir):
    """Moby Dick in the reference contract (one sentence per line, blank line between chapters): 1.2 MB of real
    text, as ``plain/moby.txt`` and ``gz/moby.txt.gz``."""
    root = tmp_path_factory.mktemp("moby")
    raw = gzip.decompress((sample_dir / "reference" / "mobydick.sentences.txt.gz").read_bytes())
    (root / "plain").mkdir()
    (root / "gz").mkdir()
    (root / "plain" / "moby.txt").write_bytes(raw)
    (root / "gz" / "moby.txt.gz").write_bytes(gzip.compress(raw, compresslevel=1))
    return root, raw


def _cfg(out, inputs, sample_dir, unit=UNIT, **kw):
    kw.setdefault("vocab", str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"))
    return BuildConfig(inputs=tuple(inputs), output=str(out), dupe_factor=1, num_shards=3, unit_bytes=unit,
                       read=ReadOptions(presplit=True),
                       instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10), **kw)


def _shard_bytes(out):
    m = json.load(open(os.path.join(out, "manifest.json")))
    return m, [open(os.path.join(out, s["file"]), "rb").read() for s in m["shards"]]


def _record(monkeypatch):
    """The markers of the pieces tasks the build runs (PiecesStep calls pipeline.inputs.pieces.pieces_step)."""
    seen, real = [], pieces_mod.pieces_step

    def spy(task, ctx):
        m = real(task, ctx)
        seen.append(m)
        return m
    monkeypatch.setattr(pieces_mod, "pieces_step", spy)
    return seen


# 16 KiB: shorter than Moby Dick's longest chapters, so some pieces (and the same units of the plain text) are empty.
@pytest.mark.parametrize("unit", [UNIT, 16 << 10])
def test_big_gz_builds_in_pieces_identical_to_uncompressed(moby, tmp_path, sample_dir, monkeypatch, unit):
    root, raw = moby
    seen = _record(monkeypatch)
    build(_cfg(tmp_path / "plain", [str(root / "plain")], sample_dir, unit))
    assert not seen  # an uncompressed input needs no pieces, a compressed one does
    build(_cfg(tmp_path / "gz", [str(root / "gz")], sample_dir, unit))
    assert len(seen) == 1
    marker = seen[0]
    assert marker.decompressed_bytes == len(raw) and len(marker.pieces) == -(-len(raw) // unit)
    # Bounded: a piece is one unit plus the rest of the document it reached the unit in; one chunk is held.
    longest_doc = max(len(d) for d in raw.split(b"\n\n"))
    assert marker.largest_piece_bytes <= unit + longest_doc + 2
    assert marker.buffer_bytes <= CHUNK
    # Pieces tile the decompressed text exactly, each starting at a document boundary.
    assert [p[1] for p in marker.pieces[1:]] == [p[2] for p in marker.pieces[:-1]]
    assert marker.pieces[0][1] == 0 and marker.pieces[-1][2] == len(raw)
    assert all(raw[s - 2:s] == b"\n\n" or raw[:s].rstrip(b" \t\r\n") != raw[:s] for _, s, _ in marker.pieces[1:])
    m_gz, s_gz = _shard_bytes(tmp_path / "gz")
    m_plain, s_plain = _shard_bytes(tmp_path / "plain")
    assert s_gz == s_plain  # byte-identical shards from the .gz and from the plain text
    assert m_gz["totals"] == m_plain["totals"] and m_gz["totals"]["documents"] > 100


def test_pieces_step_memory_stays_flat_on_a_big_file(tmp_path, sample_dir):
    raw = gzip.decompress((sample_dir / "corpus" / "austen.jsonl.gz").read_bytes())
    with gzip.open(tmp_path / "big.jsonl.gz", "wb", compresslevel=1) as f:
        for _ in range(6):  # ~24 MB of JSON Lines
            f.write(raw)
    files = expand_inputs([str(tmp_path / "big.jsonl.gz")])
    unit = 1 << 20
    [task] = plan_pieces(files, ReadOptions(), unit)
    m = pieces_step(task, PieceContext(str(tmp_path / "work"), unit, ReadOptions()))
    assert m.decompressed_bytes == 6 * len(raw)
    longest = max(len(line) for line in raw.split(b"\n"))
    assert len(m.pieces) >= m.decompressed_bytes // (unit + longest)
    assert m.largest_piece_bytes <= unit + longest + 1
    if m.rss_growth_bytes is not None:  # Linux: the task's RSS grew by a few buffers, not by the file
        assert m.rss_growth_bytes < 16 << 20 < m.decompressed_bytes
    assert sorted(os.listdir(tmp_path / "work" / "pieces")) == sorted(
        [p[0] for p in m.pieces] + [f"{m.key}.done.json"])
    committed = (tmp_path / "work" / "pieces" / f"{m.key}.done.json").read_text()
    assert PieceMarker.from_json(committed) == m and m.stage == "pieces"  # a typed marker, read back whole


def test_small_compressed_files_need_no_pieces(tmp_path):
    (tmp_path / "small.txt.gz").write_bytes(gzip.compress(b"One.\n\nTwo.\n" * 10))
    (tmp_path / "big.txt.gz").write_bytes(gzip.compress(b"One sentence here.\n\n" * 5000))
    (tmp_path / "plain.txt").write_bytes(b"x.\n" * 5000)
    tasks = plan_pieces(expand_inputs([str(tmp_path)]), ReadOptions(), 4096)
    # The gzip trailer says the small one is 110 bytes, the big one 100 kB; plain files never need pieces.
    assert [os.path.basename(t.path) for t in tasks] == ["big.txt.gz"]


def test_killed_pieces_step_resumes_to_the_same_dataset(moby, tmp_path, sample_dir, monkeypatch):
    root, _ = moby
    gz2 = tmp_path / "in"
    gz2.mkdir()
    shutil.copy(root / "gz" / "moby.txt.gz", gz2 / "a.txt.gz")
    shutil.copy(root / "gz" / "moby.txt.gz", gz2 / "b.txt.gz")
    build(_cfg(tmp_path / "ref", [str(gz2)], sample_dir))
    # Die while committing the 3rd piece of the first file: two pieces committed, no marker.
    real_commit, commits = pieces_mod._PieceWriter.commit, []

    def dying_commit(self):
        commits.append(1)
        if len(commits) == 3:
            raise OSError("killed")
        real_commit(self)
    monkeypatch.setattr(pieces_mod._PieceWriter, "commit", dying_commit)
    with pytest.raises(OSError, match="killed"):
        build(_cfg(tmp_path / "out", [str(gz2)], sample_dir))
    work = tmp_path / "out" / "_work" / "pieces"
    names = os.listdir(work)
    assert not [n for n in names if n.endswith(".done.json") or ".tmp-" in n] and len(names) == 2
    monkeypatch.setattr(pieces_mod._PieceWriter, "commit", real_commit)
    # Kill after the first file's marker: only the second file is cut again.
    seen, real_step = [], pieces_mod.pieces_step

    def second_dies(task, ctx):
        if task.index == 1:
            raise OSError("killed")
        m = real_step(task, ctx)
        seen.append(m)
        return m
    monkeypatch.setattr(pieces_mod, "pieces_step", second_dies)
    with pytest.raises(OSError, match="killed"):
        build(_cfg(tmp_path / "out", [str(gz2)], sample_dir))
    assert [m.index for m in seen] == [0] and "00000.done.json" in os.listdir(work)
    seen.clear()
    monkeypatch.setattr(pieces_mod, "pieces_step", lambda t, c: seen.append(t.index) or real_step(t, c))
    build(_cfg(tmp_path / "out", [str(gz2)], sample_dir))
    assert seen == [1]
    assert _shard_bytes(tmp_path / "out")[1] == _shard_bytes(tmp_path / "ref")[1]


def test_bad_compressed_inputs_fail_naming_the_file_or_are_counted(tmp_path, sample_dir):
    whole = gzip.compress("".join(f"Sentence {i * 7919 % 100003} of a document.\n\n" for i in range(200000))
                          .encode(), compresslevel=1)  # ~7 MB of text: many read buffers before the cut
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "cut.txt.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "in" / "empty.txt.gz").write_bytes(gzip.compress(b""))
    files = expand_inputs([str(tmp_path / "in")])
    opts = ReadOptions()
    tasks = {os.path.basename(t.path): t for t in plan_pieces(files, opts, 4096)}
    # The cut file has no plausible trailer: its size is guessed generously. The empty one is too small to need
    # pieces (the docs stage reports it); cut it anyway to see the step report it.
    assert set(tasks) == {"cut.txt.gz"}
    tasks["empty.txt.gz"] = PieceItem(1, files[1].path, files[1].key, "text")
    ctx = PieceContext(str(tmp_path / "w"), 4096, opts)
    with pytest.raises(InputError, match=r"cut\.txt\.gz.*corrupt_file"):
        pieces_step(tasks["cut.txt.gz"], ctx)
    with pytest.raises(InputError, match=r"empty\.txt\.gz.*empty_file"):
        pieces_step(tasks["empty.txt.gz"], ctx)
    skip = PieceContext(str(tmp_path / "w2"), 4096, ReadOptions(on_error="skip"))
    cut = pieces_step(tasks["cut.txt.gz"], skip)
    assert cut.bad_files == {cut.path: "corrupt_file"} and len(cut.pieces) > 2  # its complete pieces are kept
    assert not [n for n in os.listdir(tmp_path / "w2" / "pieces") if ".tmp-" in n]
    assert pieces_step(tasks["empty.txt.gz"], skip).bad_files == {str(tmp_path / "in" / "empty.txt.gz"): "empty_file"}


@pytest.mark.timeout(300)
def test_pieces_and_vocab_run_as_ray_tasks_with_the_plain_loops_output(ray_local, moby, tmp_path, sample_dir):
    from pipeline.ray_data import RayDataExecutor

    root, raw = moby
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "moby.txt.gz").write_bytes(gzip.compress(raw[: 400_000], compresslevel=1))
    markers = []

    def on_stage(name, done, *times):  # what the build tells of each stage: its markers
        markers.extend(done if name in ("pieces", "vocab") else [])

    def cfg(name):
        return _cfg(tmp_path / name, [str(tmp_path / "in")], sample_dir, vocab=None, vocab_size=300,
                    vocab_sample_bytes=200_000)

    build(cfg("ray"), RayDataExecutor(num_cpus=2), on_stage=on_stage)
    workers = {m.worker for m in markers}
    assert len(markers) == 2 and f":{os.getpid()}" not in "".join(workers)  # a pieces task and a vocab task
    markers.clear()
    build(cfg("plain"), on_stage=on_stage)
    assert {m.worker for m in markers} == {f"{os.uname().nodename}:{os.getpid()}"}  # the plain loop: here
    assert _shard_bytes(tmp_path / "ray")[1] == _shard_bytes(tmp_path / "plain")[1]
    assert (tmp_path / "ray" / "vocab.txt").read_bytes() == (tmp_path / "plain" / "vocab.txt").read_bytes()


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
def test_cuts_agree_with_the_reader_whatever_the_chunking(tmp_path, monkeypatch, fmt):
    """Random documents separated by blank lines of every shape (spaces, tabs, CR, runs of several, whitespace
    lines longer than the 1 KiB a cut accepts), cut with tiny buffers so that lines straddle them: the pieces give
    exactly the documents and ids of the plain file."""
    import random

    rnd = random.Random(0)
    parts = []
    for i in range(300):
        if fmt == "jsonl":
            parts.append(json.dumps({"text": f"doc {i} " + "w" * rnd.randint(0, 300)}) + rnd.choice(["\n", "\r\n"]))
            if rnd.random() < 0.1:
                parts.append(" " * rnd.randint(0, 50) + "\n")
            continue
        parts.append("".join(f"Doc {i} line {j} " + "x" * rnd.randint(0, 120) + "\n" for j in range(rnd.randint(1, 4))))
        for _ in range(rnd.randint(0, 3)):  # zero: the next "document" continues this one
            parts.append(rnd.choice(["", " ", "\t \r", " " * rnd.randint(900, 1100), "\t" * 2000]) + "\n")
    raw = "".join(parts).encode()
    ext = "jsonl" if fmt == "jsonl" else "txt"
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / f"c.{ext}").write_bytes(raw)
    (tmp_path / f"c.{ext}.gz").write_bytes(gzip.compress(raw))
    opts = ReadOptions(max_record_bytes=1024, on_error="skip")
    from corpus.readers import ReadReport, plan_units, read_unit

    want_report = ReadReport()
    want = [(d.doc_id, d.lines) for u in plan_units(expand_inputs([str(tmp_path / "plain")]), opts, 1 << 20)
            for d in read_unit(u, opts, report=want_report)]
    assert len(want) > 100
    cuts: dict[int, list] = {}
    for chunk in (13, 1000):
        monkeypatch.setattr(pieces_mod, "CHUNK", chunk)
        for unit in (50, 2000):
            ctx = PieceContext(str(tmp_path / f"w{chunk}-{unit}"), unit, opts)
            [task] = plan_pieces(expand_inputs([str(tmp_path / f"c.{ext}.gz")]), opts, unit)
            m = pieces_step(task, ctx)
            report = ReadReport()
            got = [(d.doc_id, d.lines) for u in pieces_mod.piece_units([m], ctx)
                   for d in read_unit(u, opts, report=report)]
            assert got == want, (chunk, unit)
            assert report.dropped == want_report.dropped
            assert len(m.pieces) > len(raw) // (unit + 3000)
            assert cuts.setdefault(unit, [p[1:] for p in m.pieces]) == [p[1:] for p in m.pieces]  # not the buffer's
