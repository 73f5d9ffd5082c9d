"""Scratch and disk of a build per byte of text, and the rows it makes per row written (issue 41).

    python benchmarks/build_disk.py --input /work/shared/data/corpora/tech.jsonl.gz --text-mb 8 --output /tmp/bd

Takes the first ``--text-mb`` MB of text (whole documents, never repeated) of a JSON Lines ``.gz`` corpus, builds
it with the plain loop (bert-base-uncased, seq 128, ``--dupe-factor`` 5 by default) while a thread samples the
output folder's bytes every 5 ms and at every stage's end, and prints one JSON line: the text's bytes, the peaks of
``_work`` and of the whole output folder as multiples of the text, the shards', the rows made per row written
(``ShardMarker.rows_made``) and the process's CPU seconds (the plain loop runs every stage in this process; the
sampling thread's share included, so it is an upper bound).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from corpus.create_instances import InstanceConfig  # noqa: E402
from pipeline import BuildConfig, build  # noqa: E402
from pipeline.markers import read_markers  # noqa: E402
from pipeline.shards import ShardMarker  # noqa: E402


def _du(path: str) -> int:
    n = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                n += os.stat(os.path.join(root, f)).st_size
            except FileNotFoundError:  # renamed or removed between the listing and the stat
                pass
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", required=True, help="a JSON Lines .gz corpus with a 'text' field")
    ap.add_argument("--text-mb", type=float, default=8.0, help="MB of its text to build (whole documents)")
    ap.add_argument("--output", required=True, help="a scratch folder (replaced)")
    ap.add_argument("--dupe-factor", type=int, default=5)
    ap.add_argument("--num-shards", type=int, default=None, help="default: planned from the corpus's size")
    args = ap.parse_args(argv)
    if not os.path.isfile(args.input):
        print(f"--input {args.input}: no such file; give a JSON Lines .gz corpus", file=sys.stderr)
        return 2
    shutil.rmtree(args.output, ignore_errors=True)
    os.makedirs(args.output)
    corpus, out = os.path.join(args.output, "text.jsonl"), os.path.join(args.output, "out")
    text = 0
    with gzip.open(args.input, "rt") as f, open(corpus, "w") as g:
        for line in f:
            t = json.loads(line)["text"]
            g.write(json.dumps({"text": t}) + "\n")
            text += len(t.encode())
            if text >= args.text_mb * 1e6:
                break
    peak = {"work": 0, "out": 0}
    shard_markers: list = []
    done = threading.Event()

    def sample(*_) -> None:
        w, o = _du(os.path.join(out, "_work")), _du(out)
        peak["work"], peak["out"] = max(peak["work"], w), max(peak["out"], o)

    def told(stage: str, *_) -> None:
        sample()
        if stage == "shards":  # its markers, before the build removes _work
            shard_markers.extend(read_markers(os.path.join(out, "_work"), ShardMarker).values())

    def poll() -> None:
        while not done.wait(0.005):
            sample()

    thread = threading.Thread(target=poll, daemon=True)
    cfg = BuildConfig(inputs=(corpus,), output=out, dupe_factor=args.dupe_factor, num_shards=args.num_shards,
                      vocab=str(REPO / "data" / "sample" / "reference" / "bert-base-uncased-vocab.txt"),
                      instances=InstanceConfig(max_seq_length=128))
    c0, t0 = os.times(), time.time()
    thread.start()
    try:
        m = build(cfg, on_stage=told)
    finally:
        done.set()
        thread.join()
    c1 = os.times()
    shards = sum(s.bytes for s in m.shards)
    rows, made = sum(x.rows for x in shard_markers), sum(x.rows_made for x in shard_markers)
    print(json.dumps({
        "input": args.input, "text_bytes": text, "dupe_factor": args.dupe_factor, "shards": len(m.shards),
        "work_peak_x": round(peak["work"] / text, 3), "output_peak_x": round(peak["out"] / text, 3),
        "shards_x": round(shards / text, 3), "rows": m.totals.instances,
        "rows_made_per_row": round(made / max(1, rows), 4),
        "cpu_s": round(c1.user + c1.system - c0.user - c0.system, 1), "wall_s": round(time.time() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
