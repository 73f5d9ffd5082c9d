"""jobs/pretrain.py refuses bad inputs at start, before Ray or any worker: fast tests, no Ray."""
from __future__ import annotations

import logging

import pytest

from jobs import pretrain
from pretraining.loader import batch_geometry


def run(args: list[str], caplog) -> tuple[int, str]:
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="jobs.pretrain"):
        rc = pretrain.main(args)
    return rc, caplog.text


@pytest.fixture
def base(tiny_pretrain_data, tmp_path) -> list[str]:
    return ["--data", tiny_pretrain_data["train"], "--preset", "bert_tiny", "--max-steps", "2",
            "--storage", str(tmp_path / "runs"), "--mlflow-tracking-uri", f"sqlite:///{tmp_path}/m.db"]


def test_unreachable_tracking_server_fails_at_start(base, caplog):
    rc, text = run(base + ["--batch-size", "8", "--mlflow-tracking-uri", "http://127.0.0.1:9"], caplog)
    assert rc == 2 and "unreachable" in text


def test_batch_geometry_is_checked(base, caplog):
    rc, text = run(base + ["--batch-size", "9", "--num-workers", "2"], caplog)
    assert rc == 2 and "does not split over 2 workers" in text
    rc, text = run(base + ["--batch-size", "8", "--num-workers", "2", "--micro-batch-size", "3"], caplog)
    assert rc == 2 and "must divide the 4 sequences" in text
    assert batch_geometry(64, 2, 8) == (8, 4)
    assert batch_geometry(8, 2, 16) == (4, 1)  # a micro-batch larger than a worker's share is its share
    assert batch_geometry(12, 1, 6, most_workers=3) == (6, 2)  # elastic 1:3: planned for one worker's share
    assert batch_geometry(10, 3, None, most_workers=4) == (4, 1)  # shares of 4, 3, 3: the largest in one go


def test_elastic_workers_are_checked(base, caplog):
    rc, text = run(base + ["--batch-size", "2", "--num-workers", "1:3"], caplog)
    assert rc == 2 and "cannot be shared by up to 3 workers" in text
    with pytest.raises(SystemExit):
        pretrain.parse_args(base + ["--num-workers", "3:1"])
    with pytest.raises(SystemExit):
        pretrain.parse_args(base + ["--num-workers", "0:2"])
    with pytest.raises(SystemExit):
        pretrain.parse_args(base + ["--num-workers", "1:2", "--no-ray"])
    assert pretrain.parse_args(base + ["--num-workers", "2:4"]).num_workers == (2, 4)


def test_dataset_and_model_must_agree(base, tiny_pretrain_data, tmp_path, caplog):
    from bert_core import BertForPreTraining, bert_tiny

    rc, text = run(base + ["--data", str(tmp_path / "nowhere")], caplog)
    assert rc == 2 and "not found" in text
    other = tmp_path / "other-vocab"
    BertForPreTraining(bert_tiny(vocab_size=700)).save_pretrained(other)
    rc, text = run(base + ["--init", str(other)], caplog)
    assert rc == 2 and "vocab_size 700" in text
    short = tmp_path / "short-positions"
    BertForPreTraining(bert_tiny(vocab_size=600, max_position_embeddings=32)).save_pretrained(short)
    rc, text = run(base + ["--init", str(short)], caplog)
    assert rc == 2 and "only 32 positions" in text
    rc, text = run(base + ["--preset", "bert_huge"], caplog)
    assert rc == 2 and "unknown --preset" in text


def test_unknown_flags_fail():
    with pytest.raises(SystemExit):
        pretrain.parse_args(["--data", "x", "--max-steps", "1", "--no-such-flag"])


def test_export_to_a_missing_bucket_fails_at_start(base, s3_server, caplog):
    rc, text = run(base + ["--batch-size", "8", "--export", "s3://no-such-bucket/exports/x",
                           "--endpoint-url", s3_server], caplog)
    assert rc == 2 and "no-such-bucket" in text
