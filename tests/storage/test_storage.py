"""storage.fs: input expansion, early errors naming the path, atomic commits."""
from __future__ import annotations

import os

import pytest

from storage.fs import (
    exists,
    expand_inputs,
    join,
    open_atomic,
    read_json,
    remove_stale_temps,
    write_bytes_atomic,
    write_json_atomic,
)


def test_expand_files_dirs_globs_sorted_with_size_and_mtime(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.txt").write_text("bb")
    (tmp_path / "d" / "sub" / "a.jsonl").write_text("a")
    (tmp_path / "d" / ".hidden").write_text("x")
    (tmp_path / "d" / "_SUCCESS").write_text("")
    (tmp_path / "c.txt").write_text("ccc")
    got = expand_inputs([str(tmp_path / "d"), str(tmp_path / "*.txt"), str(tmp_path / "c.txt")])
    assert [f.path for f in got] == sorted(f.path for f in got)
    assert [os.path.basename(f.path) for f in got] == ["c.txt", "b.txt", "a.jsonl"]
    assert {f.key: f.size for f in got} == {"b.txt": 2, "sub/a.jsonl": 1, "c.txt": 3}
    assert all(f.mtime for f in got)


def test_same_relative_name_from_two_inputs_gets_distinct_keys(tmp_path):
    for d in ("x", "y"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "part.txt").write_text(d)
    keys = [f.key for f in expand_inputs([str(tmp_path / "x"), str(tmp_path / "y")])]
    assert len(set(keys)) == 2


def test_keys_drop_the_compression_suffix_unless_two_files_would_clash(tmp_path):
    for name in ("a.txt", "a.txt.gz", "b.jsonl.zst", "c.txt.bz2"):
        (tmp_path / "d" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "d" / name).write_bytes(b"x")
    for sub in ("x", "y"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "part.txt.gz").write_bytes(b"y")
    keys = {os.path.relpath(f.path, tmp_path): f.key for f in
            expand_inputs([str(tmp_path / "d"), str(tmp_path / "x"), str(tmp_path / "y")])}
    assert keys == {"d/a.txt": "a.txt", "d/a.txt.gz": "a.txt.gz", "d/b.jsonl.zst": "b.jsonl", "d/c.txt.bz2": "c.txt",
                    "x/part.txt.gz": "part.txt", "y/part.txt.gz": "2:part.txt"}


@pytest.mark.parametrize("name", ["missing.txt", "nothing-*.txt"])
def test_missing_input_fails_naming_it(tmp_path, name):
    with pytest.raises(ValueError, match=name.replace("*", r"\*")):
        expand_inputs([str(tmp_path / name)])


def test_atomic_write_leaves_no_temp_and_json_roundtrips(tmp_path):
    url = str(tmp_path / "o" / "m.json")
    write_json_atomic(url, {"a": [1, 2]})
    assert read_json(url) == {"a": [1, 2]} and exists(url)
    write_bytes_atomic(url, b"{}")
    assert os.listdir(tmp_path / "o") == ["m.json"]


def test_open_atomic_commits_nothing_on_error(tmp_path):
    url = join(str(tmp_path), "shard.parquet")
    with pytest.raises(RuntimeError):
        with open_atomic(url) as f:
            f.write(b"half")
            raise RuntimeError("killed")
    assert os.listdir(tmp_path) == []
    (tmp_path / "x.parquet.tmp-abc").write_bytes(b"stale")
    remove_stale_temps(str(tmp_path))
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(__import__("importlib").util.find_spec("gcsfs") is not None,
                    reason="gcsfs is installed here; the message is for installs without it (it is not a dependency)")
def test_gs_input_without_gcsfs_says_what_to_install():
    with pytest.raises(ValueError, match=r"gs://bucket/corpus.txt.*install gcsfs"):
        expand_inputs(["gs://bucket/corpus.txt"])


def test_a_folder_contributes_corpus_files_only_and_lists_what_it_skipped(tmp_path, caplog):
    d = tmp_path / "corpus"
    (d / "AA").mkdir(parents=True)
    for name in ("a.txt", "b.jsonl.gz", "c.parquet", "AA/wiki_00", "README.md", "LICENSE", "notes.pdf",
                 "dump.xml.bz2", "vim-license.txt", "climate.txt"):
        (d / name).write_bytes(b"x")
    skipped: list[str] = []
    with caplog.at_level("WARNING", logger="storage.fs"):
        got = expand_inputs([str(d)], skipped=skipped)
    assert sorted(f.key for f in got) == ["AA/wiki_00", "a.txt", "b.jsonl", "c.parquet", "climate.txt"]
    assert [os.path.basename(p) for p in skipped] == ["LICENSE", "README.md", "dump.xml.bz2", "notes.pdf",
                                                      "vim-license.txt"]
    [warning] = [r.getMessage() for r in caplog.records]
    assert "skipped 5 file(s)" in warning and "README.md" in warning and "name a file directly" in warning
    # Named directly, or by a glob that spells out the extension, a file is read whatever its name.
    assert [f.key for f in expand_inputs([str(d / "README.md")])] == ["README.md"]
    assert [f.key for f in expand_inputs([str(d / "*.md")])] == ["README.md"]
    # A bare glob filters like a folder.
    assert sorted(f.key for f in expand_inputs([str(d / "*")])) == ["a.txt", "b.jsonl", "c.parquet", "climate.txt"]


def test_a_folder_of_no_corpus_files_fails_listing_them(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "README.md").write_text("# hello")
    with pytest.raises(ValueError, match=r"docs.*no corpus files.*README\.md.*name a file directly"):
        expand_inputs([str(tmp_path / "docs")])
