"""Task data: readers for every format, column/label checks, label maps, featurisation, QA windows back to text."""
from __future__ import annotations

import csv
import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bert_core.losses import IGNORE_INDEX
from finetuning.evaluation import score
from finetuning.examples import LabelMap, QAExample, TaggingExample, TaskColumns
from finetuning.features import TaskTokenizer, collate_features, tagging_features
from finetuning.prepare import FeatureConfig, prepare_task
from finetuning.qa import best_answers, max_context_flags, qa_features, window_starts
from finetuning.records import read_records, split_train_eval, subsample


@pytest.fixture(scope="module")
def tok(sample_dir) -> TaskTokenizer:
    return TaskTokenizer(sample_dir / "reference" / "bert-base-uncased-vocab.txt")


RECS = [{"text": "good film", "label": 1}, {"text": "bad film", "label": 0}, {"text": "fine", "label": 1}]


def test_readers_agree_across_formats(tmp_path):
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in RECS).encode()))
    with open(tmp_path / "a.tsv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["text", "label"], delimiter="\t")
        w.writeheader()
        w.writerows(RECS)
    pq.write_table(pa.Table.from_pylist(RECS), tmp_path / "a.parquet")
    (tmp_path / "a.json").write_text(json.dumps(RECS))
    expected = [(r["text"], str(r["label"])) for r in RECS]
    for name in ("a.jsonl.gz", "a.tsv", "a.parquet", "a.json"):
        got = [(r["text"], str(r["label"])) for r in read_records(f"file://{tmp_path / name}")]
        assert got == expected, name
    with pytest.raises(ValueError, match="cannot tell the format"):
        read_records(str(tmp_path / "a.xyz"))
    with pytest.raises(ValueError, match="not found"):
        read_records(str(tmp_path / "missing.jsonl"))


def test_conll_and_squad_readers(tmp_path):
    (tmp_path / "t.conll").write_text("-DOCSTART- -X- O\n\nEU B-ORG\nrejects O\n\n"
                                      "Peter NNP B-PER\nBlackburn NNP I-PER\n")
    assert read_records(str(tmp_path / "t.conll")) == [
        {"tokens": ["EU", "rejects"], "tags": ["B-ORG", "O"]},
        {"tokens": ["Peter", "Blackburn"], "tags": ["B-PER", "I-PER"]}]
    squad = {"data": [{"paragraphs": [{"context": "Paris is in France.", "qas": [
        {"id": "q1", "question": "Where?", "answers": [{"text": "France", "answer_start": 12},
                                                        {"text": "in France", "answer_start": 9}]}]}]}]}
    (tmp_path / "s.json").write_text(json.dumps(squad))
    (rec,) = read_records(str(tmp_path / "s.json"))
    assert rec["id"] == "q1" and len(rec["answers"]) == 2


def test_seeded_split_and_subsample_are_stable():
    recs = [{"i": i} for i in range(100)]
    tr, ev = split_train_eval(recs, 0.1, seed=0)
    assert len(ev) == 10 and len(tr) == 90 and {r["i"] for r in tr}.isdisjoint(r["i"] for r in ev)
    assert split_train_eval(recs, 0.1, seed=0) == (tr, ev) and split_train_eval(recs, 0.1, seed=1)[1] != ev
    assert subsample(recs, 5, 0) == subsample(recs, 5, 0) and len(subsample(recs, 5, 0)) == 5


def test_label_map_order_and_saving_roundtrip():
    lm = LabelMap.build([2, 10, 1, "10"])
    assert lm.names == ("1", "2", "10")  # numeric labels numerically; 10 and "10" are one class
    assert LabelMap.from_id2label({"0": "1", "1": "2", "2": "10"}) == lm  # config.json's string keys
    tags = LabelMap.build(["B-PER", "O", "I-PER"], outside_first=True)
    assert tags.names[0] == "O" and tags.encode(["O", "B-PER"]) == [0, 1]


def test_missing_column_and_unseen_label_errors(tok):
    cfg = FeatureConfig(max_seq_length=32)
    with pytest.raises(ValueError,
                       match=r"column 'sentence' is missing in train.jsonl; columns present: \['label', 'text'\]"):
        prepare_task("classification", RECS, RECS, TaskColumns(text_column="sentence"), tok, cfg, "train.jsonl", "ev")
    with pytest.raises(ValueError, match=r"'neutral' \(1x\) in dev.csv never occur in the training data train.jsonl"):
        prepare_task("classification", RECS, [{"text": "meh", "label": "neutral"}], TaskColumns(), tok, cfg,
                     "train.jsonl", "dev.csv")
    # (An evaluation's tag unseen in training is scored as an error, not refused: test_unseen_tags.py.)
    with pytest.raises(ValueError, match="column 'sentence2' is missing"):
        prepare_task("pair_classification", [{"sentence1": "a", "label": 0}], [], TaskColumns(), tok, cfg, "tr", "ev")


def test_null_text_is_named_as_null_not_as_a_missing_column(tok):
    """`"text": null` in some rows: the column is there (the old message said it was missing, listing it)."""
    rows = RECS * 25 + [{"text": None, "label": "pos"}] * 2
    with pytest.raises(ValueError, match=r"^column 'text' is null in 2 of the \d+ rows of train.jsonl \(the first: "
                                         r"row \d+\): remove those rows or fill them in$"):
        prepare_task("classification", rows, RECS, TaskColumns(), tok, FeatureConfig(max_seq_length=32),
                     "train.jsonl", "ev")


def test_pair_features_segments_and_collate(tok):
    recs = [{"sentence1": "the cat sat", "sentence2": "on the mat", "label": 1},
            {"sentence1": "hi", "sentence2": "there", "label": 0}]
    p = prepare_task("pair_classification", recs, recs, TaskColumns(), tok, FeatureConfig(max_seq_length=16), "t", "e")
    f = p.train.features
    assert f.input_ids[0].tolist() == [101, 1996, 4937, 2938, 102, 2006, 1996, 13523, 102]
    assert f.token_type_ids[0].tolist() == [0] * 5 + [1] * 4
    b = collate_features(f, [0, 1], tok.pad_id)
    assert b["input_ids"].shape == (2, 16) and b["attention_mask"][1].sum() == 5  # padded to a multiple of 8
    assert b["labels"].tolist() == [1, 0]


def test_tagging_labels_first_piece_only_and_scores_words(tok):
    ex = [TaggingExample(["Sundance", "rocks", "@jim"], ["B-LOC", "O", "B-PER"])]
    lm = LabelMap.build(["O", "B-LOC", "B-PER"], outside_first=True)
    feats, words = tagging_features(ex, tok, 32, lm)
    pieces = tok.tok.encode(ex[0].tokens, is_pretokenized=True, add_special_tokens=False)
    labels = feats.labels[0]
    assert len(labels) == len(pieces.ids) + 2 and labels[0] == labels[-1] == IGNORE_INDEX
    first = [i + 1 for i, w in enumerate(pieces.word_ids) if i == 0 or pieces.word_ids[i - 1] != w]
    assert np.flatnonzero(labels != IGNORE_INDEX).tolist() == first
    assert labels[first].tolist() == lm.encode(["B-LOC", "O", "B-PER"])
    # Perfect logits at first pieces, garbage on continuation pieces: still a perfect entity score.
    logits = np.zeros((len(labels), len(lm)))
    logits[np.arange(len(labels)), np.where(labels == IGNORE_INDEX, 1, labels)] = 5.0
    from finetuning.prepare import TaskSplit

    split = TaskSplit("e", ex, feats, word_positions=words)
    assert score("token_classification", split, lm, [logits])["f1"] == 1.0


def test_window_layout_matches_the_reference():
    assert window_starts(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert window_starts(3, 4, 2) == [(0, 3)]
    flags = max_context_flags([(0, 4), (3, 4), (6, 4)])
    # Token 3 has context min(3,0)=0 in window 0 and min(0,3)=0 in window 1: a tie, and the reference keeps the
    # first window (strict >); likewise token 6 stays with window 1.
    assert [f.tolist() for f in flags] == [[True, True, True, True], [False, True, True, True],
                                           [False, True, True, True]]
    assert sum(int(f.sum()) for f in flags) == 10  # every token has exactly one max-context window


def test_qa_windows_map_back_to_text_exactly_on_a_long_passage(tok):
    """A passage many windows long, answers anywhere (also straddling window edges, with accents and
    punctuation): oracle logits in every window that contains the answer recover the exact original slice."""
    words = [f"Wörd{i}," if i % 7 == 0 else f"token{i}" for i in range(400)]
    context = " ".join(words)
    examples = []
    for k, (i, j) in enumerate([(3, 5), (60, 61), (140, 147), (250, 250), (397, 399)]):
        start = len(" ".join(words[:i])) + (1 if i else 0)
        text = " ".join(words[i : j + 1])
        assert context[start : start + len(text)] == text
        examples.append(QAExample(str(k), context, f"which token is number {i}?", [(start, text)]))
    feats, windows = qa_features(examples, tok, max_seq_length=64, doc_stride=20, max_query_length=16, training=True)
    assert len(feats) > 5 * 20  # long passage: many windows per question
    assert max(len(r) for r in feats.input_ids) == 64
    starts, ends = [], []
    for w in range(len(feats)):
        s = np.zeros(len(feats.input_ids[w]))
        e = np.zeros(len(feats.input_ids[w]))
        if feats.start_positions[w] > 0:
            s[feats.start_positions[w]] = e[feats.end_positions[w]] = 10.0
        starts.append(s)
        ends.append(e)
    preds = best_answers(examples, windows, starts, ends, max_answer_length=30)
    assert preds == [ex.answers[0][1] for ex in examples]
    # A span longer than max_answer_length cannot be chosen.
    assert best_answers(examples[2:3], windows_for(examples[2:3], tok), *oracle(examples[2:3], tok),
                        max_answer_length=3)[0] != examples[2].answers[0][1]


def windows_for(examples, tok):
    return qa_features(examples, tok, 64, 20, 16, training=True)[1]


def oracle(examples, tok):
    feats, _ = qa_features(examples, tok, 64, 20, 16, training=True)
    s = [np.eye(len(r))[feats.start_positions[w]] * 10 for w, r in enumerate(feats.input_ids)]
    e = [np.eye(len(r))[feats.end_positions[w]] * 10 for w, r in enumerate(feats.input_ids)]
    return s, e


def test_qa_drops_misaligned_training_answers_but_keeps_eval(tok):
    ex = [QAExample("0", "Paris is nice", "where?", [(0, "Paris")]), QAExample("1", "Rome", "where?", [(1, "Rome")])]
    feats, _ = qa_features(ex, tok, 32, 8, 8, training=True)
    assert len(feats) == 1
    feats, windows = qa_features(ex, tok, 32, 8, 8, training=False)
    assert len(feats) == 2 and windows.example_index.tolist() == [0, 1]


def test_reads_task_files_from_object_storage(s3_bucket, monkeypatch):
    """Any fsspec URL: a gzipped JSONL on an S3-protocol server (endpoint from AWS_ENDPOINT_URL, as users set it)."""
    import boto3

    endpoint, bucket = s3_bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    body = gzip.compress("".join(json.dumps(r) + "\n" for r in RECS).encode())
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").put_object(
        Bucket=bucket, Key="tasks/rt.jsonl.gz", Body=body)
    assert read_records(f"s3://{bucket}/tasks/rt.jsonl.gz") == RECS
