"""datatrove's quality filters at their defaults on the same documents as benchmarks/curate_keeps_real.py: the
figures docs/build-checks.md puts beside ours (check curate-keeps-real). Run it with a Python that has datatrove
(not a project dependency), e.g. a separate virtualenv:

    python3 -m venv /tmp/dtvenv && /tmp/dtvenv/bin/pip install datatrove==0.10.1
    /tmp/dtvenv/bin/python benchmarks/curate_datatrove_quality.py --per-corpus 150

Filters, in FineWeb's order: GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter() (defaults: its
one-brace rule on), each as datatrove constructs it by default; a document is kept when all three keep it. The same
seeded samples and planted junk as curate_keeps_real.py (its functions, imported without the project's packages
beyond the benchmark). Language ID is left out: datatrove's downloads its fastText model at run time.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-corpus", type=int, default=150)
    ap.add_argument("--junk", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    from curate_keeps_real import corpora
    from datatrove.data import Document
    from datatrove.pipeline.filters import C4QualityFilter, GopherQualityFilter, GopherRepetitionFilter

    filters = [("gopher_rep", GopherRepetitionFilter()), ("gopher_quality", GopherQualityFilter()),
               ("c4", C4QualityFilter())]
    data = corpora(False, args.seed, args.junk, args.per_corpus)
    print(f"# datatrove defaults; load {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| corpus | documents | kept | kept % | drops by filter |")
    print("|---|---|---|---|---|")
    for name, (texts, _) in data.items():
        reasons: collections.Counter[str] = collections.Counter()
        for i, t in enumerate(texts):
            doc = Document(text=t, id=str(i))
            for fname, f in filters:
                got = f.filter(doc)
                ok = got[0] if isinstance(got, tuple) else got
                if not ok:
                    why = got[1] if isinstance(got, tuple) and len(got) > 1 else ""
                    reasons[f"{fname}:{why}"] += 1
                    break
        kept = len(texts) - sum(reasons.values())
        top = ", ".join(f"{r} {c}" for r, c in reasons.most_common(4))
        print(f"| {name} | {len(texts)} | {kept} | {100 * kept / len(texts):.1f} | {top} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
