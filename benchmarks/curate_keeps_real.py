"""What ``--quality`` and ``--languages`` keep of real, clean documents and drop of planted junk, per rule: the
measurements the quality defaults and the language threshold are chosen from (docs/build-checks.md, check
curate-keeps-real).

Clean: every document of the shared corpora (../shared/data/corpora): tech.jsonl.gz per source (Linux man pages,
PostgreSQL, Perl, Git, ... documentation with code), multilang.jsonl.gz per language (each judged with its own
``--languages``), the literary corpora and the GCIDE dictionary. Junk (``--junk`` of each kind, seeded, made from the
same corpora's words): a line repeated, symbol and number spam, word salad (words drawn from the vocabulary, no
sentence), fragments (menu and link lines), cookie and subscribe boilerplate.

    .venv/bin/python benchmarks/curate_keeps_real.py                       # quality + language, the defaults
    .venv/bin/python benchmarks/curate_keeps_real.py --rules all           # every rule, the one-brace rule too
    .venv/bin/python benchmarks/curate_keeps_real.py --language-curve      # the language threshold's curve
    .venv/bin/python benchmarks/curate_keeps_real.py --smoke               # a small run (the test suite's)

Prints, per corpus: documents, kept share, and drops per rule (quality) and language.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import random
import sys
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from curate.language import LanguageConfig, identify  # noqa: E402
from curate.quality import DEFAULT_RULES, RULES, QualityConfig, QualityFilter  # noqa: E402

CORPORA = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpora"
LITERARY = ("austen", "mobydick", "tdavid", "mhcc", "webbible")
JUNK = ("repeated_line", "symbol_spam", "word_salad", "fragments", "boilerplate")
_BOILER = ["We use cookies to improve your experience.", "By continuing to browse, you agree to our use of cookies.",
           "Accept all cookies", "Manage preferences", "Reject non-essential cookies", "Subscribe to our newsletter",
           "Sign up for free and get the latest updates delivered to your inbox.", "Subscribe now",
           "Already a subscriber? Sign in", "Your privacy matters to us.", "Privacy Policy", "Cookie Policy",
           "Terms of Service", "Unsubscribe at any time.", "Enter your email address", "Get 50% off your first month",
           "Continue reading with a subscription", "Log in", "Create account", "Follow us on social media"]
_MENU = ["Home", "About us", "Contact", "Next page", "Previous", "Read more", "Click here", "Share", "Tweet",
         "Back to top", "Related articles", "Most popular", "Latest news", "Shop now", "Download", "FAQ", "Help",
         "Login", "Sitemap", "Careers", "Advertise", "Top stories"]


def read(name: str) -> list[dict]:
    with gzip.open(CORPORA / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def junk(kind: str, rng: random.Random, vocab: list[str], lines: list[str]) -> str:
    if kind == "repeated_line":
        line = rng.choice(lines)
        return "\n".join([rng.choice(lines) for _ in range(rng.randint(1, 4))] + [line] * rng.randint(8, 30))
    if kind == "symbol_spam":
        sym = ["$$$", "###", "***", "!!!", "%", "@", "&&", "|", "...", ">>>", "+++", "=="]
        return " ".join(rng.choice([str(rng.randint(0, 99999)), f"{rng.random() * 100:.2f}%", rng.choice(sym),
                                    rng.choice(sym) + str(rng.randint(0, 999))]) for _ in range(rng.randint(80, 400)))
    if kind == "word_salad":
        return " ".join(rng.choice(vocab) for _ in range(rng.randint(80, 500)))
    if kind == "fragments":
        return "\n".join(rng.choice(_MENU + [" ".join(rng.sample(vocab, rng.randint(1, 3)))])
                         for _ in range(rng.randint(10, 60)))
    return "\n".join(rng.sample(_BOILER, rng.randint(6, len(_BOILER))))


def corpora(smoke: bool, seed: int, n_junk: int, per_corpus: int = 0) -> dict[str, tuple[list[str], str | None]]:
    """name -> (texts, language to keep)."""
    rng = random.Random(seed)
    out: dict[str, tuple[list[str], str | None]] = {}
    tech = read("tech")
    by_source = collections.defaultdict(list)
    for d in tech:
        by_source[d["source"]].append(d["text"])
    for src, texts in sorted(by_source.items()):
        out[f"tech/{src}"] = (texts, "en")
    by_lang = collections.defaultdict(list)
    for d in read("multilang"):
        by_lang[d["lang"]].append(d["text"])
    for lang, texts in sorted(by_lang.items()):
        out[f"multilang/{lang}"] = (texts, lang)
    for name in (*LITERARY, "gcide"):
        out[name] = ([d["text"] for d in read(name)], "en")
    if smoke:
        out = {k: v for k, v in out.items() if k in ("tech/manpages", "tech/postgresql-doc-15", "multilang/de",
                                                      "austen")}
        per_corpus = per_corpus or 20
    if per_corpus:
        out = {k: (rng.sample(v, min(len(v), per_corpus)), lang) for k, (v, lang) in out.items()}
    words = sorted({w for t in by_source["manpages"][:300] for w in t.split() if w.isalpha() and len(w) > 2})
    lines = [ln.strip() for t in by_source["git-doc"][:100] for ln in t.split("\n") if len(ln.split()) > 6]
    for kind in JUNK:
        out[f"junk/{kind}"] = ([junk(kind, rng, words, lines) for _ in range(n_junk)], "en")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rules", default="default", help="default | all | RULE,...")
    ap.add_argument("--no-language", action="store_true", help="quality only")
    ap.add_argument("--language-threshold", type=float, default=LanguageConfig.threshold)
    ap.add_argument("--language-curve", action="store_true",
                    help="instead: per threshold, the share of each language's documents kept by its own setting "
                         "and the share of other-language documents let through (multilang + tech English)")
    ap.add_argument("--junk", type=int, default=100, help="planted documents of each junk kind")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--per-corpus", type=int, default=0, help="at most this many documents of each corpus "
                    "(a seeded sample; 0: all)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if not CORPORA.is_dir():
        raise SystemExit(f"needs the shared corpora at {CORPORA}")
    data = corpora(args.smoke, args.seed, 10 if args.smoke else args.junk, args.per_corpus)
    print(f"# load {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if args.language_curve:
        return language_curve(data)
    rules = DEFAULT_RULES if args.rules == "default" else RULES if args.rules == "all" else tuple(
        args.rules.split(","))
    filters: dict[str, QualityFilter] = {}
    print(f"# quality rules: {', '.join(rules)}; language threshold "
          f"{'off' if args.no_language else args.language_threshold}")
    print("| corpus | documents | kept | kept % | drops by reason |")
    print("|---|---|---|---|---|")
    for name, (texts, lang) in data.items():
        reasons: collections.Counter[str] = collections.Counter()
        dropped = set()
        if not args.no_language and lang:
            for i, t in enumerate(texts):
                got, p = identify(t)
                if got != lang or p < args.language_threshold:
                    reasons["language"] += 1
                    dropped.add(i)
        keep_idx = [i for i in range(len(texts)) if i not in dropped]
        table = pa.table({"id": pa.array([str(i) for i in keep_idx], pa.string()),
                          "text": pa.array([texts[i] for i in keep_idx], pa.string())})
        lg = lang or "en"
        if lg not in filters:  # each language's stop words, as the build sets them from --languages
            filters[lg] = QualityFilter(QualityConfig(rules=rules, stop_word_languages=(lg,)))
        res = filters[lg](table)
        for r in res.dropped["reason"].to_pylist():
            reasons[r.removeprefix("quality:")] += 1
        n_drop = sum(reasons.values())
        kept = len(texts) - n_drop
        top = ", ".join(f"{r} {c}" for r, c in reasons.most_common(5))
        print(f"| {name} | {len(texts)} | {kept} | {100 * kept / len(texts):.1f} | {top} |")
        sys.stdout.flush()


def language_curve(data: dict[str, tuple[list[str], str | None]]) -> None:
    """Per threshold: recall (own language kept) per language, and how many documents of another language each
    setting would let through (precision's complement), on multilang and tech English."""
    scored = {}
    for name, (texts, lang) in data.items():
        if name.startswith(("multilang/", "tech/")):
            scored[name] = (lang, [identify(t) for t in texts])
    langs = sorted({lang for lang, _ in scored.values()})
    print("| threshold | " + " | ".join(f"{lg} kept" for lg in langs) + " | tech en kept | other-language let in |")
    print("|---|" + "---|" * (len(langs) + 2))
    for th in (0.3, 0.4, 0.5, 0.6, 0.65, 0.7, 0.8, 0.9):
        cells, wrong = [], 0
        for lg in langs:
            mine = [(got, p) for name, (lang, s) in scored.items() if name.startswith("multilang/") and lang == lg
                    for got, p in s]
            cells.append(f"{100 * sum(g == lg and p >= th for g, p in mine) / max(1, len(mine)):.1f}")
            wrong += sum(g == lg and p >= th for name, (lang, s) in scored.items() if lang != lg for g, p in s)
        tech = [x for name, (lang, s) in scored.items() if name.startswith("tech/") for x in s]
        cells.append(f"{100 * sum(g == 'en' and p >= th for g, p in tech) / max(1, len(tech)):.1f}")
        print(f"| {th} | " + " | ".join(cells) + f" | {wrong} |")


if __name__ == "__main__":
    main()
