"""corpus.readers: every format and compression gives the same documents whatever the unit size; bad input
fails naming the file (and line) or is counted by reason."""
from __future__ import annotations

import bz2
import gzip
import json
import lzma
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from corpus.readers import InputError, ReadOptions, ReadReport, plan_units, read_unit
from pipeline.inputs.pieces import PieceContext, piece_units, pieces_step, plan_pieces
from storage.fs import expand_inputs

COMPRESSORS = {"": lambda b: b, ".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
               ".zst": lambda b: zstandard.ZstdCompressor().compress(b)}


def _text_corpus(n_docs: int = 60, seed: int = 0) -> tuple[bytes, list[list[str]]]:
    """Documents of 1-5 lines, separated by 1-3 blank lines (some whitespace-only), as bytes + expected lines."""
    rnd = random.Random(seed)
    out, docs = [], []
    for i in range(n_docs):
        lines = [f"Doc {i} line {j}. "
                 + " ".join(rnd.choice(["whale", "sea", "Ahab."]) for _ in range(rnd.randint(1, 40)))
                 for j in range(rnd.randint(1, 5))]
        docs.append(lines)
        out.append("\n".join(lines) + "\n" + "\n" * rnd.randint(1, 3) + (" \t\n" if rnd.random() < 0.3 else ""))
    return "".join(out).encode(), docs


DEFAULT_OPTS = ReadOptions()


def _read_all(paths, opts=DEFAULT_OPTS, unit_bytes=1 << 30, report=None, work=None):
    """Every document of the inputs, unit by unit; with ``work``, big compressed files go through the pieces step
    (as the build does) with their pieces under that folder."""
    files = expand_inputs([str(p) for p in paths])
    tasks = plan_pieces(files, opts, unit_bytes) if work is not None else []
    units = plan_units(files, opts, unit_bytes, report=report, exclude={t.path for t in tasks})
    if tasks:
        ctx = PieceContext(str(work), unit_bytes, opts)
        units = sorted(units + piece_units([pieces_step(t, ctx) for t in tasks], ctx), key=lambda u: u.uid)
    docs = []
    for u in units:
        docs.extend(read_unit(u, opts, report=report))
    return docs


@pytest.mark.parametrize("ext", list(COMPRESSORS))
def test_text_documents_do_not_depend_on_unit_size_or_compression(tmp_path, ext):
    raw, expected = _text_corpus()
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "c.txt").write_bytes(raw)
    p = tmp_path / f"c.txt{ext}"
    p.write_bytes(COMPRESSORS[ext](raw))
    whole = _read_all([tmp_path / "plain" / "c.txt"])
    assert [d.lines for d in whole] == expected
    assert whole[1].doc_id.startswith("c.txt:")  # ids: the key without compression suffix, decompressed offsets
    for unit_bytes in (1024, 1500, 7777):
        got = _read_all([p], unit_bytes=unit_bytes, work=tmp_path / f"w{unit_bytes}")
        assert [(d.doc_id, d.lines) for d in got] == [(d.doc_id, d.lines) for d in whole]
    assert len({d.doc_id for d in whole}) == len(whole)


def test_long_whitespace_lines_are_never_blank_whatever_the_units(tmp_path):
    """A whitespace-only line longer than max_record_bytes is an over-long line, not a document break, wherever the
    reads' chunks fall (units starting elsewhere move them): the documents do not depend on the unit size."""
    rnd = random.Random(1)
    parts = []
    for i in range(400):
        parts.append("".join(f"Doc {i} line {j} " + "x" * rnd.randint(0, 120) + "\n" for j in range(rnd.randint(1, 3))))
        parts.append(rnd.choice(["", " ", "\t" * 2000, " " * 3000]) + "\n")
    (tmp_path / "c.txt").write_bytes("".join(parts).encode())
    opts = ReadOptions(max_record_bytes=1024, on_error="skip")
    runs = []
    for unit_bytes in (1 << 30, 4096, 77777):
        report = ReadReport()
        runs.append(([(d.doc_id, d.lines) for d in _read_all([tmp_path / "c.txt"], opts, unit_bytes, report)],
                     report.dropped))
    assert runs[0][1]["record_too_long"] > 0 and len(runs[0][0]) > 50
    assert all(r == runs[0] for r in runs)


def test_presplit_and_jsonl_and_parquet(tmp_path):
    (tmp_path / "a.txt").write_text("One.\nTwo.\n\nThree.\n")
    docs = _read_all([tmp_path / "a.txt"], ReadOptions(presplit=True))
    assert [d.lines for d in docs] == [["One.", "Two."], ["Three."]]
    rows = [{"id": i, "body": f"text {i}"} for i in range(50)]
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    docs = _read_all([tmp_path / "b.jsonl.gz"], ReadOptions(text_field="body"), unit_bytes=1024, work=tmp_path / "w")
    assert [d.lines for d in docs] == [[f"text {i}"] for i in range(50)]
    pq.write_table(pa.table({"body": [f"row {i}" for i in range(25)]}), tmp_path / "c.parquet", row_group_size=10)
    docs = _read_all([tmp_path / "c.parquet"], ReadOptions(text_field="body"))
    assert [d.lines for d in docs] == [[f"row {i}"] for i in range(25)]
    assert docs[12].doc_id == "c.parquet:12"


