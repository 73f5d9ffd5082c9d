"""Pre-training input at cluster scale (issue 45): n logical ranks of one machine, each its own reader (no
training, no exchange), over a local folder, a counting HTTP server and an S3 server (moto), all on loopback.

    python benchmarks/loader_scale.py --data DATASET [--data DATASET ...] --ranks 1,2,8,64 --stores local,http,s3

Per dataset, packing off and on, store and n: each measured rank (`--measured`: rank 0, or rank 0 and n-1) runs
the loader's own `rank_steps` for an epoch's steps (dynamic masking, its micro-batches made into torch tensors,
page-locked when a GPU is present) and prints

* the bytes it read from the store: shards (`shards/n`: as a multiple of 1/n of the bytes of the shards its steps
  planned, which reading them whole reads, the whole dataset over an epoch; the issue's target is <= 1.25) and
  indexes (the lengths the order needs);
* its own sequences per CPU-second (process CPU time, the reader's threads included), for its share read through
  the shard indexes (`share`) and, local only, read whole as before indexes (`whole`, the peer), and the ratio to
  n = 1 of the same mode (the issue's target at n = 64: >= 0.8).

HTTP bytes are the server's count of shard and index bytes (checked equal to the reader's); S3 bytes the
reader's. The dataset must have shard indexes (built since corpus/shard_index.py; `--reindex ROWS` rewrites a
local copy's row groups to ROWS rows first, to see what row group size does).
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.loader_store import CountingStore  # noqa: E402
from corpus.schema import read_manifest  # noqa: E402
from pretraining.loader import DataConfig, rank_steps, share_reader  # noqa: E402


def _tensors(share, pin: bool) -> None:
    import torch

    for batch in share.micro:
        for v in batch.values():
            t = torch.from_numpy(v)
            if pin:
                t.pin_memory()


def measure(url: str, endpoint: str | None, n: int, rank: int, packing: bool, steps: int, share: bool,
            pin: bool) -> dict:
    manifest = read_manifest(url, endpoint)
    data = DataConfig(train=manifest, endpoint_url=endpoint, micro_batch_size=max(1, 256 // n), batch_size=256,
                      dynamic_masking=True, mask_id=manifest.vocab.mask_id, masked_lm_prob=manifest.masked_lm_prob,
                      packing=packing).for_world(n)
    reader = share_reader(data) if share else False
    if share and reader is None:
        raise SystemExit(f"{url} has no shard indexes: build it again (or pass --reindex)")
    own = 0
    t0 = time.process_time()
    for _, s in zip(range(steps), rank_steps(data, manifest.vocab.size, 1, rank, n, reader=reader), strict=False):
        _tensors(s, pin)
        own += sum(len(e) for e in s.examples)
    cpu = time.process_time() - t0
    stats = reader.stats if reader else None
    return {"own": own, "cpu": cpu, "bytes": stats.bytes - stats.index_bytes if stats else None,
            "index": stats.index_bytes if stats else None, "shard_bytes": stats.shard_bytes if stats else None}


def reindexed(src: str, rows: int, root: Path) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "pretraining"))
    from indexed import add_index

    return add_index(src, root / f"{Path(src).name}-g{rows}", row_group_size=rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", action="append", required=True, help="a local dataset folder with shard indexes")
    p.add_argument("--ranks", default="1,2,8,64")
    p.add_argument("--stores", default="local,http,s3")
    p.add_argument("--packing", default="off,on")
    p.add_argument("--measured", type=int, default=1, help="ranks measured per n: 1 (rank 0) or 2 (0 and n-1)")
    p.add_argument("--max-steps", type=int, default=0, help="cap on the steps per rank (0: one epoch)")
    p.add_argument("--reindex", type=int, default=0, help="rewrite a copy's row groups to this many rows first")
    a = p.parse_args(argv)
    ranks = [int(x) for x in a.ranks.split(",")]
    stores = a.stores.split(",")
    for d in a.data:
        if not Path(d, "manifest.json").is_file():
            p.error(f"--data {d}: not a local dataset folder (no manifest.json)")
    import torch

    pin = torch.cuda.is_available()
    tmp = Path(tempfile.mkdtemp(prefix="loader-scale-"))
    datasets = [reindexed(d, a.reindex, tmp) if a.reindex else str(Path(d).resolve()) for d in a.data]
    served = Path(os.path.commonpath(datasets))
    served = served if len(datasets) > 1 else served.parent
    http = CountingStore(served) if "http" in stores else None
    s3 = None
    if "s3" in stores:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request log

        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        s3.start()
        s3_endpoint = f"http://127.0.0.1:{port}"
        import boto3

        client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
        client.create_bucket(Bucket="bench")
        for d in datasets:
            for f in Path(d).rglob("*"):
                if f.is_file() and not f.name.startswith("_"):
                    client.upload_file(str(f), "bench", f"{Path(d).name}/{f.relative_to(d)}")
    if http:
        http.__enter__()
    measure(datasets[0], None, 1, 0, False, 3, True, pin)  # warm-up: imports and first calls are not counted
    load = os.getloadavg()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load {load[0]:.1f} "
          f"{load[1]:.1f} {load[2]:.1f}, pinned tensors: {pin}, global batch 256, dynamic masking, seed 1")
    print("| data | packed | store | n | rank | read | shards/n | index B | own seq | CPU-s | own seq/CPU-s | "
          "vs n=1 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    base: dict = {}
    try:
        for d in datasets:
            manifest = read_manifest(d)
            for packing in (x == "on" for x in a.packing.split(",")):
                steps = manifest.instances // (256 * (2 if packing else 1))
                steps = min(steps, a.max_steps) if a.max_steps else steps
                for store in stores:
                    url, endpoint = {
                        "local": (d, None), "http": (f"{http.url if http else ''}/{Path(d).relative_to(served)}", None),
                        "s3": (f"s3://bench/{Path(d).name}", s3_endpoint if s3 else None)}[store]
                    for n in ranks:
                        for mode in (("share", "whole") if store == "local" else ("share",)):
                            for rank in sorted({0, n - 1})[:a.measured]:
                                if http:
                                    http.reset()
                                r = measure(url, endpoint, n, rank, packing, steps, mode == "share", pin)
                                if store == "http" and r["bytes"] is not None:
                                    counted = sum(size for path, _, size in http.log if "/shards/" in path)
                                    assert counted == r["index"] + r["bytes"], (counted, r)  # the server's count
                                rate = r["own"] / r["cpu"]
                                key = (d, packing, store, mode)
                                if n == 1:
                                    base[key] = rate
                                ratio = f"{rate / base[key]:.2f}" if key in base else ""
                                share = "" if r["bytes"] is None else f"{r['bytes'] / r['shard_bytes'] * n:.2f}"
                                print(f"| {Path(d).name} | {'yes' if packing else 'no'} | {store} | {n} | {rank} | "
                                      f"{mode} | {share} | {r['index'] or ''} | {r['own']} | {r['cpu']:.2f} | "
                                      f"{rate:,.0f} | {ratio} |", flush=True)
    finally:
        if http:
            http.__exit__(None, None, None)
        if s3:
            s3.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
