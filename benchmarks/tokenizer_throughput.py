"""The build's WordPiece encoder (``corpus.tokenize.WordPieceEncoder``) against Hugging Face ``tokenizers``' own
WordPiece pipeline (BertNormalizer + BertPreTokenizer + WordPiece, the reference's rules: ``build_tokenizer``) on the
same sentences and the same vocabulary, in MB of text per CPU-second.

Each corpus is read whole (never repeated), split into sentences as the build splits them
(``corpus.sentences.split_sentences``, not timed), and encoded in batches of the build's size
(``pipeline.docs._ENCODE_BATCH``, 20,000 sentences) by a fresh encoder, the way one build worker meets the text: its
chunk table starts cold and sees every batch once. CPU-seconds are the process's (``time.process_time``: every
thread, so HF's Rayon threads count). The ids of both are compared sentence by sentence on the whole corpus: the
run fails loudly if they differ anywhere.

    .venv/bin/python benchmarks/tokenizer_throughput.py                      # the shared corpora
    .venv/bin/python benchmarks/tokenizer_throughput.py --corpora tech --max-mb 2   # a quick look

Prints one line per corpus (MB, distinct chunks, ours and HF in MB per CPU-s, the ratio, the chunk table's size and
evictions) and, with --json, writes them. Figures and the load they were measured under: docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from corpus.sentences import split_sentences  # noqa: E402
from corpus.tokenize import WordPieceEncoder, build_tokenizer, read_vocab  # noqa: E402
from pipeline.docs import _ENCODE_BATCH  # noqa: E402

CORPORA = Path(os.environ.get("BERT_CORPORA", "/work/shared/data/corpora"))
VOCAB = REPO / "data" / "sample" / "reference" / "bert-base-uncased-vocab.txt"
DEFAULT = ["tech", "multilang", "gcide", "austen", "mobydick", "tdavid", "webbible", "mhcc"]


def sentences_of(path: Path, max_mb: float | None) -> tuple[list[str], int]:
    """The corpus's sentences (each document's text split as the build splits it) and their UTF-8 bytes."""
    out: list[str] = []
    total = 0
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            text = json.loads(line).get("text")
            if not isinstance(text, str):
                continue
            for s in split_sentences(text):
                out.append(s)
                total += len(s.encode("utf-8"))
            if max_mb is not None and total >= max_mb * 1e6:
                break
    return out, total


def cpu() -> float:
    return time.process_time()


def run(name: str, sentences: list[str], nbytes: int, tokens: list[str]) -> dict:
    batches = [sentences[i:i + _ENCODE_BATCH] for i in range(0, len(sentences), _ENCODE_BATCH)]
    enc = WordPieceEncoder(tokens=tokens)
    c0, w0 = cpu(), time.perf_counter()
    ours = [enc.encode_flat(b) for b in batches]
    ours_cpu, ours_wall = cpu() - c0, time.perf_counter() - w0
    hf = build_tokenizer(tokens)
    c0, w0 = cpu(), time.perf_counter()
    theirs = [hf.encode_batch_fast(b, add_special_tokens=False) for b in batches]
    hf_cpu, hf_wall = cpu() - c0, time.perf_counter() - w0
    for b, (values, lengths), encs in zip(batches, ours, theirs, strict=True):
        expected = [i for e in encs for i in e.ids]
        if lengths.tolist() != [len(e.ids) for e in encs] or values.tolist() != expected:
            raise SystemExit(f"{name}: our ids differ from tokenizers' on a batch starting {b[0][:60]!r}")
    stats = enc.cache_stats() if hasattr(enc, "cache_stats") else {"distinct_chunks": -1, "held": -1, "evicted": -1}
    mb = nbytes / 1e6
    return {"corpus": name, "mb": round(mb, 2), "sentences": len(sentences),
            "ours_cpu_s": round(ours_cpu, 2), "ours_wall_s": round(ours_wall, 2),
            "ours_mb_per_cpu_s": round(mb / ours_cpu, 2),
            "hf_cpu_s": round(hf_cpu, 2), "hf_wall_s": round(hf_wall, 2), "hf_mb_per_cpu_s": round(mb / hf_cpu, 2),
            "ratio": round(hf_cpu / ours_cpu, 2), **stats}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", nargs="+", default=DEFAULT, help="names under --dir (NAME.jsonl.gz)")
    ap.add_argument("--dir", type=Path, default=CORPORA, help="folder of the corpora (default: %(default)s)")
    ap.add_argument("--vocab", type=Path, default=VOCAB, help="vocab.txt (default: bert-base-uncased)")
    ap.add_argument("--max-mb", type=float, default=None, help="read at most this many MB of each corpus")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    missing = [c for c in args.corpora if not (args.dir / f"{c}.jsonl.gz").is_file()]
    if missing:
        print(f"--corpora: no {', '.join(missing)} under {args.dir}: pass names of NAME.jsonl.gz files there",
              file=sys.stderr)
        return 2
    tokens = read_vocab(args.vocab)
    print(f"load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}, "
          f"{os.cpu_count()} CPUs, batches of {_ENCODE_BATCH} sentences", flush=True)
    results = []
    for name in args.corpora:
        sentences, nbytes = sentences_of(args.dir / f"{name}.jsonl.gz", args.max_mb)
        r = run(name, sentences, nbytes, tokens)
        results.append(r)
        print(f"{name:10s} {r['mb']:7.2f} MB  ours {r['ours_mb_per_cpu_s']:6.2f} MB/CPU-s ({r['ours_cpu_s']:.1f} "
              f"CPU-s)  tokenizers {r['hf_mb_per_cpu_s']:6.2f} MB/CPU-s ({r['hf_cpu_s']:.1f} CPU-s)  "
              f"x{r['ratio']:.2f}  chunks seen {r['distinct_chunks']:,}, held {r['held']:,}, "
              f"evicted {r['evicted']:,}", flush=True)
    total_mb = sum(r["mb"] for r in results)
    ours = total_mb / sum(r["ours_cpu_s"] for r in results)
    theirs = total_mb / sum(r["hf_cpu_s"] for r in results)
    print(f"{'all':10s} {total_mb:7.2f} MB  ours {ours:6.2f} MB/CPU-s  tokenizers {theirs:6.2f} MB/CPU-s  "
          f"x{ours / theirs:.2f}; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if args.json:
        args.json.write_text(json.dumps({"load": os.getloadavg(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
