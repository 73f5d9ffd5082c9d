"""tracking.build_report on a real build's manifest: every figure is a PNG of the expected size, the metrics are the
manifest's statistics, and the new histograms add up to the manifest's totals."""
from __future__ import annotations

import io
import threading

from PIL import Image

from corpus.schema import read_manifest
from tracking.build_report import FIGURES, figures, metrics


def test_figures_are_pngs_and_the_histograms_add_up(tiny_pretrain_data):
    m = read_manifest(tiny_pretrain_data["train"])
    t = m.totals
    assert sum(n for _, n in m.tokens_per_document_histogram) == t.documents
    assert all(k & (k - 1) == 0 for k, _ in m.tokens_per_document_histogram)  # powers of two
    assert sum(n for _, n in m.masked_per_seq_histogram) == t.instances
    assert sum(k * n for k, n in m.masked_per_seq_histogram) == t.masked_lm_positions
    assert max(k for k, _ in m.masked_per_seq_histogram) <= m.max_predictions

    figs = figures(m, "train")
    assert list(figs) == list(FIGURES)
    for name, png in figs.items():
        img = Image.open(io.BytesIO(png))
        assert img.format == "PNG" and img.size == (700, 340), name
        assert len(set(img.convert("L").getdata())) > 2, f"{name} is blank"


def test_figures_drawn_in_threads_at_once_are_the_same(tiny_pretrain_data):
    """The job draws them in a background thread: no pyplot state shared between figures."""
    m = read_manifest(tiny_pretrain_data["train"])
    alone = figures(m, "train")
    got: list[dict[str, bytes]] = []
    threads = [threading.Thread(target=lambda: got.append(figures(m, "train"))) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert got == [alone] * 3


def test_metrics_are_the_manifests_statistics(tiny_pretrain_data):
    m = read_manifest(tiny_pretrain_data["train"])
    t = m.totals
    got = metrics(m)
    assert got["instances"] == t.instances and got["shards"] == len(m.shards)
    assert got["random_next_fraction"] == t.random_next / t.instances
    assert got["masked_per_sequence_mean"] == t.masked_lm_positions / t.instances
    assert got["unk_fraction"] == t.unk_tokens / t.tokens
    seq = dict(m.seq_len_histogram)
    assert got["full_length_fraction"] == seq.get(m.max_seq_length, 0) / t.instances
    assert got["vocab_size"] == m.vocab.size == 600
