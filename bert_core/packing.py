"""Packed sequences: several BERT sequences laid end to end in one fixed-width row, each still exactly BERT.

At seq 512 real data leaves much of a padded batch empty; packing fills a (B, W) buffer with whole sequences
instead (NVIDIA's phase-2 packing, MosaicBERT/ModernBERT unpadding). A batch says how it is packed with
`sequence_lengths` (B, S): the lengths of the at most S sequences in each row, in order, 0 for unused places; the
rest of a row is padding. Everything else is derived on the device with static shapes (one compiled graph):

- `PackedSequences.sequence_ids` (B, W): which sequence each position belongs to, S for padding;
- `position_ids` restart at 0 at every sequence's start (learned absolute positions, per sequence);
- `starts` (B, S): each sequence's first position, its [CLS] (NSP and the pooler read it).

Attention stays inside each sequence (`packed_attention`): on CUDA with half-precision activations, torch's
FlashAttention-2 variable-length kernel (`aten._flash_attention_forward` with cumulative sequence lengths; it keeps
BERT's attention dropout and has a backward); elsewhere the reference: SDPA with a block-diagonal boolean mask (same
maths, W x W scores per row). Padding forms its own block, so its rows stay finite and never reach a real token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .dropout import attention


@dataclass(frozen=True)
class SegmentIds:
    """Which block each key (and query) row of attention belongs to: ids in [0, num_segments), non-decreasing
    along each row of `keys` (blocks are contiguous runs of positions)."""

    keys: torch.Tensor
    """(B, Tk) int64: the block of each key position."""
    num_segments: int
    """S + 1: the packed sequences and the padding block."""
    queries: torch.Tensor | None = None
    """(B, Tq) the block of each query row; None: the queries are the keys' positions."""

    def at(self, positions: torch.Tensor) -> SegmentIds:
        """The same blocks, for queries taken at `positions` (B, K) only (the last layer's [CLS] + MLM rows)."""
        return SegmentIds(self.keys, self.num_segments, self.keys.gather(1, positions))


def sequence_starts(sequence_lengths: torch.Tensor, width: int) -> torch.Tensor:
    """(B, S) lengths -> (B, S) first position of each sequence, its [CLS] (unused places clamped to width - 1)."""
    lengths = sequence_lengths.long()
    return (lengths.cumsum(1) - lengths).clamp(max=width - 1)


@dataclass(frozen=True)
class PackedSequences:
    """What the model derives from `sequence_lengths` (B, S) for rows of `width` positions."""

    sequence_ids: torch.Tensor
    """(B, W): which sequence of its row each position belongs to, S for padding."""
    position_ids: torch.Tensor
    """(B, W): restarting at 0 per sequence (BERT's learned absolute positions), 0 in padding."""
    starts: torch.Tensor
    """(B, S): each sequence's first position, its [CLS]; clamped to W - 1 for unused places (their NSP label
    must be -100)."""

    @staticmethod
    def from_lengths(sequence_lengths: torch.Tensor, width: int) -> PackedSequences:
        if sequence_lengths.dim() != 2:
            raise ValueError(f"sequence_lengths must be (batch, sequences per row), got shape "
                             f"{tuple(sequence_lengths.shape)}")
        lengths = sequence_lengths.long()
        num = lengths.shape[1]
        if lengths.device.type == "cpu" and not torch.compiler.is_compiling():
            # A cheap check where it costs no device sync; the loader guarantees it on accelerators.
            if bool((lengths < 0).any()) or bool((lengths.sum(1) > width).any()):
                raise ValueError(f"sequence_lengths must be >= 0 and sum to at most the row width {width} per row")
        ends = lengths.cumsum(1)
        cols = torch.arange(width, device=lengths.device).expand(lengths.shape[0], width).contiguous()
        ids = torch.searchsorted(ends, cols, right=True)
        own_start = (ends - lengths).gather(1, ids.clamp(max=num - 1))
        positions = torch.where(ids < num, cols - own_start, torch.zeros_like(cols))
        return PackedSequences(ids, positions, sequence_starts(lengths, width))

    def segments(self) -> SegmentIds:
        return SegmentIds(self.sequence_ids, self.starts.shape[1] + 1)


def _use_varlen(q: torch.Tensor) -> bool:
    return (q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] % 8 == 0
            and q.shape[-1] <= 256)


def _cumulative(ids: torch.Tensor, num_segments: int) -> torch.Tensor:
    """(B, T) block ids -> int32 cumulative lengths of the B * num_segments blocks, batch-major, as FlashAttention's
    variable-length kernels take them. Static shape: empty blocks are zero-length entries."""
    counts = torch.zeros(ids.shape[0], num_segments, dtype=torch.int32, device=ids.device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.int32))
    return torch.nn.functional.pad(counts.flatten().cumsum(0, dtype=torch.int32), (1, 0))


def _flash_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                  max_q: int, max_k: int, dropout_p: float) -> torch.Tensor:
    """FlashAttention-2 over flat tokens (total, heads, d) in blocks given by cumulative lengths; differentiable
    (aten's FlashAttentionBackward0 recomputes the dropout mask from the RNG state the forward saved). The maxima
    are upper bounds (static: the row widths), so no host read of the lengths is needed."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, False, False)[0]


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seg: SegmentIds, dropout_p: float) -> torch.Tensor:
    b, tq, heads, d = q.shape
    tk = k.shape[1]
    cu_k = _cumulative(seg.keys, seg.num_segments)
    flat_q = q.reshape(b * tq, heads, d)
    order = None
    if seg.queries is None:
        cu_q = cu_k
    else:
        # Queries picked at arbitrary positions: group them by (row, block), as the kernel needs, and undo it after.
        block = seg.queries + seg.num_segments * torch.arange(b, device=q.device)[:, None]
        order = block.flatten().argsort(stable=True)
        flat_q = flat_q[order]
        cu_q = _cumulative(seg.queries, seg.num_segments)
    out = _flash_varlen(flat_q, k.reshape(b * tk, heads, d), v.reshape(b * tk, heads, d), cu_q, cu_k, tq, tk,
                        dropout_p)
    if order is not None:
        out = out[order.argsort()]
    return out.view(b, tq, heads, d)


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seg: SegmentIds,
                     dropout_p: float) -> torch.Tensor:
    """Attention inside blocks only. q (B, Tq, heads, d), k and v (B, Tk, heads, d) -> (B, Tq, heads, d)."""
    if _use_varlen(q):
        return _varlen(q, k, v, seg, dropout_p)
    queries = seg.keys if seg.queries is None else seg.queries
    mask = (queries[:, :, None] == seg.keys[:, None, :])[:, None]
    out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, dropout_p)
    return out.transpose(1, 2)


__all__ = ["PackedSequences", "SegmentIds", "packed_attention", "sequence_starts"]
