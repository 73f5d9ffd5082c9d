"""The build's two extension points for curation (docs/architecture.md, "To add a filter", "A global step"), each
exercised by a small stand-in run through the real driver: a document filter in the read pass, and a global step
between the read pass and the pool. Either must give what a build of the kept documents alone gives, byte for byte,
and count what it removed by its reason."""
from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

import pipeline
import pipeline.driver
import pipeline.read
from corpus.create_instances import InstanceConfig
from pipeline import BuildConfig, build
from pipeline.drops import LeftOut, leave_out, write_drop_list
from pipeline.executor import Stage
from pipeline.markers import Marker, marker, write_marker
from pipeline.work import StepContext, read_table

WORDS = "apple river house music water garden silver winter doctor castle forest engine".split()


def _corpus(path, ids) -> str:
    """Records with their own ids: the same documents whatever else the file holds."""
    with open(path, "w") as f:
        for i in ids:
            w = WORDS[i % len(WORDS)]
            f.write(json.dumps({"id": f"doc-{i}", "text": " ".join(f"A {w} saw {i} ships on day {j}."
                                                                   for j in range(8))}) + "\n")
    return str(path)


def _cfg(tmp_path, corpus, name, sample_dir):
    return BuildConfig(inputs=(corpus,), output=str(tmp_path / name), dupe_factor=2, num_shards=2, pool_tokens=2000,
                       vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"),
                       instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10))


def _bytes(m):
    return [open(s.url, "rb").read() for s in m.shards]


def _unwanted(doc_id: str) -> bool:
    return int(doc_id.split("-")[1]) % 3 == 0


@dataclasses.dataclass(frozen=True)
class DropEveryThird:
    """A filter of the read pass: drops the documents whose number is a multiple of 3, reporting them."""

    def __call__(self, batch: pa.Table) -> pa.Table:
        ids = batch.column("id").to_pylist()
        drop = np.array([i is not None and _unwanted(i) for i in ids])
        units = batch.column("unit").to_pylist()
        counts = Counter(u for u, d in zip(units, drop, strict=False) if d)
        kept = batch.filter(pa.array(~drop))
        report = pa.table({"unit": list(counts), "ord": [-1] * len(counts), "id": pa.nulls(len(counts), pa.string()),
                           "lines": pa.nulls(len(counts), pa.list_(pa.string())),
                           "report": [json.dumps({"dropped": {"every_third": n}}) for n in counts.values()]})
        return pa.concat_tables([kept, report.cast(kept.schema)])


@marker("every_third")
class DropMarker(Marker):
    file: str
    documents: int
    sentences: int
    tokens: int

    @property
    def key(self) -> str:
        return self.file.rsplit("/", 1)[-1].removesuffix(".arrow")


@dataclasses.dataclass(frozen=True)
class DropStep:
    """A global step's item: one file of tokenized documents -> its drop list, then its marker."""

    ctx: StepContext

    def __call__(self, docs_file: str) -> DropMarker:
        table = read_table(docs_file, self.ctx)
        ids = [i for i in table.column("doc_id").to_pylist() if _unwanted(i)]
        gone = table.filter(pa.array([_unwanted(i) for i in table.column("doc_id").to_pylist()]))
        sentences = gone.column("sentences").to_pylist()
        write_drop_list(docs_file, ids, ["every_third"] * len(ids), self.ctx)
        marker = DropMarker(docs_file, len(ids), sum(len(s) for s in sentences),
                            sum(len(x) for s in sentences for x in s))
        write_marker(self.ctx.work, marker)
        return marker


def every_third_stage(s) -> Stage:
    def after(st):
        markers = st.markers["every_third"]
        left = LeftOut(documents=sum(m.documents for m in markers), sentences=sum(m.sentences for m in markers),
                       tokens=sum(m.tokens for m in markers), reasons=Counter(
                           {"every_third": sum(m.documents for m in markers)}))
        return leave_out(st, [m.file for m in markers if m.documents], left)
    return Stage("every_third", DropStep(s.ctx), {f.rsplit("/", 1)[-1].removesuffix(".arrow"): f
                                                  for f in s.doc_files}, DropMarker, after=after)


@pytest.fixture
def kept_build(tmp_path, sample_dir):
    """The build of the kept documents alone: what either extension must give."""
    return build(_cfg(tmp_path, _corpus(tmp_path / "kept.jsonl", [i for i in range(60) if i % 3]), "kept",
                      sample_dir))


def test_a_filter_in_the_read_pass_drops_documents_before_they_are_tokenized(tmp_path, sample_dir, monkeypatch,
                                                                             kept_build):
    monkeypatch.setattr(pipeline.read, "DOC_FILTERS", (lambda s: DropEveryThird(),))
    m = build(_cfg(tmp_path, _corpus(tmp_path / "all.jsonl", range(60)), "filtered", sample_dir))
    assert _bytes(m) == _bytes(kept_build) and m.dropped == {"every_third": 20}
    assert dataclasses.replace(m.totals, dropped=()) == dataclasses.replace(kept_build.totals, dropped=())
    assert m.tokens_per_document_histogram == kept_build.tokens_per_document_histogram


def test_a_global_step_leaves_documents_out_of_the_pool_and_the_instances(tmp_path, sample_dir, monkeypatch,
                                                                          kept_build):
    stages = list(pipeline.STAGES)
    stages.insert(stages.index(pipeline.read.read_stage) + 1, every_third_stage)
    monkeypatch.setattr(pipeline.driver, "STAGES", tuple(stages))  # the list the driver walks
    m = build(_cfg(tmp_path, _corpus(tmp_path / "all.jsonl", range(60)), "stepped", sample_dir))
    assert _bytes(m) == _bytes(kept_build) and m.dropped == {"every_third": 20}
    assert dataclasses.replace(m.totals, dropped=(), unk_tokens=0) == dataclasses.replace(kept_build.totals,
                                                                                          dropped=())
    assert dict(m.random_pool) == dict(kept_build.random_pool)  # the pool is drawn from what remains
