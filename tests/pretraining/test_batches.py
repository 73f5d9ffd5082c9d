"""`python -m pretraining.batches` on a real tiny dataset (no Ray, no training): check train-batches-any-world (the
digests of steps 1-60 are the same for 1, 2 and 4 workers, and differ with another seed), `--ids` and `--text`, and
a user's mistake in one line."""
from __future__ import annotations

import re

import pytest

from pretraining import batches


def run(args: list[str], capsys) -> tuple[int, str, str]:
    rc = batches.main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def digests(text: str) -> list[tuple[int, str]]:
    return [(int(a), b) for a, b in re.findall(r"^step (\d+): ([0-9a-f]{16})$", text, re.M)]


@pytest.mark.parametrize("flags", [[], ["--dynamic-masking"], ["--packing"], ["--no-length-bucketing"]])
def test_digests_of_steps_1_to_60_are_the_same_on_1_2_and_4_workers(tiny_pretrain_data, capsys, flags):
    base = ["--data", tiny_pretrain_data["train"], "--batch-size", "32", "--steps", "1:60", *flags]
    outputs = {}
    for workers in ("1", "2", "4"):
        rc, out, _ = run(base + ["--seed", "7", "--num-workers", workers], capsys)
        assert rc == 0
        outputs[workers] = digests(out)
    assert [s for s, _ in outputs["1"]] == list(range(1, 61))
    assert len({d for _, d in outputs["1"]}) == 60  # 60 different batches (the epoch is 852 rows: it wraps)
    assert outputs["1"] == outputs["2"] == outputs["4"]
    _, other, _ = run(base + ["--seed", "8", "--num-workers", "2"], capsys)
    assert all(a != b for (_, a), (_, b) in zip(digests(other), outputs["1"], strict=False))


def test_ids_and_text_list_the_examples_of_a_step(tiny_pretrain_data, capsys):
    base = ["--data", tiny_pretrain_data["train"], "--batch-size", "8", "--seed", "7", "--steps", "5"]
    _, plain, _ = run(base, capsys)
    rc, ids, _ = run(base + ["--ids"], capsys)
    assert rc == 0 and ids.splitlines()[0] == plain.strip()
    examples = ids.splitlines()[1:]
    assert len(examples) == 8 and all(re.fullmatch(r"  [0-3]:\d+", line) for line in examples)
    _, text, _ = run(base + ["--text", "--num-workers", "2"], capsys)
    lines = text.splitlines()[1:]
    assert [line.split("  ")[1] for line in lines] == [line.strip() for line in examples]
    assert all(line.split("  ", 2)[2].startswith("[CLS] ") and "[SEP]" in line for line in lines)
    assert "[MASK]" not in text  # the original tokens, masks undone


def test_a_folder_without_checkpoints_is_one_line(tmp_path, capsys):
    rc, out, err = run(["--run", str(tmp_path)], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "no checkpoint-* folder" in err


def test_text_keeps_a_segment_that_starts_inside_a_word_apart_from_the_special_token():
    import numpy as np

    from pretraining.rows import Rows

    vocab = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "##oop", "sl", "##ing", "go"]
    ids = np.array([1, 4, 5, 3, 2, 7, 2])  # [CLS] ##oop sl [MASK] [SEP] go [SEP], the mask hiding ##ing
    rows = Rows(ids, np.array([0, 7]), np.array([5]), np.array([3]), np.array([0, 1]), np.array([6]), np.array([0]))
    assert batches.decode(rows, 0, vocab) == "[CLS] ##oop sling [SEP] go [SEP]"
