"""A synthetic JSON Lines corpus for build tests: document i repeats one of twelve words in `sentences` sentences."""
from __future__ import annotations

import json

WORDS = "apple river house music water garden silver winter doctor castle forest engine".split()


def ships_corpus(path, n_docs: int, sentences: int) -> str:
    with open(path, "w") as f:
        for i in range(n_docs):
            w = WORDS[i % len(WORDS)]
            f.write(json.dumps({"text": " ".join(f"A {w} saw {i} ships on day {j}." for j in range(sentences))}) + "\n")
    return str(path)
