"""Extractive QA (SQuAD v1.1 style): sliding windows over the passage, and the best span mapped back to the text.

Follows the reference ``run_squad.py``: each window is ``[CLS] question [SEP] passage piece [SEP]``; windows start
``doc_stride`` tokens apart; a training answer outside a window points at [CLS] (position 0); at prediction time a
span may only *start* in a window where its start token has its "maximum context" (the window where it sits
farthest from an edge), spans are limited to ``max_answer_length`` tokens, and the best-scoring (start + end logit)
span over all windows of a question wins. Passage tokens carry character offsets into the original passage (the
normaliser's lowercasing and accent stripping are undone by ``tokenizers``' alignments), so the answer is an exact
slice of the original text.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from finetuning.examples import QAExample
from finetuning.features import Features, TaskTokenizer, pack

log = logging.getLogger(__name__)


@dataclass
class QAWindows:
    """Per window: which example, where its passage piece starts (token index into the passage and position in
    the sequence), its length, and which of its passage tokens have their maximum context here."""

    example_index: np.ndarray
    """Per window, the index of its example."""
    token_start: np.ndarray
    """Per window, the index (into its passage's tokens) of its first passage token."""
    seq_offset: np.ndarray
    """Per window, the sequence position of its first passage token, after [CLS] question [SEP]."""
    length: np.ndarray
    """Per window, how many passage tokens it holds."""
    max_context: list[np.ndarray]
    """Per window, a flag per passage token: True where this window gives the token its maximum context, the only
    window where a predicted answer may start there (the reference's rule)."""
    offsets: list[np.ndarray] = field(default_factory=list)
    """Per example, the character (start, end) of each passage token in the original passage."""


def answer_token_span(offsets: np.ndarray, char_start: int, char_end: int) -> tuple[int, int] | None:
    """First and last passage token overlapping [char_start, char_end), or None when no token does."""
    if len(offsets) == 0:
        return None
    overlap = (offsets[:, 1] > char_start) & (offsets[:, 0] < char_end)
    hit = np.flatnonzero(overlap)
    if len(hit) == 0:
        return None
    return int(hit[0]), int(hit[-1])


def window_starts(n_tokens: int, max_len: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over a passage of ``n_tokens`` pieces, as the reference slides them."""
    spans, start = [], 0
    while True:
        length = min(max_len, n_tokens - start)
        spans.append((start, length))
        if start + length >= n_tokens:
            return spans
        start += min(length, doc_stride)


def max_context_flags(spans: list[tuple[int, int]]) -> list[np.ndarray]:
    """The reference's ``_check_is_max_context`` for every token of every window, vectorised per passage."""
    n = max((s + length for s, length in spans), default=0)
    best_score = np.full(n, -np.inf)
    best_window = np.full(n, -1)
    for w, (s, length) in enumerate(spans):
        pos = np.arange(s, s + length)
        score = np.minimum(pos - s, s + length - 1 - pos) + 0.01 * length
        better = score > best_score[pos]
        best_score[pos[better]] = score[better]
        best_window[pos[better]] = w
    return [best_window[s : s + length] == w for w, (s, length) in enumerate(spans)]


def qa_features(examples: list[QAExample], tokenizer: TaskTokenizer, max_seq_length: int = 384,
                doc_stride: int = 128, max_query_length: int = 64, training: bool = True) -> tuple[Features, QAWindows]:
    """Windows for every example. Training drops examples whose answer text is not at ``answer_start``."""
    if doc_stride <= 0:
        raise ValueError(f"doc_stride must be positive, got {doc_stride}")
    input_ids, types, starts, ends = [], [], [], []
    ex_idx, tok_start, seq_off, lengths, maxctx, all_offsets = [], [], [], [], [], []
    questions = tokenizer.encode([e.question for e in examples])
    contexts = tokenizer.tok.encode_batch([e.context for e in examples], add_special_tokens=False)
    dropped = 0
    for i, (ex, q, ctx) in enumerate(zip(examples, questions, contexts, strict=False)):
        q = q[:max_query_length]
        offsets = np.asarray(ctx.offsets, dtype=np.int64).reshape(-1, 2)
        all_offsets.append(offsets)
        span = None
        if training:
            a_start, a_text = ex.answers[0]
            if ex.context[a_start : a_start + len(a_text)] != a_text or not a_text:
                dropped += 1
                continue
            span = answer_token_span(offsets, a_start, a_start + len(a_text))
            if span is None:
                dropped += 1
                continue
        max_ctx = max_seq_length - len(q) - 3
        if max_ctx <= 0:
            raise ValueError(f"max_seq_length={max_seq_length} leaves no room for the passage after a "
                             f"{len(q)}-piece question; raise it or lower max_query_length")
        spans = window_starts(len(ctx.ids), max_ctx, doc_stride)
        for (s, length), flags in zip(spans, max_context_flags(spans), strict=False):
            ids, tt = pack(tokenizer.cls_id, tokenizer.sep_id, q, ctx.ids[s : s + length])
            off = len(q) + 2
            input_ids.append(np.asarray(ids, dtype=np.int32))
            types.append(np.asarray(tt, dtype=np.int8))
            ex_idx.append(i)
            tok_start.append(s)
            seq_off.append(off)
            lengths.append(length)
            maxctx.append(flags)
            if span is not None and s <= span[0] and span[1] < s + length:
                starts.append(span[0] - s + off)
                ends.append(span[1] - s + off)
            else:
                starts.append(0)  # the answer is not in this window: point at [CLS], as the reference does
                ends.append(0)
    if dropped:
        log.warning("dropped %d of %d QA training examples whose answer_text is not found at answer_start",
                    dropped, len(examples))
    feats = Features(input_ids, types, None, np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64))
    windows = QAWindows(np.asarray(ex_idx), np.asarray(tok_start), np.asarray(seq_off), np.asarray(lengths), maxctx,
                        all_offsets)
    return feats, windows


def best_answers(examples: list[QAExample], windows: QAWindows, start_logits: list[np.ndarray],
                 end_logits: list[np.ndarray], max_answer_length: int = 30, n_best: int = 20) -> list[str]:
    """The best span of each example over all its windows, as a slice of the original passage ("" if none)."""
    best: dict[int, tuple[float, int, int]] = {}
    for w in range(len(windows.example_index)):
        i = int(windows.example_index[w])
        off, length = int(windows.seq_offset[w]), int(windows.length[w])
        if length == 0:
            continue
        s_log = np.asarray(start_logits[w][off : off + length], dtype=np.float64)
        e_log = np.asarray(end_logits[w][off : off + length], dtype=np.float64)
        k = min(n_best, length)
        cand_s = np.argsort(-s_log, kind="stable")[:k]
        cand_e = np.argsort(-e_log, kind="stable")[:k]
        flags = windows.max_context[w]
        for s in cand_s:
            if not flags[s]:
                continue
            for e in cand_e:
                if e < s or e - s + 1 > max_answer_length:
                    continue
                score = s_log[s] + e_log[e]
                if i not in best or score > best[i][0]:
                    t0 = int(windows.token_start[w])
                    best[i] = (score, t0 + int(s), t0 + int(e))
    answers = []
    for i, ex in enumerate(examples):
        if i not in best:
            answers.append("")
            continue
        _, s, e = best[i]
        offsets = windows.offsets[i]
        answers.append(ex.context[int(offsets[s, 0]) : int(offsets[e, 1])])
    return answers
