"""Fine-tuning's data format is told by the file's name or the flag, never guessed (issue 44, item 3): a `.txt`
evaluation file is not parsed as CoNLL; `--data-format conll` reads it as CoNLL."""
from __future__ import annotations

import pytest

from finetuning.records import read_records, record_format


def test_a_txt_file_is_refused_naming_data_format(tmp_path):
    path = tmp_path / "dev.txt"
    path.write_text("This is a review of a film.\nIt was good.\n")
    with pytest.raises(ValueError, match=r"cannot tell the format of .*dev.txt.* --data-format"):
        read_records(str(path))
    assert [record_format(f"x{s}") for s in (".conll", ".bio", ".iob", ".conll.gz")] == ["conll"] * 4


def test_an_explicit_conll_format_reads_a_txt_file(tmp_path):
    path = tmp_path / "dev.txt"
    path.write_text("John B-PER\nleft O\n\nMary B-PER\n")
    assert read_records(str(path), "conll") == [{"tokens": ["John", "left"], "tags": ["B-PER", "O"]},
                                                {"tokens": ["Mary"], "tags": ["B-PER"]}]
