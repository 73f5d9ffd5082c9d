"""Curation through jobs/build_dataset.py, as a user runs it: check curate-dedup (planted exact and near copies of
held-out passages: >= 95% of the planted pairs keep exactly one, >= 99% of the other passages stay, the manifest's
counts are the report's lines, the MLflow run shows them and holds the report), decontamination, language ID and
--mix through the job's flags, and the mistakes the job refuses at its start in one line, before Ray or MLflow."""
from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path

import pytest
from test_build_mistakes import one_error_line, run_job

from jobs import build_dataset

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"
TASKS = SHARED / "tasks"
VOCAB = REPO / "data" / "sample" / "reference" / "bert-base-uncased-vocab.txt"
SMALL = ["--vocab", str(VOCAB), "--max-seq-length", "64", "--max-predictions-per-seq", "10", "--dupe-factor", "1",
         "--num-shards", "2", "--no-ray", "--log-level", "WARNING"]


def passages(name: str, n_words: int, n: int) -> list[tuple[str, str]]:
    if not SHARED.is_dir():
        pytest.skip(f"needs the shared corpora at {SHARED}")
    out = []
    with gzip.open(SHARED / "corpora" / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        for doc in map(json.loads, f):
            w = doc["text"].split()
            out += [(f"{doc['id']}@{i}", " ".join(w[i:i + n_words])) for i in range(0, len(w) - n_words + 1, n_words)]
            if len(out) >= n:
                return out[:n]
    return out


def write(path: Path, docs) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs))
    return str(path)


def near_copy(text: str, rng: random.Random) -> str:
    """Two words changed far apart: ~0.9 Jaccard on 5-word shingles at 200 words."""
    w = text.split()
    third = len(w) // 3
    for j in (rng.randrange(5, third), rng.randrange(2 * third, len(w) - 5)):
        w[j] = rng.choice(["lantern", "harbour", "quietly", "seventeen", "copper"])
    return " ".join(w)


