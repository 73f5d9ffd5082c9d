"""Test helper: copies of a built dataset with sidecar indexes (corpus/shard_index.py) and the manifest's four
shard keys, as the build writes them, optionally rewriting the shards with smaller row groups first (the same rows
in the same order: only the Parquet layout changes); or without them, as datasets built before indexes are."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus.shard_index import index_name, index_parquet


def strip_index(src: str | Path, dest: str | Path) -> str:
    """A copy of the local dataset `src` at `dest` as built before shards had indexes; returns `dest`."""
    src, dest = Path(src), Path(dest)
    shutil.copytree(src, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    for entry in manifest["shards"]:
        for key in ("sha256", "bytes", "index", "index_sha256"):
            entry.pop(key, None)
        (dest / index_name(entry["file"])).unlink(missing_ok=True)
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return str(dest)


def add_index(src: str | Path, dest: str | Path, row_group_size: int | None = None) -> str:
    """A copy of the local dataset `src` at `dest` with an index beside each shard; returns `dest`."""
    src, dest = Path(src), Path(dest)
    shutil.copytree(src, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    for entry in manifest["shards"]:
        path = dest / entry["file"]
        table = pq.read_table(path)
        if row_group_size:
            pq.write_table(table, path, row_group_size=row_group_size, compression="zstd")
        lengths = pc.list_value_length(table.column("input_ids")).to_numpy()
        index = index_parquet(str(path), lengths)
        data = index.to_bytes()
        (dest / index_name(entry["file"])).write_bytes(data)
        entry.update(sha256=index.file_sha256, bytes=index.file_bytes, index=index_name(entry["file"]),
                     index_sha256=hashlib.sha256(data).hexdigest())
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return str(dest)
