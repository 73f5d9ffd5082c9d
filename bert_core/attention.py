"""Multi-head self-attention through `torch.nn.functional.scaled_dot_product_attention`.

Q, K and V come from one fused (3H x H) projection: one GEMM instead of three, and the layout HF interop needs is
restored by `bert_core.hf` (it splits/concatenates `query`/`key`/`value`). `BertAttention` adds the output
projection, dropout, residual and the post-LayerNorm of the original Transformer/BERT. With packed rows
(`bert_core.packing`) the mask is replaced by block ids and attention stays inside each packed sequence.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import BertConfig
from .dropout import Dropout, attention
from .kernels import DEFAULT as DEFAULT_KERNELS
from .kernels import residual_layer_norm_and_copy
from .packing import SegmentIds, packed_attention

AttnMask = torch.Tensor | SegmentIds | None


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, hidden_states: torch.Tensor, attn_mask: AttnMask = None,
                queries: torch.Tensor | None = None, gemm_input: torch.Tensor | None = None) -> torch.Tensor:
        """hidden_states (B, T, H); attn_mask boolean (B, 1, 1, T), True = may attend, or None (attend all), or the
        `SegmentIds` of packed rows (attend only inside one's own block).

        `queries` (B, K, H), optional: compute outputs only for these rows (gathered from hidden_states) while
        attending over all T keys; used by the last layer when only some positions' outputs are needed.
        `gemm_input`, optional: hidden_states as the projection should read it (the bf16 copy the previous fused
        LayerNorm wrote under autocast, bert_core.kernels), so that autocast casts nothing.
        """
        source = hidden_states if gemm_input is None else gemm_input
        b, t, h = hidden_states.shape
        dropout_p = self.dropout_p if self.training else 0.0
        if queries is None:
            q, k, v = self.qkv(source).split(h, dim=-1)
        else:
            w, bias = self.qkv.weight, self.qkv.bias
            q = F.linear(queries, w[:h], bias[:h])
            k, v = F.linear(source, w[h:], bias[h:]).split(h, dim=-1)
        # Views, not copies: (B, T, H) slices of the fused output -> (B, T, heads, d), then (B, heads, T, d) with
        # strides SDPA accepts (varlen attention takes the tokens flat). Their gradients meet again in split's
        # backward (one cat), where unbind/permute cost a stack and a copy.
        q, k, v = [x.unflatten(-1, (self.num_heads, self.head_dim)) for x in (q, k, v)]
        if isinstance(attn_mask, SegmentIds):
            out = packed_attention(q, k, v, attn_mask, dropout_p)
        else:
            out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask,
                            dropout_p).transpose(1, 2)
        return out.reshape(b, -1, h)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.kernels = DEFAULT_KERNELS  # fused dropout + residual + LayerNorm when asked (bert_core.kernels)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor,
                with_copy: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:
        """The output, or with `with_copy` (output, the copy the next GEMM reads or None): see
        `bert_core.kernels.residual_layer_norm_and_copy`."""
        out = residual_layer_norm_and_copy(self.dense(hidden_states), residual, self.LayerNorm, self.dropout,
                                           self.kernels, copy=with_copy)
        return out if with_copy else out[0]


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, hidden_states: torch.Tensor, attn_mask: AttnMask = None, queries: torch.Tensor | None = None,
                gemm_input: torch.Tensor | None = None,
                with_copy: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:
        residual = hidden_states if queries is None else queries
        return self.output(self.self(hidden_states, attn_mask, queries, gemm_input), residual, with_copy)