def test_check_curate_dedup_through_the_job(tmp_path, mlflow_uri, capsys):
    from mlflow.tracking import MlflowClient

    # Held out from the library's own dedup tests' choice of text: the Psalms' commentary and Austen, 200-word
    # passages, with 30 exact and 30 near copies planted, half of them into the other input file.
    docs = passages("mhcc", 200, 300) + passages("austen", 200, 300)
    rng = random.Random(11)
    chosen = rng.sample(range(len(docs)), 60)
    pairs = []
    for k, i in enumerate(chosen):
        copy = (f"copy-{k:03d}", docs[i][1] if k < 30 else near_copy(docs[i][1], rng))
        docs.append(copy)
        pairs.append((docs[i][0], copy[0]))
    rng.shuffle(docs)
    files = [write(tmp_path / "in" / "one.jsonl", docs[::2]), write(tmp_path / "in" / "two.jsonl", docs[1::2])]
    out = tmp_path / "out"
    assert build_dataset.main(["--input", str(tmp_path / "in"), "--output", str(out), "--dedup", "near",
                               "--mlflow-tracking-uri", mlflow_uri, *SMALL]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    lines = [json.loads(x) for x in open(out / "reports" / "dropped.jsonl")]
    gone = {x["id"] for x in lines}
    assert sum((a in gone) != (b in gone) for a, b in pairs) >= 0.95 * len(pairs)
    planted = {i for p in pairs for i in p}
    distinct = [i for i, _ in docs if i not in planted]
    assert sum(i not in gone for i in distinct) >= 0.99 * len(distinct)
    manifest = json.loads((out / "manifest.json").read_text())
    by_reason = dict(Counter(x["reason"] for x in lines))
    assert manifest["totals"]["dropped"] == by_reason == summary["dropped"]
    assert manifest["curation"]["reports"]["dropped"]["lines"] == len(lines)
    assert {x["source"] for x in lines} <= set(files)
    assert manifest["config"]["curate"]["dedup"]["mode"] == "near"

    client = MlflowClient(mlflow_uri)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.params["curate.dedup.mode"] == "near" and run.data.params["curate.dedup.threshold"] == "0.65"
    assert {f"dropped.{k}": float(v) for k, v in by_reason.items()}.items() <= run.data.metrics.items()
    assert run.data.metrics["curate.report_lines"] == len(lines)
    logged = client.download_artifacts(run.info.run_id, "reports/dropped.jsonl", str(tmp_path))
    assert open(logged, "rb").read() == (out / "reports" / "dropped.jsonl").read_bytes()
    assert "report/dropped.png" in [f.path for f in client.list_artifacts(run.info.run_id, "report")]


def test_decontamination_languages_and_mix_through_the_job(tmp_path, capsys):
    """docs/build-checks.md's command in a small form. Three sources: wiki (Moby Dick, 20 passages carrying an
    evaluation sentence), books (Austen, no weight) and web (the World English Bible and Vim's tutorial in 18
    languages); --dedup near --decontaminate --languages en --mix wiki=2,web=0.5."""
    with gzip.open(TASKS / "rt_sentiment.jsonl.gz", "rt", encoding="utf-8") as f:
        evals = random.Random(2).sample([r["text"] for r in map(json.loads, f) if len(r["text"].split()) >= 15], 20)
    wiki = passages("mobydick", 80, 1500)
    planted = {}
    for k, e in enumerate(evals):
        doc_id, text = wiki[k * 50]
        wiki[k * 50] = (doc_id, f"{text} {e[0].upper()}{e[1:]}")
        planted[doc_id] = e
    with gzip.open(REPO / "data" / "sample" / "other" / "vimtutor.excerpts.jsonl.gz", "rt", encoding="utf-8") as f:
        vim = [json.loads(line) for line in f]
    web = passages("webbible", 80, 1500) + [(v["id"], v["text"]) for v in vim]
    src = {name: write(tmp_path / name / "part.jsonl", docs)
           for name, docs in (("wiki", wiki), ("books", passages("austen", 80, 1500)), ("web", web))}
    out = tmp_path / "out"
    assert build_dataset.main(["--input", str(tmp_path / "wiki"), "--input", str(tmp_path / "books"),
                               "--input", str(tmp_path / "web"), "--output", str(out),
                               "--dedup", "near", "--decontaminate", str(TASKS / "rt_sentiment.jsonl.gz"),
                               "--languages", "en",
                               "--mix", f"{tmp_path / 'wiki'}=2,{tmp_path / 'web'}=0.5", "--no-mlflow", *SMALL]) == 0
    capsys.readouterr()
    lines = [json.loads(x) for x in open(out / "reports" / "dropped.jsonl")]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["totals"]["dropped"] == dict(Counter(x["reason"] for x in lines))
    assert {x["id"] for x in lines if x["reason"] == "contaminated"} == set(planted)
    other = {x["id"] for x in lines if x["reason"] == "language"} - {v["id"] for v in vim if v["lang"] != "en"}
    assert {v["id"] for v in vim if v["lang"] != "en"} <= {x["id"] for x in lines if x["reason"] == "language"}
    # 80-word pieces of English the model is unsure of (below 0.65): an all-caps stage direction of Moby Dick
    # ("AZORE SAILOR. (DANCING) Go it, Pip!"), lists of names in Numbers; a few in 4,500
    assert len(other) <= 5, other
    assert {x["source"] for x in lines if x["reason"] == "mix"} == {src["web"]}
    shares = manifest["curation"]["mix"]
    assert {s["weight"] for s in shares.values()} == {2.0, 1.0, 0.5}
    for s in shares.values():  # each source's share of the tokens made, against what its weight asks
        assert abs(s["share"] - s["asked_share"]) < 0.01, shares


@pytest.mark.parametrize("flags, needle", [
    (["--languages", "en,xx"], "--languages: the language model does not know xx"),
    (["--mix", "nowhere=2"], "--mix nowhere: no input file is nowhere or lies under it"),
    (["--decontaminate", "LABELS"], "no evaluation text of at least 8 words"),
    (["--dedup", "near", "--dedup-threshold", "0.3"], "--dedup-threshold 0.3: use a Jaccard similarity in [0.5, 1)"),
])
def test_curation_mistakes_are_one_line_before_ray_or_mlflow(tmp_path, sample_dir, flags, needle):
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps({"label": x}) + "\n" for x in ("positive", "negative")))
    flags = [str(labels) if f == "LABELS" else f for f in flags]
    line = one_error_line(run_job("--input", str(sample_dir / "corpus" / "mobydick.jsonl.gz"), "--output",
                                  str(tmp_path / "out"), "--mlflow-tracking-uri", f"sqlite:///{tmp_path}/ml.db",
                                  *flags))
    assert needle in line, line
    assert not (tmp_path / "out").exists() and not (tmp_path / "ml.db").exists()  # refused before any work