def test_jsonl_units_split_mid_line_keep_every_record_once(tmp_path):
    lines = [json.dumps({"text": "x" * (i % 37)}) + "\n" for i in range(1, 400)]
    (tmp_path / "d.jsonl").write_text("".join(lines))
    ref = _read_all([tmp_path / "d.jsonl"])
    for ub in (1024, 1031, 4096):
        assert [(d.doc_id, d.lines) for d in _read_all([tmp_path / "d.jsonl"], unit_bytes=ub)] == \
            [(d.doc_id, d.lines) for d in ref]


BAD = {
    "undecodable": (b"good line.\n\nbad \xff\xfe bytes.\n\nfine.\n", "undecodable", "line 3"),
    "binary": (b"good.\n\n\x00\x01\x02\x03PNG\x00junk\n\nfine.\n", "binary", "line 3"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_text_records_fail_with_file_and_line_or_are_counted(tmp_path, case):
    data, reason, where = BAD[case]
    p = tmp_path / f"{case}.txt"
    p.write_bytes(data)
    with pytest.raises(InputError, match=rf"{case}\.txt.*{where}.*{reason}"):
        _read_all([p])
    report = ReadReport()
    docs = _read_all([p], ReadOptions(on_error="skip"), report=report)
    assert [d.lines for d in docs] == [["good line."] if case == "undecodable" else ["good."], ["fine."]]
    assert report.dropped == {reason: 1}


def test_bad_json_rows(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_text('{"text": "a"}\n{"text": \n[1, 2]\n{"other": "x"}\n{"text": "b"}\n')
    with pytest.raises(InputError, match=r"rows\.jsonl, line 2 .*bad_json"):
        _read_all([p])
    report = ReadReport()
    assert [d.lines for d in _read_all([p], ReadOptions(on_error="skip"), report=report)] == [["a"], ["b"]]
    assert report.dropped == {"bad_json": 1, "missing_text_field": 2}


def test_jsonl_without_the_text_field_lists_the_fields_it_has_and_names_the_flag(tmp_path, sample_dir, caplog):
    """Moby Dick's chapters keyed "body" instead of "text": the error names the record's fields and --text-field;
    skipped, the records are dropped with one warning per unit that says the same."""
    with gzip.open(sample_dir / "corpus" / "mobydick.jsonl.gz", "rt") as f:
        docs = [json.loads(line) for line in f][:6]
    p = tmp_path / "moby.jsonl"
    p.write_text("".join(json.dumps({"id": d["id"], "body": d["text"]}) + "\n" for d in docs))
    with pytest.raises(InputError, match=r"moby\.jsonl, line 1 .*no string 'text' field \(the record has fields"
                                         r" 'id', 'body'\).*--text-field NAME"):
        _read_all([p])
    report = ReadReport()
    with caplog.at_level("WARNING", logger="corpus.readers"):
        assert _read_all([p], ReadOptions(on_error="skip"), report=report) == []
    assert report.dropped == {"missing_text_field": 6}
    assert any("dropped 6 record(s) without a string 'text' field (the first has fields 'id', 'body')" in r.getMessage()
               and "--text-field" in r.getMessage() for r in caplog.records)
    assert [d.lines[0][:20] for d in _read_all([p], ReadOptions(text_field="body"))] == \
        [d["text"][:20] for d in docs]


def test_huge_line_is_never_held_and_is_reported(tmp_path):
    p = tmp_path / "huge.txt"
    with open(p, "wb") as f:
        f.write(b"before.\n\n")
        f.write(b"x" * (100 << 20))  # one 100 MB line
        f.write(b"\n\nafter.\n")
    with pytest.raises(InputError, match=r"huge\.txt.*line 3.*record_too_long"):
        _read_all([p])
    report = ReadReport()
    assert [d.lines for d in _read_all([p], ReadOptions(on_error="skip"), report=report)] == [["before."], ["after."]]
    assert report.dropped == {"record_too_long": 1}


def test_empty_and_truncated_and_junk_compressed_files(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(InputError, match=r"empty\.txt.*empty"):
        _read_all([tmp_path / "empty.txt"])
    whole = gzip.compress(_text_corpus(3000)[0])
    (tmp_path / "cut.txt.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match=r"cut\.txt\.gz.*corrupt_file"):
        _read_all([tmp_path / "cut.txt.gz"])
    (tmp_path / "junk.txt.gz").write_bytes(b"this is not gzip at all" * 10)
    with pytest.raises(InputError, match=r"junk\.txt\.gz"):
        _read_all([tmp_path / "junk.txt.gz"])
    report = ReadReport()
    docs = _read_all([tmp_path / "empty.txt", tmp_path / "cut.txt.gz", tmp_path / "junk.txt.gz"],
                     ReadOptions(on_error="skip"), report=report)
    assert 0 < len(docs) < 3000  # the readable part of the truncated file is kept
    assert sorted(report.bad_files.values()) == ["corrupt_file", "corrupt_file", "empty_file"]
