"""`BertLayer` (self-attention block + feed-forward block, each post-LayerNorm with a residual) and `BertEncoder`
(a stack of them). Module and parameter names mirror Hugging Face's `modeling_bert`."""
from __future__ import annotations


import torch
import torch.utils.checkpoint
import torch.nn.functional as F
from torch import nn

from .attention import AttnMask, BertAttention
from .config import BertConfig
from .dropout import Dropout
from .kernels import DEFAULT as DEFAULT_KERNELS, linear_gelu, residual_layer_norm
from .packing import SegmentIds


def activation(name: str):
    """HF activation names -> functions. "gelu" is exact (erf), as in the original BERT and HF's "gelu"."""
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    raise ValueError(f"unsupported activation {name!r}")


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.hidden_act = config.hidden_act
        self.act = activation(config.hidden_act)
        self.kernels = DEFAULT_KERNELS  # fused bias + GELU on CUDA when asked (bert_core.kernels.bias_gelu)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return linear_gelu(hidden_states, self.dense, self.hidden_act, self.act, self.kernels)


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.kernels = DEFAULT_KERNELS  # fused dropout + residual + LayerNorm on CUDA (bert_core.kernels)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual_layer_norm(self.dense(hidden_states), residual, self.LayerNorm, self.dropout, self.kernels)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden_states: torch.Tensor, attn_mask: AttnMask = None,
                queries: torch.Tensor | None = None) -> torch.Tensor:
        attention_output = self.attention(hidden_states, attn_mask, queries)
        return self.output(self.intermediate(attention_output), attention_output)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False

    def forward(self, hidden_states: torch.Tensor, attn_mask: AttnMask = None,
                output_positions: torch.Tensor | None = None) -> torch.Tensor:
        """Returns (B, T, H), or (B, K, H) at `output_positions` (B, K) when given.

        With `output_positions`, the last layer computes its outputs only at those rows (its keys and values still
        cover every position), which is exact for those rows: nothing after the last layer reads the others. For
        pre-training that is [CLS] plus the ~15% masked positions, skipping ~85% of the last layer's work.
        """
        last = len(self.layer) - 1
        for i, layer in enumerate(self.layer):
            queries = None
            if output_positions is not None and i == last:
                index = output_positions.unsqueeze(-1).expand(-1, -1, hidden_states.shape[-1])
                queries = torch.gather(hidden_states, 1, index)
                if isinstance(attn_mask, SegmentIds):  # packed rows: each query keeps its own sequence's block
                    attn_mask = attn_mask.at(output_positions)
            if self.gradient_checkpointing and self.training:
                # Trades one extra forward per layer for activation memory (long sequences, big batches).
                hidden_states = torch.utils.checkpoint.checkpoint(layer, hidden_states, attn_mask, queries,
                                                                  use_reentrant=False)
            else:
                hidden_states = layer(hidden_states, attn_mask, queries)
        return hidden_states


__all__ = ["BertIntermediate", "BertOutput", "BertLayer", "BertEncoder", "activation"]
