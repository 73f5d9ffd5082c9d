"""The dataset report the build's MLflow run shows: a finished build's manifest statistics as figures (PNG bytes) and
flat metrics.

    figures(manifest, name) -> {"seq_length.png": b"...", ...}     what a person looks at in the MLflow run
    metrics(manifest) -> {"instances": 12345.0, ...}                 the same statistics as numbers

Pure functions of the manifest: no MLflow calls here (`tracking.build_run` logs what these return). Figures are drawn on
``matplotlib.figure.Figure`` with the Agg canvas, never through ``pyplot``, whose global state is not safe in the
background thread the job renders them in.
"""
from __future__ import annotations

import io

from corpus.schema import Manifest

FIGURES = ("seq_length.png", "tokens_per_document.png", "masked_per_sequence.png", "next_sentence.png",
           "dropped.png")
_SIZE = (7.0, 3.4)  # inches at 100 dpi: readable in the MLflow artifact viewer without scrolling
_BAR = "#4c72b0"
_ACCENT = "#dd8452"


def _hist(pairs: tuple[tuple[int, int], ...]) -> tuple[list[int], list[int]]:
    return [k for k, _ in pairs], [v for _, v in pairs]


def _mean(xs: list[int], ws: list[int]) -> float:
    n = sum(ws)
    return sum(x * w for x, w in zip(xs, ws, strict=False)) / n if n else 0.0


