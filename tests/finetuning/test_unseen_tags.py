"""A tagging evaluation holding a tag training never saw (one `UH` in a dev split) is scored, not refused: that
token counts as an error, and one warning names the tag and how many tokens carry it."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from finetuning.evaluation import score
from finetuning.examples import TaskColumns
from finetuning.features import TaskTokenizer
from finetuning.prepare import FeatureConfig, prepare_task

TRAIN = [{"tokens": ["john", "lives", "in", "paris"], "tags": ["B-PER", "O", "O", "B-LOC"]},
         {"tokens": ["mary", "went", "home"], "tags": ["B-PER", "O", "O"]}]
DEV = [{"tokens": ["well", "john", "left"], "tags": ["UH", "B-PER", "O"]},
       {"tokens": ["anna", "saw", "rome"], "tags": ["B-PER", "O", "B-LOC"]}]


@pytest.fixture(scope="module")
def tok(sample_dir) -> TaskTokenizer:
    return TaskTokenizer(sample_dir / "reference" / "bert-base-uncased-vocab.txt")


def perfect_outputs(prepared) -> list[np.ndarray]:
    """Logits that predict every labelled position's gold tag (what the best possible model outputs)."""
    out = []
    for labels in prepared.eval.features.labels:
        logits = np.zeros((len(labels), len(prepared.label_map)), dtype=np.float32)
        for pos, label in enumerate(labels):
            if label >= 0:
                logits[pos, label] = 10.0
        out.append(logits)
    return out


def test_an_unseen_tag_is_scored_as_an_error_with_one_warning(tok, caplog):
    with caplog.at_level(logging.WARNING, logger="finetuning.prepare"):
        prepared = prepare_task("token_classification", TRAIN, DEV, TaskColumns(), tok,
                                FeatureConfig(max_seq_length=32), "train.conll", "dev.conll")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "'UH' (1 token) in dev.conll never occur in the training data train.conll" in warnings[0]
    assert "1 token(s) are scored as errors" in warnings[0]
    assert "UH" not in prepared.label_map.names  # the head has no output for it
    metrics = score("token_classification", prepared.eval, prepared.label_map, perfect_outputs(prepared))
    # Every known tag right, the unseen one wrong: 5 of 6 words.
    assert metrics["token_accuracy"] == pytest.approx(5 / 6)
    # seqeval reads UH as an entity of its own: missed, so recall is 3 of 4 entities, precision 3 of 3.
    assert (metrics["precision"], metrics["recall"]) == (pytest.approx(1.0), pytest.approx(0.75))
