"""Statistics of built instances, the same ones as ``mobydick.reference_stats.json`` of the reference run.

Used by the faithfulness tests (plain loop and Parquet output) and the build manifest. Works on a ``pyarrow.Table``
(or RecordBatch) with the instance schema, or on a dict of columns as ``create_instances`` returns them.
The masked-token kind is read off the data: ``[MASK]`` if the input id is the mask id, "same" if it equals the
original id (so a random replacement that happens to draw the original counts as "same", as it would in the
reference's output), otherwise "random".
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def _flat(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of a list column: a pyarrow (Chunked)ListArray or a sequence of arrays."""
    if hasattr(column, "combine_chunks"):
        column = column.combine_chunks()
    if hasattr(column, "offsets") and hasattr(column, "values"):
        # Arrow list arrays may be sliced: rebase offsets onto the flattened values.
        offsets = column.offsets.to_numpy().astype(np.int64)
        values = column.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
        return values, offsets - offsets[0]
    seqs: Sequence = column
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate([np.asarray(s) for s in seqs]) if len(seqs) else np.zeros(0, dtype=np.int64)
    return values, offsets


def _scalars(column: Any) -> np.ndarray:
    if hasattr(column, "to_numpy"):
        return np.asarray(column.to_numpy(), dtype=np.int64)
    return np.asarray(column, dtype=np.int64)


def instance_stats(table_or_columns: Any, mask_id: int, max_seq_length: int = 128) -> dict[str, Any]:
    """instances, random_next_fraction, seq_len mean/p10/median, full_length_fraction (len == max_seq_length),
    a_len_mean, masked_per_seq mean/max, masked_token_fraction (over all tokens, specials included),
    mask_kind_fraction {mask, same, random}, tokens_total."""
    cols: Mapping[str, Any]
    if hasattr(table_or_columns, "column_names"):
        cols = {name: table_or_columns.column(name) for name in table_or_columns.column_names}
    else:
        cols = table_or_columns
    ids, id_off = _flat(cols["input_ids"])
    pos, pos_off = _flat(cols["masked_lm_positions"])
    orig, _ = _flat(cols["masked_lm_ids"])
    labels = _scalars(cols["next_sentence_label"])
    a_len = _scalars(cols["a_length"])
    n = len(id_off) - 1
    if n == 0:
        raise ValueError("no instances: statistics need at least one row")
    seq_len = np.diff(id_off)
    masked = np.diff(pos_off)
    # Global index of each masked position: its row's start plus the position.
    row = np.repeat(np.arange(n), masked)
    at = ids[id_off[:-1][row] + pos.astype(np.int64)].astype(np.int64)
    orig = orig.astype(np.int64)
    is_mask = at == mask_id
    is_same = ~is_mask & (at == orig)
    m = max(1, len(at))
    return {
        "instances": int(n),
        "random_next_fraction": float(labels.mean()),
        "seq_len_mean": float(seq_len.mean()),
        "seq_len_p10": float(np.percentile(seq_len, 10)),
        "seq_len_median": float(np.median(seq_len)),
        "full_length_fraction": float(np.mean(seq_len == max_seq_length)),
        "a_len_mean": float(a_len.mean()),
        "masked_per_seq_mean": float(masked.mean()),
        "masked_per_seq_max": int(masked.max()),
        "masked_token_fraction": float(masked.sum() / seq_len.sum()),
        "mask_kind_fraction": {
            "mask": float(is_mask.sum() / m),
            "same": float(is_same.sum() / m),
            "random": float((~is_mask & ~is_same).sum() / m),
        },
        "tokens_total": int(seq_len.sum()),
    }
