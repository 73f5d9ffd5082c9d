"""Dataset rows in memory: a run of shard rows kept columnar (Arrow's flat values + offsets), and one shard read
from storage into it.

Gathering, re-masking and padding then are numpy operations with no Python loop over tokens.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from corpus.ragged import ragged_indices
from corpus.schema import SHARD_COLUMNS
from corpus.shard_index import verify_span


def _gather_ragged(values: np.ndarray, offsets: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows `idx` of a ragged column (values + offsets), as a new values + offsets pair."""
    starts, lengths = offsets[idx], offsets[idx + 1] - offsets[idx]
    new_off = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_off[1:])
    return values[ragged_indices(starts, lengths)], new_off


@dataclass
class Rows:
    """A run of dataset rows, columnar. Ragged columns are flat `*_values` arrays with `(n + 1,)` offsets. Rows of
    the training stream also carry each row's example id (`pretraining.order.example_id`: shard and row) and the
    epoch it is read in; rows read otherwise (evaluation, tests) have None there."""

    ids: np.ndarray
    """Every row's token ids end to end, int64: [CLS] A [SEP] B [SEP], with the masks applied."""
    ids_off: np.ndarray
    """(n + 1,) offsets into `ids`: row i is ids[ids_off[i]:ids_off[i + 1]]."""
    a_length: np.ndarray
    """(n,) tokens of segment A; segment B starts at a_length + 2 (after [CLS] A [SEP])."""
    pos: np.ndarray
    """Every row's masked-LM positions end to end (within its row)."""
    pos_off: np.ndarray
    """(n + 1,) offsets into `pos` and `lab`."""
    lab: np.ndarray
    """The original ids at `pos` (the masked-LM labels)."""
    nsp: np.ndarray
    """(n,) next-sentence labels: 1 when B is a random sentence, 0 when it follows A."""
    example: np.ndarray | None = None
    """(n,) example ids, `shard << 32 | row` (`pretraining.order.example_id`); None outside the training stream."""
    epoch: np.ndarray | None = None
    """(n,) the epoch each row is read in (dynamic masking draws a new mask per epoch); None outside the stream."""

    def __len__(self) -> int:
        return len(self.a_length)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.ids_off)

    @classmethod
    def from_arrow(cls, table) -> Rows:  # a pyarrow.Table with the schema's columns
        def ragged(name: str) -> tuple[np.ndarray, np.ndarray]:
            arr = table.column(name).combine_chunks()
            off = arr.offsets.to_numpy().astype(np.int64)
            vals = arr.values.to_numpy()[off[0]:off[-1]]  # a sliced array's values may extend past its rows
            return vals.astype(np.int64), off - off[0]

        ids, ids_off = ragged("input_ids")
        pos, pos_off = ragged("masked_lm_positions")
        lab, lab_off = ragged("masked_lm_ids")
        if not np.array_equal(pos_off, lab_off):
            raise ValueError("masked_lm_positions and masked_lm_ids have different lengths in some rows")
        return cls(ids, ids_off, table.column("a_length").to_numpy().astype(np.int64), pos, pos_off, lab,
                   table.column("next_sentence_label").to_numpy().astype(np.int64))

    @classmethod
    def from_pylist(cls, rows: Sequence[dict]) -> Rows:
        """From dicts with the schema's column names (tests, small tools)."""
        def ragged(name: str) -> tuple[np.ndarray, np.ndarray]:
            lists = [np.asarray(r[name], dtype=np.int64) for r in rows]
            off = np.zeros(len(lists) + 1, dtype=np.int64)
            np.cumsum([len(x) for x in lists], out=off[1:])
            return (np.concatenate(lists) if lists else np.zeros(0, np.int64)), off

        ids, ids_off = ragged("input_ids")
        pos, pos_off = ragged("masked_lm_positions")
        lab, _ = ragged("masked_lm_ids")
        return cls(ids, ids_off, np.array([r["a_length"] for r in rows], np.int64), pos, pos_off, lab,
                   np.array([r["next_sentence_label"] for r in rows], np.int64))

    def take(self, idx: np.ndarray) -> Rows:
        idx = np.asarray(idx, dtype=np.int64)
        ids, ids_off = _gather_ragged(self.ids, self.ids_off, idx)
        pos, pos_off = _gather_ragged(self.pos, self.pos_off, idx)
        lab, _ = _gather_ragged(self.lab, self.pos_off, idx)
        return Rows(ids, ids_off, self.a_length[idx], pos, pos_off, lab, self.nsp[idx],
                    None if self.example is None else self.example[idx],
                    None if self.epoch is None else self.epoch[idx])

    def slice(self, start: int, stop: int) -> Rows:
        return self.take(np.arange(start, stop))

    @staticmethod
    def concat(parts: Sequence[Rows]) -> Rows:
        if len(parts) == 1:
            return parts[0]

        def offs(offsets: list[np.ndarray]) -> np.ndarray:
            out, base = [np.zeros(1, np.int64)], 0
            for o in offsets:
                out.append(o[1:] + base)
                base += o[-1]
            return np.concatenate(out)

        def ids(name: str) -> np.ndarray | None:
            columns = [getattr(p, name) for p in parts]
            return None if any(c is None for c in columns) else np.concatenate(columns)

        return Rows(np.concatenate([p.ids for p in parts]), offs([p.ids_off for p in parts]),
                    np.concatenate([p.a_length for p in parts]), np.concatenate([p.pos for p in parts]),
                    offs([p.pos_off for p in parts]), np.concatenate([p.lab for p in parts]),
                    np.concatenate([p.nsp for p in parts]), ids("example"), ids("epoch"))


def read_shard(url: str, storage_options: dict | None = None, sha256: str = "") -> Rows:
    """One Parquet shard (local path or any fsspec URL: s3://, gs://, ...) as `Rows`; with `sha256` (the manifest's,
    for a dataset built with shard indexes) its bytes are checked before they are decoded."""
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    with fs.open(path, "rb") as f:
        if not sha256:
            return Rows.from_arrow(pq.read_table(f, columns=list(SHARD_COLUMNS)))
        data = f.read()
    verify_span(data, sha256, url)
    return Rows.from_arrow(pq.read_table(pa.BufferReader(data), columns=list(SHARD_COLUMNS)))