def _png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _figure(title: str):
    from matplotlib.figure import Figure

    fig = Figure(figsize=_SIZE, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    return fig, ax


def _counts_axis(axis) -> None:
    """Thousands separators on a count axis (``ax.xaxis`` or ``ax.yaxis``)."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def _log_counts(ax, ws: list[int]) -> None:
    """A log count axis: one bar (full-length sequences, the masking cap) holds most rows, the rest must show."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    ax.set_ylim(0.8, max(ws, default=1) * 2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else ""))


def _mark(ax, x: float, label: str) -> None:
    ax.axvline(x, color=_ACCENT, linestyle="--", linewidth=1)
    ax.annotate(label, (x, 1), xycoords=("data", "axes fraction"), xytext=(-4, -4), textcoords="offset points",
                color=_ACCENT, va="top", ha="right", fontsize=8)


def seq_length_figure(m: Manifest, name: str) -> bytes:
    from matplotlib.ticker import MaxNLocator

    xs, ws = _hist(m.seq_len_histogram)
    top = m.max_seq_length
    full = dict(zip(xs, ws, strict=False)).get(top, 0) / max(1, sum(ws))
    fig, ax = _figure(f"{name}: sequence length, {sum(ws):,} sequences, {full:.0%} at the maximum")
    ax.bar(xs, ws, width=1.0, color=_BAR)
    _mark(ax, top, f"--max-seq-length {top}")
    ax.set_xlim(0, top + 2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"tokens per sequence, [CLS] and [SEP]s included (mean {_mean(xs, ws):.1f})")
    ax.set_ylabel("sequences (log scale)")
    _log_counts(ax, ws)
    return _png(fig)


def tokens_per_document_figure(m: Manifest, name: str) -> bytes:
    # Bins are powers of two (lower bound as key): documents range from a line to a book.
    xs, ws = _hist(m.tokens_per_document_histogram)
    t = m.totals
    fig, ax = _figure(f"{name}: tokens per document, {t.documents:,} documents")
    ax.bar(range(len(xs)), ws, width=0.85, color=_BAR)
    ax.set_xticks(range(len(xs)), [f"{x:,}–{2 * x - 1:,}" if x > 1 else "1" for x in xs], rotation=45,
                  ha="right", fontsize=7)
    mean = t.tokens / t.documents if t.documents else 0.0
    ax.set_xlabel(f"WordPiece tokens per document (mean {mean:,.0f})")
    ax.set_ylabel("documents")
    _counts_axis(ax.yaxis)
    return _png(fig)


def masked_per_sequence_figure(m: Manifest, name: str) -> bytes:
    from matplotlib.ticker import MaxNLocator

    xs, ws = _hist(m.masked_per_seq_histogram)
    cap = m.max_predictions
    fig, ax = _figure(f"{name}: masked positions per sequence (MLM targets)")
    ax.bar(xs, ws, width=0.85, color=_BAR)
    _mark(ax, cap, f"--max-predictions-per-seq {cap}")
    ax.set_xlim(-0.5, max([cap, *xs]) + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"masked positions (mean {_mean(xs, ws):.2f}; round({m.masked_lm_prob} x length), at most "
                  f"{cap})")
    ax.set_ylabel("sequences (log scale)")
    _log_counts(ax, ws)
    return _png(fig)


def next_sentence_figure(m: Manifest, name: str) -> bytes:
    t = m.totals
    random_next = t.random_next
    actual = t.instances - random_next
    share = random_next / t.instances if t.instances else 0.0
    fig, ax = _figure(f"{name}: next-sentence labels, {share:.1%} random next")
    bars = ax.barh(["B is the actual next (0)", "B is a random next (1)"], [actual, random_next],
                   color=[_BAR, _ACCENT])
    ax.bar_label(bars, labels=[f"{actual:,}", f"{random_next:,}"], padding=3, fontsize=8)
    ax.set_xlabel("sequences (the reference script gives 55% random next on Moby Dick)")
    _counts_axis(ax.xaxis)
    return _png(fig)


def dropped_figure(m: Manifest, name: str) -> bytes:
    dropped = m.dropped
    fig, ax = _figure(f"{name}: what the build dropped, by reason")
    if not dropped:
        ax.text(0.5, 0.5, f"nothing dropped ({m.totals.documents:,} documents kept)", ha="center",
                va="center", fontsize=11, transform=ax.transAxes)
        ax.set_axis_off()
        return _png(fig)
    reasons = sorted(dropped, key=lambda r: dropped[r])
    bars = ax.barh(reasons, [dropped[r] for r in reasons], color=_ACCENT)
    ax.bar_label(bars, labels=[f"{dropped[r]:,}" for r in reasons], padding=3, fontsize=8)
    ax.set_xlabel("records (file-level reasons count files)")
    return _png(fig)


def figures(manifest: Manifest, name: str) -> dict[str, bytes]:
    """Every figure of the report as PNG bytes, by file name (``FIGURES``); ``name`` titles them."""
    draw = (seq_length_figure, tokens_per_document_figure, masked_per_sequence_figure, next_sentence_figure,
            dropped_figure)
    return {f: d(manifest, name) for f, d in zip(FIGURES, draw, strict=False)}


def metrics(manifest: Manifest) -> dict[str, float]:
    """The manifest's statistics as flat numbers (counts, fractions, means), for a tracking store."""
    t = manifest.totals
    n = t.instances
    seq_x, seq_w = _hist(manifest.seq_len_histogram)
    out: dict[str, float] = {k: float(getattr(t, k)) for k in ("documents", "sentences", "tokens", "instances",
                                                                "random_next", "masked_lm_positions", "unk_tokens")}
    out |= {
        "random_next_fraction": t.random_next / n if n else 0.0,
        "masked_per_sequence_mean": t.masked_lm_positions / n if n else 0.0,
        "seq_length_mean": _mean(seq_x, seq_w),
        "full_length_fraction": ((dict(zip(seq_x, seq_w, strict=False)).get(manifest.max_seq_length, 0) / n)
                                 if n else 0.0),
        "tokens_per_document_mean": t.tokens / t.documents if t.documents else 0.0,
        "unk_fraction": t.unk_tokens / t.tokens if t.tokens else 0.0,
        "shards": float(len(manifest.shards)),
        "vocab_size": float(manifest.vocab.size),
    }
    out |= {f"dropped.{k}": float(v) for k, v in t.dropped}
    if manifest.build_seconds is not None:
        out["build_seconds"] = manifest.build_seconds
    return out
