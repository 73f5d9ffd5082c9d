"""instance_stats on hand-built columns, as dict of lists and as a pyarrow table."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from corpus.stats import instance_stats

MASK = 103


def columns() -> dict[str, list]:
    # Row 0: [CLS] 7 8 [SEP] 9 [SEP] with position 1 -> [MASK] (orig 7), position 4 kept (orig 9).
    # Row 1: 8 tokens, full length (max_seq_length=8), position 2 -> random 55 (orig 20).
    return {
        "input_ids": [
            np.array([101, MASK, 8, 102, 9, 102], np.uint16),
            np.array([101, 10, 55, 30, 102, 40, 50, 102], np.uint16),
        ],
        "a_length": [2, 3],
        "masked_lm_positions": [np.array([1, 4], np.uint16), np.array([2], np.uint16)],
        "masked_lm_ids": [np.array([7, 9], np.uint16), np.array([20], np.uint16)],
        "next_sentence_label": [1, 0],
        "key": [1, 2],
    }


def expected() -> dict:
    return {
        "instances": 2,
        "random_next_fraction": 0.5,
        "seq_len_mean": 7.0,
        "seq_len_p10": 6.2,
        "seq_len_median": 7.0,
        "full_length_fraction": 0.5,
        "a_len_mean": 2.5,
        "masked_per_seq_mean": 1.5,
        "masked_per_seq_max": 2,
        "masked_token_fraction": 3 / 14,
        "mask_kind_fraction": {"mask": 1 / 3, "same": 1 / 3, "random": 1 / 3},
        "tokens_total": 14,
    }


def close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            close(a[k], b[k])
        else:
            assert a[k] == pytest.approx(b[k]), k


def test_dict_columns() -> None:
    close(instance_stats(columns(), mask_id=MASK, max_seq_length=8), expected())


def test_arrow_table_including_sliced() -> None:
    cols = columns()
    table = pa.table(
        {
            "input_ids": pa.array([a.tolist() for a in cols["input_ids"]], pa.list_(pa.uint16())),
            "a_length": pa.array(cols["a_length"], pa.int16()),
            "masked_lm_positions": pa.array([a.tolist() for a in cols["masked_lm_positions"]], pa.list_(pa.uint16())),
            "masked_lm_ids": pa.array([a.tolist() for a in cols["masked_lm_ids"]], pa.list_(pa.uint16())),
            "next_sentence_label": pa.array(cols["next_sentence_label"], pa.int8()),
        }
    )
    close(instance_stats(table, mask_id=MASK, max_seq_length=8), expected())
    # Chunked + sliced columns (as read back from several Parquet files).
    both = pa.concat_tables([table, table]).slice(2, 2)
    close(instance_stats(both, mask_id=MASK, max_seq_length=8), expected())
    one = instance_stats(pa.concat_tables([table, table]).slice(1, 2), mask_id=MASK, max_seq_length=8)
    assert one["instances"] == 2 and one["seq_len_mean"] == 7.0 and one["a_len_mean"] == 2.5


def test_empty_fails_clearly() -> None:
    with pytest.raises(ValueError, match="no instances"):
        instance_stats({k: [] for k in columns()}, mask_id=MASK)
