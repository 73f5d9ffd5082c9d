"""Decontamination against the shared fine-tuning tasks: planted evaluation sentences are found (drop and cut),
clean text stays, and the evaluation files are read in the formats fine-tuning reads."""
from __future__ import annotations

import csv
import gzip
import json
import random

import pyarrow as pa
import pytest
from _curate_docs import TASKS, need_shared, passages, table

from corpus.sentences import split_sentences
from curate.decontaminate import Decontaminate, DecontaminationConfig, build_index
from curate.eval_sets import eval_texts
from curate.words import words

CFG = DecontaminationConfig(paths=(str(TASKS),))


def _task_texts(name: str, field: str, n: int, seed: int, min_words: int = 13) -> list[str]:
    with gzip.open(TASKS / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    texts = [" ".join(r[field]) if isinstance(r[field], list) else r[field] for r in rows]
    counts = words(texts).offsets
    texts = [t for t, a, b in zip(texts, counts[:-1], counts[1:], strict=False) if b - a >= min_words]
    return random.Random(seed).sample(texts, n)


@pytest.fixture(scope="module")
def index():
    need_shared()
    return build_index(eval_texts(CFG.paths), CFG)


@pytest.fixture(scope="module")
def planted():
    """400 passages of Moby Dick and Austen; into 100 of them (those with a sentence break after their first third),
    an evaluation text of each of the five tasks (20 each) between two of their sentences."""
    docs = passages(["mobydick", "austen"], n_words=150, per_corpus=200)
    evals = (_task_texts("rt_sentiment", "text", 20, 1) + _task_texts("wordnet_wic", "sentence1", 20, 2, 8)
             + _task_texts("wordnet_span_qa", "context", 20, 3, 8) + _task_texts("wordnet_lexname", "text", 20, 4)
             + _task_texts("wnut16_ner", "tokens", 20, 5))
    rng = random.Random(0)
    out, planted_ids = [], {}
    for i, (doc_id, text, src) in enumerate(docs):
        cut = text.find(". ", len(text) // 3) + 2
        if i % 4 == 0 and i // 4 < len(evals) and cut > 1:
            ev = evals[i // 4][0].upper() + evals[i // 4][1:]  # a sentence of its own for the splitter
            text = f"{text[:cut]}{ev}. {text[cut:]}"
            planted_ids[doc_id] = ev
        out.append((doc_id, text, src))
    rng.shuffle(out)
    return table(out), planted_ids


def test_the_index_reads_every_task_file(index):
    assert sorted(f.rsplit("/", 1)[-1] for f in index.files) == sorted(p.name for p in TASKS.glob("*.jsonl.gz"))
    assert index.size > 300_000 and set(index.grams) >= {13, 8, 12}
    assert index.too_short > 0 and index.texts > 600_000  # a 3-word gloss is too short to check; it is counted


def test_every_planted_evaluation_text_drops_its_document(index, planted):
    t, planted_ids = planted
    assert len(planted_ids) >= 90
    out = Decontaminate(index, CFG)(t)
    dropped = dict(zip(out.dropped["id"].to_pylist(), out.dropped["detail"].to_pylist(), strict=False))
    assert set(planted_ids) <= set(dropped)
    clean_dropped = set(dropped) - set(planted_ids)
    assert len(clean_dropped) <= 2, {d: dropped[d] for d in clean_dropped}  # real overlaps, hand-checked below
    assert set(out.dropped["reason"].to_pylist()) == {"contaminated"}
    assert any("rt_sentiment" in dropped[d] for d in planted_ids) and any("wnut16" in dropped[d] for d in planted_ids)


def test_cut_removes_the_planted_sentence_and_keeps_the_rest(index, planted):
    t, planted_ids = planted
    cfg = DecontaminationConfig(paths=CFG.paths, mode="cut")
    out = Decontaminate(index, cfg)(t)
    kept = dict(zip(out.kept["id"].to_pylist(), out.kept["text"].to_pylist(), strict=False))
    before = dict(zip(t["id"].to_pylist(), t["text"].to_pylist(), strict=False))
    edited = dict(zip(out.edited["id"].to_pylist(), out.edited["detail"].to_pylist(), strict=False))
    assert set(planted_ids) <= set(edited) and not len(out.dropped)
    for doc_id, ev in planted_ids.items():
        assert ev not in kept[doc_id]
        # only the planted text's sentences go (a tweet may be several), the passage's others stay
        cut, _, total = edited[doc_id].split(":")[0].removeprefix("cut ").removesuffix(" sentences").partition(" of ")
        assert 1 <= int(cut) <= len(split_sentences(ev + ".")) and int(total) > int(cut), edited[doc_id]
        stays = [s for s in split_sentences(before[doc_id]) if not set(s.split()) & set(ev.split())]
        assert all(s in kept[doc_id] for s in stays)
    untouched = [i for i in kept if i not in edited]
    assert all(kept[i] == before[i] for i in untouched)


def test_a_real_overlap_melville_quoted_by_wordnet(index):
    """WordNet's example for "beneath" quotes Moby Dick chapter 111 ("The Pacific"): a genuine leak of an
    evaluation text (wordnet_span_qa) into a pre-training corpus, found by its 13-grams."""
    from _curate_docs import corpus

    doc = next(d for d in corpus("mobydick") if d["id"] == "mobydick:111")
    out = Decontaminate(index, CFG)(pa.table({"id": [doc["id"]], "text": [doc["text"]]}))
    assert out.dropped["detail"].to_pylist()[0].endswith("wordnet_span_qa.jsonl.gz")


def test_csv_tsv_and_jsonl_files_with_named_fields(tmp_path):
    sentence = "the quick brown fox jumped over the lazy dog near the old mill on sunday"
    short = "a lazy dog on a quiet sunday by the mill"  # 10 words: matched whole
    with open(tmp_path / "dev.csv", "w", newline="") as f:
        csv.writer(f).writerows([["sentence", "label"], [sentence, "1"]])
    with open(tmp_path / "test.tsv", "w", newline="") as f:
        csv.writer(f, delimiter="\t").writerows([["text", "label"], [short, "0"]])
    with open(tmp_path / "qa.jsonl", "w") as f:
        f.write(json.dumps({"question": "what did the fox do", "label": "x"}) + "\n")
    cfg = DecontaminationConfig(paths=(str(tmp_path),))
    idx = build_index(eval_texts(cfg.paths), cfg)
    assert len(idx.files) == 3 and idx.texts == 6 and set(idx.grams) == {13, 10}
    docs = pa.table({"id": ["hit13", "hit10", "near", "clean"],
                     "text": [f"Intro. {sentence.upper()}! Outro.", f"Once: {short}.", sentence.replace("fox", "cat"),
                              "Nothing to see here at all, really nothing at all today."]})
    out = Decontaminate(idx, cfg)(docs)
    assert sorted(out.dropped["id"].to_pylist()) == ["hit10", "hit13"]  # case and punctuation do not hide a copy
    with pytest.raises(ValueError, match="no record has a field passage"):
        list(eval_texts([str(tmp_path / "dev.csv")], fields=("passage",)))
    assert [t for _, t in eval_texts([str(tmp_path / "dev.csv")], fields=("sentence",))] == [sentence]


def test_config_mistakes_say_the_fix():
    with pytest.raises(ValueError, match="--decontaminate-mode 'remove'"):
        DecontaminationConfig(paths=("x",), mode="remove")
    with pytest.raises(ValueError, match="--decontaminate-ngram 3"):
        DecontaminationConfig(ngram=3)


def test_a_drop_names_the_evaluation_example_and_the_matched_words(tmp_path):
    """The report line says which evaluation file, which example (its id field, else its line) and quotes the
    document's matched words, bounded."""
    ev = tmp_path / "dev.jsonl"
    ev.write_text(json.dumps({"id": "q-17", "text": "the quick brown fox jumps over the lazy dog near the river "
                                                    "bank today"}) + "\n"
                  + json.dumps({"text": "a completely different sentence about harbours and lanterns that is long"})
                  + "\n")
    cfg = DecontaminationConfig(paths=(str(ev),))
    idx = build_index(eval_texts(cfg.paths, examples=True), cfg)
    docs = pa.table({"id": ["a", "b", "c"], "text": [
        "Intro words here. The QUICK brown fox -- jumps over the lazy dog, near the river bank today! And more.",
        "Nothing to see in this one at all, a clean passage of text.",
        "Start. A completely different sentence about harbours and lanterns that is long. End."]})
    out = Decontaminate(idx, cfg)(docs)
    detail = dict(zip(out.dropped["id"].to_pylist(), out.dropped["detail"].to_pylist(), strict=True))
    assert set(detail) == {"a", "c"}
    # 14 words: two 13-grams matched; the first is quoted as the document has it (lower case, its own punctuation)
    assert detail["a"] == (f'2 n-grams of {ev}; id q-17: "the quick brown fox -- jumps over the lazy dog, near the '
                           f'river bank"'), detail["a"]
    assert detail["c"].endswith('; record 2: "a completely different sentence about harbours and lanterns that is '
                                'long"'), detail["c"]
    # bounded: a match of long words (13 of 20 characters) is quoted up to QUOTE_CHARS
    from curate.decontaminate import QUOTE_CHARS
    long_text = " ".join(f"word{i:016d}" for i in range(200))
    ev.write_text(json.dumps({"text": long_text}) + "\n")
    idx = build_index(eval_texts(cfg.paths, examples=True), cfg)
    out = Decontaminate(idx, cfg)(pa.table({"id": ["x"], "text": [long_text]}))
    quote = out.dropped["detail"][0].as_py().split(': "', 1)[1]
    assert len(quote) <= QUOTE_CHARS + 1 and quote.startswith("word") and "…" in quote
