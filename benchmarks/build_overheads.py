"""The fixed costs behind the data build's earlier design (Ray Data stages, until issue 11 moved the steps to plain
Ray tasks: pipeline/build/ray_tasks.py says why), each against its alternative in one run; kept for the record.

    python benchmarks/build_overheads.py [--cpus 2]

1. A local Ray's fixed cost: import, `ray.init`, the first Ray Data execution, `ray.shutdown` (seconds).
2. Ray Data's per-operator resource reservation on a single map of 16 one-CPU tasks of 0.2 s busy work, on and off
   (the build turns it off): wall seconds of each and their ratio; the ideal is 16 x 0.2 / cpus.
3. Intermediate files: writing and reading back one 40k-row instance table as plain Parquet (no compression, no
   dictionary) vs an Arrow IPC file, one batch per 1/30th (as the build's hash buckets).
"""
from __future__ import annotations

import argparse
import io
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def _busy(batch):
    end = time.perf_counter() + 0.2
    while time.perf_counter() < end:
        pass
    return batch


def ray_costs(cpus: int) -> dict[str, float]:
    t = time.perf_counter()
    import ray
    import ray.data
    out = {"import_s": time.perf_counter() - t}
    t = time.perf_counter()
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    out["init_s"] = time.perf_counter() - t
    t = time.perf_counter()
    list(ray.data.from_items([{"a": 1}]).map_batches(lambda b: b, batch_size=1).iter_rows())
    out["first_execution_s"] = time.perf_counter() - t
    ctx = ray.data.DataContext.get_current()
    for label, reserve in (("reservation_on_s", True), ("reservation_off_s", False)):
        ctx.op_resource_reservation_enabled = reserve
        ds = ray.data.from_items([{"i": i} for i in range(16)], override_num_blocks=16).map_batches(
            _busy, batch_size=1, num_cpus=1)
        t = time.perf_counter()
        list(ds.iter_rows())
        out[label] = time.perf_counter() - t
    t = time.perf_counter()
    ray.shutdown()
    out["shutdown_s"] = time.perf_counter() - t
    return out


def work_files(rows: int = 40_000, groups: int = 30) -> dict[str, float]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 129, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 30522, offsets[-1]).astype(np.uint16)))
    table = pa.table({"input_ids": ids, "a_length": pa.array((lengths // 2).astype(np.int16)),
                      "key": pa.array(rng.integers(0, 2**63, rows).astype(np.uint64))})
    bounds = np.linspace(0, rows, groups + 1).astype(int)

    def parquet():
        buf = io.BytesIO()
        with pq.ParquetWriter(buf, table.schema, compression="none", use_dictionary=False) as w:
            for a, b in zip(bounds[:-1], bounds[1:]):
                w.write_table(table.slice(a, b - a), row_group_size=b - a)
        return buf

    def ipc():
        buf = io.BytesIO()
        with pa.ipc.new_file(buf, table.schema) as w:
            for a, b in zip(bounds[:-1], bounds[1:]):
                w.write_batch(table.slice(a, b - a).to_batches()[0])
        return buf

    out = {}
    for name, write in (("parquet", parquet), ("ipc", ipc)):
        best = min(_timed(write) for _ in range(3))
        buf = write()
        buf.seek(0)
        t = time.perf_counter()
        if name == "parquet":
            pq.ParquetFile(buf).read_row_groups(list(range(0, groups, 2)))
        else:
            reader = pa.ipc.open_file(buf)
            pa.Table.from_batches([reader.get_batch(i) for i in range(0, groups, 2)])
        out[f"{name}_write_ms"] = best * 1e3
        out[f"{name}_read_half_ms"] = (time.perf_counter() - t) * 1e3
        out[f"{name}_mb"] = len(buf.getvalue()) / 1e6
    return out


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpus", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    r = ray_costs(args.cpus)
    print(f"ray: import {r['import_s']:.2f} s, init {r['init_s']:.2f} s, first Ray Data execution "
          f"{r['first_execution_s']:.2f} s, shutdown {r['shutdown_s']:.2f} s")
    print(f"16 x 0.2 s one-CPU tasks on {args.cpus} CPUs: reservation on {r['reservation_on_s']:.2f} s, off "
          f"{r['reservation_off_s']:.2f} s (ideal {16 * 0.2 / args.cpus:.2f} s): "
          f"{r['reservation_on_s'] / r['reservation_off_s']:.2f}x")
    w = work_files()
    print(f"intermediate 40k rows: plain Parquet write {w['parquet_write_ms']:.0f} ms, read half "
          f"{w['parquet_read_half_ms']:.0f} ms, {w['parquet_mb']:.1f} MB; Arrow IPC write {w['ipc_write_ms']:.0f} ms, "
          f"read half {w['ipc_read_half_ms']:.0f} ms, {w['ipc_mb']:.1f} MB; write "
          f"{w['parquet_write_ms'] / max(w['ipc_write_ms'], 1e-3):.0f}x faster as IPC")


if __name__ == "__main__":
    main()
