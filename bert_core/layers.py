"""`BertLayer` (self-attention block + feed-forward block, each post-LayerNorm with a residual) and `BertEncoder`
(a stack of them). Module and parameter names mirror Hugging Face's `modeling_bert`."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from .attention import AttnMask, BertAttention
from .config import BertConfig
from .dropout import Dropout
from .kernels import DEFAULT as DEFAULT_KERNELS
from .kernels import linear_gelu, residual_layer_norm_and_copy
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
        self.kernels = DEFAULT_KERNELS  # fused dropout + residual + LayerNorm when asked (bert_core.kernels)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor,
                with_copy: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:
        """The output, or with `with_copy` (output, the copy the next GEMM reads or None)."""
        out = residual_layer_norm_and_copy(self.dense(hidden_states), residual, self.LayerNorm, self.dropout,
                                           self.kernels, copy=with_copy)
        return out if with_copy else out[0]


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden_states: torch.Tensor, attn_mask: AttnMask = None, queries: torch.Tensor | None = None,
                gemm_input: torch.Tensor | None = None,
                with_copy: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:
        """`gemm_input`: hidden_states as the QKV projection reads it (the previous layer's copy, or None);
        `with_copy`: also return this layer's (see `BertSelfOutput.forward`)."""
        attention_output, attention_copy = self.attention(hidden_states, attn_mask, queries, gemm_input, True)
        ffn_input = attention_output if attention_copy is None else attention_copy
        return self.output(self.intermediate(ffn_input), attention_output, with_copy)


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
        # Under autocast with the fused LayerNorm (bert_core.kernels), each layer also hands the next one the bf16
        # copy of its output that the QKV GEMM reads; None elsewhere. The last layer's output feeds only the heads.
        copy = None
        for i, layer in enumerate(self.layer):
            queries = None
            if output_positions is not None and i == last:
                index = output_positions.unsqueeze(-1).expand(-1, -1, hidden_states.shape[-1])
                queries = torch.gather(hidden_states, 1, index)
                if isinstance(attn_mask, SegmentIds):  # packed rows: each query keeps its own sequence's block
                    attn_mask = attn_mask.at(output_positions)
            args = (hidden_states, attn_mask, queries, copy, i != last)
            if self.gradient_checkpointing and self.training:
                # Trades one extra forward per layer for activation memory (long sequences, big batches).
                out = torch.utils.checkpoint.checkpoint(layer, *args, use_reentrant=False)
            else:
                out = layer(*args)
            hidden_states, copy = out if i != last else (out, None)
        return hidden_states


__all__ = ["BertIntermediate", "BertOutput", "BertLayer", "BertEncoder", "activation"]
