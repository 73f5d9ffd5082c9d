"""pipeline.vocab: the vocabulary's sample is seeded, deterministic and bounded, and the same whether the text is
compressed or not (so is the vocabulary)."""
from __future__ import annotations

import gzip

from corpus.readers import ReadOptions, ReadReport, read_unit
from pipeline.executor import LocalExecutor
from pipeline.inputs.pieces import input_units
from pipeline.vocab import VocabContext, VocabItem, sample_blocks, vocab_step
from storage.fs import expand_inputs

UNIT = 64 << 10


def _corpus(root, sample_dir, compress: bool):
    """Moby Dick and Austen as JSON Lines (real text, ~5 MB), plain or gzipped."""
    root.mkdir()
    for name in ("mobydick", "austen"):
        raw = gzip.decompress((sample_dir / "corpus" / f"{name}.jsonl.gz").read_bytes())
        if compress:
            (root / f"{name}.jsonl.gz").write_bytes(gzip.compress(raw, compresslevel=1))
        else:
            (root / f"{name}.jsonl").write_bytes(raw)
    return root


def _plan(root, tmp_path, name):
    files = expand_inputs([str(root)])
    units = input_units(files, ReadOptions(), UNIT, str(tmp_path / name), LocalExecutor(), ReadReport())
    return units, {f.path: f.size for f in files}


def _docs(blocks):  # named by position (not by the records' own ids): the sample is a matter of positions
    return [(d.doc_id, d.lines) for b in blocks for u in b for d in read_unit(u, ReadOptions(id_field=""))]


def test_sample_is_seeded_bounded_and_the_same_compressed_or_not(tmp_path, sample_dir):
    plain = _corpus(tmp_path / "plain", sample_dir, compress=False)
    gz = _corpus(tmp_path / "gz", sample_dir, compress=True)
    units_p, sizes_p = _plan(plain, tmp_path, "wp")
    units_g, sizes_g = _plan(gz, tmp_path, "wg")
    assert all(u.data is None for u in units_p) and all(u.data is not None for u in units_g)
    budget = 600_000
    blocks, nbytes = sample_blocks(units_p, sizes_p, UNIT, budget, seed=12345)
    assert budget <= nbytes < budget + UNIT and len(blocks) == -(-budget // UNIT)  # bounded: one block over at most
    assert sample_blocks(units_p, sizes_p, UNIT, budget, seed=12345) == (blocks, nbytes)  # deterministic
    other, _ = sample_blocks(units_p, sizes_p, UNIT, budget, seed=7)
    assert [b[0].start for b in other] != [b[0].start for b in blocks]
    # Both books are sampled (a seeded hash order, not the corpus order), and the documents come in corpus order.
    docs = _docs(blocks)
    assert {d[0].split(":")[0] for d in docs} == {"mobydick.jsonl", "austen.jsonl"}
    assert docs == sorted(docs, key=lambda d: (d[0].split(":")[0], int(d[0].split(":")[1])))
    # The .gz files (read through their pieces) give the same blocks' documents.
    blocks_g, nbytes_g = sample_blocks(units_g, sizes_g, UNIT, budget, seed=12345)
    assert nbytes_g == nbytes and _docs(blocks_g) == docs
    # Budget 0: every block, every document once.
    everything, total = sample_blocks(units_p, sizes_p, UNIT, 0, seed=12345)
    assert total == sum(sizes_p.values()) and len(_docs(everything)) == 270 + 135
    # And the same vocabulary.
    ctx = VocabContext(ReadOptions(), vocab_size=400, min_frequency=2)
    mp = vocab_step(VocabItem(blocks, str(tmp_path / "vp.txt"), nbytes), ctx)
    mg = vocab_step(VocabItem(blocks_g, str(tmp_path / "vg.txt"), nbytes_g), ctx)
    assert (tmp_path / "vp.txt").read_bytes() == (tmp_path / "vg.txt").read_bytes()
    assert mp.sha256 == mg.sha256 and mp.vocab_size == 400 and mp.documents == len(docs)


def test_the_vocabulary_step_says_how_far_its_reading_is(tmp_path, sample_dir, monkeypatch):
    """One item for minutes on a big sample: the step reports the share of its two passes read, which the driver's
    progress line shows as MB of text with an ETA (it read '0/1 sample ... ETA --' until the end)."""
    import pipeline.vocab as vocab
    from pipeline.progress import StageProgress

    plain = _corpus(tmp_path / "plain", sample_dir, compress=False)
    units, sizes = _plan(plain, tmp_path, "w")
    blocks, nbytes = sample_blocks(units, sizes, UNIT, 600_000, seed=12345)
    out = str(tmp_path / "vocab.txt")
    seen: list[float | None] = []
    told = vocab._tell

    def tell(item, share, endpoint_url):
        told(item, share, endpoint_url)
        seen.append(vocab.read_progress(out))  # what the driver reads, as the step runs

    monkeypatch.setattr(vocab, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(vocab, "_tell", tell)
    vocab_step(VocabItem(blocks, out, nbytes), VocabContext(ReadOptions(), vocab_size=400, min_frequency=2))
    assert len(seen) > 10 and seen == sorted(seen) and 0 < seen[0] < 0.1 and 0.9 < seen[-1] < 1
    assert vocab.read_progress(out) is None  # removed once the vocabulary is written

    p = StageProgress("vocab", "sample", total=1, total_bytes=nbytes, lines=False, probe=lambda: 0.25)
    p.t0 -= 10.0
    line = p.line()
    assert f"vocab: 0/1 sample, {nbytes / 4e6:.1f}/{nbytes / 1e6:.1f} MB of text" in line and "ETA 30 s" in line
