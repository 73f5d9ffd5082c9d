"""Near-dedup recall and false drops against edit level, for candidate (threshold, shingle words, permutations):
the curve the default of ``--dedup near`` is chosen from (docs/build-checks.md, check curate-near-edits).

Documents: real documents of the shared corpora (../shared/data/corpora): technical English with code
(tech.jsonl.gz), the English part of multilang.jsonl.gz, and the literary corpora cut into ~600-word pieces with
paragraphs of ~6 sentences. Each document is clipped to at most ``--max-words`` words at a paragraph boundary, like a
news article or a documentation page. Per edit level, ``--per-level`` (75) originals each get one copy:

- ``words1``/``words3``/``words5``/``words10``: that share of the words edited (an edit replaces, deletes or inserts
  one word; inserted and replacing words are drawn from the corpus's own words),
- ``para_removed``/``para_added``/``para_moved``: one paragraph removed, one added (from a document not otherwise
  used) or moved elsewhere,
- ``boilerplate``: a web page's header and footer added (navigation, cookie and newsletter text, ~60 words).

Plus ``--distinct`` (400) documents with no copy. Every original and distinct document is a different document of
the corpora. A planted pair is *caught* when exactly one of the two is kept; a *false drop* is a distinct
document or an original dropped for any reason other than its own copy. The true Jaccard of each level (5-word
shingles, the project's word normalisation) is printed so the levels can be compared with other benchmarks.

    .venv/bin/python benchmarks/curate_near_curve.py                 # the grid
    .venv/bin/python benchmarks/curate_near_curve.py --default-only  # the library default only

Deterministic (seeded); one process; prints one table per setting.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from curate.dedup import DedupConfig, Signatures, drop_set  # noqa: E402
from curate.words import ngrams, words  # noqa: E402

CORPORA = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpora"
LEVELS = ("words1", "words3", "words5", "words10", "para_removed", "para_added", "para_moved", "boilerplate")
HEADER = ("Home | News | Business | Technology | Sport | Opinion | Subscribe. We use cookies to improve your "
          "experience on our site. By continuing to browse you agree to our use of cookies. Accept all cookies.")
FOOTER = ("Sign up for our newsletter to get the latest stories delivered to your inbox every morning. Share this "
          "article: Facebook Twitter Email. Copyright 2026 The Daily Record. All rights reserved. Privacy policy. "
          "Terms of use. Contact us.")


def _read(name: str) -> list[dict]:
    with gzip.open(CORPORA / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _paragraphs_literary(text: str, rng: random.Random, piece_words: int) -> list[list[str]]:
    """A literary document (paragraph breaks flattened) as pieces of ~piece_words words, each a list of paragraphs
    of ~6 sentences."""
    sentences = re.split(r"(?<=[.!?])\s+", text)
    pieces, cur, para, n = [], [], [], 0
    for s in sentences:
        para.append(s)
        n += len(s.split())
        if len(para) >= 6:
            cur.append(" ".join(para))
            para = []
        if n >= piece_words and cur:
            pieces.append(cur)
            cur, n = [], 0
    return pieces


def documents(max_words: int, seed: int) -> list[tuple[str, list[str]]]:
    """(id, paragraphs) of real documents with >= 4 paragraphs and >= 150 words, clipped to max_words at a
    paragraph boundary, shuffled."""
    rng = random.Random(seed)
    out: list[tuple[str, list[str]]] = []
    for name in ("tech", "multilang"):
        for d in _read(name):
            if name == "multilang" and d.get("lang") != "en":
                continue
            paras = [p.strip() for p in d["text"].split("\n\n") if p.strip()]
            out.append((d["id"], paras))
    for name in ("austen", "mobydick", "tdavid", "mhcc", "webbible"):
        for d in _read(name):
            for k, paras in enumerate(_paragraphs_literary(d["text"], rng, 600)):
                out.append((f"{d['id']}#{k}", paras))
    kept = []
    for doc_id, paras in out:
        clipped, n = [], 0
        for p in paras:
            if n + len(p.split()) > max_words and len(clipped) >= 4:
                break
            clipped.append(p)
            n += len(p.split())
        if len(clipped) >= 4 and 150 <= n <= max_words * 1.5:
            kept.append((doc_id, clipped))
    rng.shuffle(kept)
    return kept


def edit_words(text: str, share: float, vocab: list[str], rng: random.Random) -> str:
    w = text.split(" ")
    n = max(1, round(share * len(text.split())))
    for _ in range(n):
        op = rng.randrange(3)
        j = rng.randrange(len(w))
        if op == 0:
            w[j] = rng.choice(vocab)
        elif op == 1 and len(w) > 10:
            del w[j]
        else:
            w.insert(j, rng.choice(vocab))
    return " ".join(w)


def plant(docs, per_level: int, n_distinct: int, seed: int):
    """(documents [(id, text)], pairs [(level, original id, copy id)], distinct ids)."""
    rng = random.Random(seed)
    need = per_level * len(LEVELS) + n_distinct + per_level
    if len(docs) < need:
        raise SystemExit(f"only {len(docs)} documents, {need} needed: lower --per-level or --distinct")
    vocab = sorted({t for _, paras in docs[:2000] for p in paras for t in p.split() if t.isalpha()})
    out, pairs, i = [], [], 0
    extra = docs[per_level * len(LEVELS) + n_distinct:]
    for level in LEVELS:
        for k in range(per_level):
            doc_id, paras = docs[i]
            i += 1
            text = "\n\n".join(paras)
            p = list(paras)
            if level.startswith("words"):
                copy = edit_words(text, int(level[5:]) / 100, vocab, rng)
            elif level == "para_removed":
                del p[rng.randrange(len(p))]
                copy = "\n\n".join(p)
            elif level == "para_added":
                donor = extra[k][1]
                p.insert(rng.randrange(len(p) + 1), donor[rng.randrange(len(donor))])
                copy = "\n\n".join(p)
            elif level == "para_moved":
                a = rng.randrange(len(p))
                moved = p.pop(a)
                b = rng.choice([x for x in range(len(p) + 1) if x != a])
                p.insert(b, moved)
                copy = "\n\n".join(p)
            else:
                copy = "\n\n".join([HEADER, *p, FOOTER])
            out.append((doc_id, text))
            copy_id = f"zz-copy-{level}-{k:03d}"
            out.append((copy_id, copy))
            pairs.append((level, doc_id, copy_id))
    distinct = []
    for _ in range(n_distinct):
        doc_id, paras = docs[i]
        i += 1
        out.append((doc_id, "\n\n".join(paras)))
        distinct.append(doc_id)
    return out, pairs, distinct


def true_jaccard(a: str, b: str, k: int = 5) -> float:
    g, off = ngrams(words([a, b]), k, short=True)
    x, y = set(g[off[0]:off[1]].tolist()), set(g[off[1]:off[2]].tolist())
    return len(x & y) / len(x | y)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def whole_corpus(settings: list[DedupConfig]) -> None:
    """Every document of the shared corpora as it is; per setting, what near dedup drops and how alike each
    dropped document really is to the one kept (true 5-word-shingle Jaccard)."""
    out = []
    for name in ("tech", "multilang", "gcide", "austen", "mobydick", "tdavid", "mhcc", "webbible"):
        out += [(d["id"], d["text"]) for d in _read(name)]
    texts = dict(out)
    table = pa.table({"id": [d for d, _ in out], "text": [t for _, t in out]})
    print(f"# {len(out)} documents of the shared corpora as they are; load {os.getloadavg()[0]:.2f}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("threshold shingle perm bands x rows | dropped | true J < 0.5 | 0.5-0.7 | >= 0.7 | worst pair")
    sig_cache: dict[tuple[int, int], list[pa.Table]] = {}
    for cfg in settings:
        key = (cfg.shingle_words, cfg.num_perm)
        if key not in sig_cache:
            sig_cache[key] = [Signatures(cfg)(table.slice(i, 500)) for i in range(0, len(table), 500)]
        drops = drop_set(sig_cache[key], cfg)
        bins = [0, 0, 0]
        worst = (2.0, "")
        for d, k in zip(drops["id"].to_pylist(), drops["duplicate_of"].to_pylist(), strict=False):
            j = true_jaccard(texts[d], texts[k])
            bins[0 if j < 0.5 else 1 if j < 0.7 else 2] += 1
            worst = min(worst, (j, f"{d} ~ {k}"))
        print(f"{cfg.threshold:9.2f} {cfg.shingle_words:7d} {cfg.num_perm:4d} {cfg.bands:5d} x {cfg.rows:<4d} | "
              f"{len(drops):7d} | {bins[0]:12d} | {bins[1]:7d} | {bins[2]:6d} | "
              + (f"{worst[0]:.3f} {worst[1]}" if worst[1] else "-"))
        sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-level", type=int, default=75)
    ap.add_argument("--distinct", type=int, default=400)
    ap.add_argument("--max-words", type=int, default=800)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--thresholds", default="0.5,0.55,0.6,0.65,0.7,0.75,0.8")
    ap.add_argument("--shingles", default="3,4,5")
    ap.add_argument("--num-perm", default="112")
    ap.add_argument("--default-only", action="store_true", help="only DedupConfig(mode='near') as it stands")
    ap.add_argument("--corpus", action="store_true",
                    help="instead: dedup every document of the shared corpora as they are (tech, multilang, the "
                         "literary ones; no planted copies) and print what each setting drops, by the true Jaccard "
                         "of each dropped document to the one it is a copy of")
    args = ap.parse_args()
    if not CORPORA.is_dir():
        raise SystemExit(f"needs the shared corpora at {CORPORA}")
    settings = ([DedupConfig(mode="near")] if args.default_only else
                [DedupConfig(mode="near", threshold=t, shingle_words=s, num_perm=p)
                 for p in (int(x) for x in args.num_perm.split(","))
                 for s in (int(x) for x in args.shingles.split(","))
                 for t in (float(x) for x in args.thresholds.split(","))])
    if args.corpus:
        return whole_corpus(settings)
    docs = documents(args.max_words, args.seed)
    out, pairs, distinct = plant(docs, args.per_level, args.distinct, args.seed)
    texts = dict(out)
    table = pa.table({"id": [d for d, _ in out], "text": [t for _, t in out]})
    print(f"# {len(out)} documents ({len(pairs)} planted pairs, {len(distinct)} distinct), "
          f"mean {np.mean([len(t.split()) for _, t in out]):.0f} words; load {os.getloadavg()[0]:.2f}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("# true Jaccard (5-word shingles) per level: min / median / max")
    for level in LEVELS:
        js = [true_jaccard(texts[a], texts[b]) for lv, a, b in pairs if lv == level]
        print(f"#   {level:13s} {min(js):.3f} / {np.median(js):.3f} / {max(js):.3f}")
    print("threshold shingle perm bands x rows | " + " ".join(f"{lv:>12s}" for lv in LEVELS)
          + " | distinct kept | false drops | cpu-s")
    sig_cache: dict[tuple[int, int], list[pa.Table]] = {}
    for cfg in settings:
        c0 = cpu()
        key = (cfg.shingle_words, cfg.num_perm)
        if key not in sig_cache:
            sig_cache[key] = [Signatures(cfg)(table)]
        drops = drop_set(sig_cache[key], cfg)
        spent = cpu() - c0
        dropped = dict(zip(drops["id"].to_pylist(), drops["duplicate_of"].to_pylist(), strict=False))
        caught = {lv: 0 for lv in LEVELS}
        false = 0
        for lv, a, b in pairs:
            if (a in dropped) != (b in dropped):
                caught[lv] += 1
            if a in dropped and dropped[a] != b:
                false += 1
        lost = [d for d in distinct if d in dropped]
        false += len(lost)
        print(f"{cfg.threshold:9.2f} {cfg.shingle_words:7d} {cfg.num_perm:4d} {cfg.bands:5d} x {cfg.rows:<4d} | "
              + " ".join(f"{caught[lv]:>9d}/{args.per_level:<2d}" for lv in LEVELS)
              + f" | {len(distinct) - len(lost):>9d}/{len(distinct)} | {false:11d} | {spent:5.1f}")
        for d in lost[:3]:
            print(f"#     dropped distinct {d} as copy of {dropped[d]}: true Jaccard "
                  f"{true_jaccard(texts[d], texts[dropped[d]]):.3f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
