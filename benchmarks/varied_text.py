"""Text past the shared corpora's size that grows its vocabulary as real text does, for the build benchmarks: never
the same text repeated (a repeated corpus meets the tokenizer's word table warm, and flatters it).

Heaps' law: the distinct words V of the first n words of real text grow as V = K * n**beta (beta ~0.5-0.7). It is
fitted on the corpus itself (``fit``: least squares in log-log over prefixes of the corpus, in its file order), and
copy k of the corpus (k = 1, 2, ...: the text at word positions [k*N, (k+1)*N), N the corpus's words) gets the new
words the law predicts there, V((k+1)N) - V(kN) with V anchored at the corpus's own V(N): that many of the corpus's
rarest words (the ones real text keeps meeting for the first time) are replaced throughout the copy by new words of
their own (``mutate``: two inner letters swapped, or a letter added; seeded by k and the word, so a copy is the
same every run and no two copies share them). ``build_throughput.py`` also shuffles each copy's sentences.

    fit = Heaps.of(texts)                     # K, beta, the corpus's words and distinct words, each word's count
    table = fit.renames(k)                    # {word: its new form in copy k}
    varied = substitute(text, table)
"""
from __future__ import annotations

import dataclasses
import functools
import math
import random
import re
from collections import Counter
from collections.abc import Iterable

WORD = re.compile(r"\w+")


@dataclasses.dataclass(frozen=True)
class Heaps:
    k: float
    """K of V = K * n**beta (the least-squares fit)."""
    beta: float
    """beta of V = K * n**beta."""
    words: int
    """Words (``\\w+`` runs) in the corpus: N."""
    distinct: int
    """Distinct words in the corpus: V(N)."""
    counts: Counter
    """Each word's count in the corpus."""

    @classmethod
    def of(cls, texts: Iterable[str], points: int = 24) -> Heaps:
        counts: Counter = Counter()
        curve: list[tuple[int, int]] = []
        n, next_at = 0, 1000
        for text in texts:
            words = WORD.findall(text)
            counts.update(words)
            n += len(words)
            if n >= next_at:
                curve.append((n, len(counts)))
                next_at = int(next_at * 1.5)
        curve.append((n, len(counts)))
        xs = [math.log(a) for a, _ in curve]
        ys = [math.log(b) for _, b in curve]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / max(
            1e-12, sum((x - mx) ** 2 for x in xs))
        return cls(math.exp(my - beta * mx), beta, n, len(counts), counts)

    def new_words(self, copy: int) -> int:
        """How many words never seen before the law predicts in copy ``copy`` (word positions [copy*N, (copy+1)*N)),
        anchored at the corpus's own V(N)."""
        def v(n: float) -> float:
            return self.distinct * (n / self.words) ** self.beta
        return round(v((copy + 1) * self.words) - v(copy * self.words))

    def renames(self, copy: int) -> dict[str, str]:
        """{word: new word} for copy ``copy``: its ``new_words(copy)`` rarest words (ties in a seeded order), each
        given a form that is neither a word of the corpus nor a new form of an earlier copy."""
        if copy == 0:
            return {}
        tables, used = self._tables
        while len(tables) <= copy:
            k = len(tables)
            by_count = self._by_count
            m = self.new_words(k)
            edge = by_count[m - 1][1] if m else 0
            rare = [w for w, c in by_count[:m] if c < edge]
            tied = [w for w, c in by_count if c == edge]
            random.Random(k).shuffle(tied)
            rare += tied[:m - len(rare)]
            table: dict[str, str] = {}
            for w in rare:
                for attempt in range(8):
                    new = mutate(w, f"{k}.{attempt}")
                    if new not in self.counts and new not in used:
                        break
                else:
                    new = f"{w}{k}x{len(used)}"
                used.add(new)
                table[w] = new
            tables.append(table)
        return tables[copy]

    @functools.cached_property
    def _by_count(self) -> list[tuple[str, int]]:
        return sorted(self.counts.items(), key=lambda kv: kv[1])

    @functools.cached_property
    def _tables(self) -> tuple[list[dict[str, str]], set[str]]:
        return [{}], set()


def mutate(word: str, copy: int | str) -> str:
    """A new word like ``word`` (same letters, a typo's distance): two adjacent inner letters swapped, or (short or
    uniform words) one of its letters added; seeded by (copy, word)."""
    r = random.Random(f"{copy}:{word}")
    chars = list(word)
    if len(chars) >= 4:
        for _ in range(4):
            i = r.randrange(1, len(chars) - 2)
            if chars[i] != chars[i + 1]:
                chars[i], chars[i + 1] = chars[i + 1], chars[i]
                return "".join(chars)
    i = r.randrange(0, len(chars) + 1)
    return "".join(chars[:i] + [r.choice(word)] + chars[i:])


def substitute(text: str, table: dict[str, str]) -> str:
    """``text`` with each word in ``table`` replaced by its new form."""
    if not table:
        return text
    return WORD.sub(lambda m: table.get(m.group(0), m.group(0)), text)
