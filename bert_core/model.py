"""`BertModel`: embeddings -> encoder -> pooler, called like transformers' (`input_ids`, `attention_mask`,
`token_type_ids`, `position_ids`) and returning `BertModelOutput(last_hidden_state, pooler_output)`. With
`sequence_lengths` the rows are packed (`bert_core.packing`): each holds several sequences, each one BERT's."""
from __future__ import annotations

import torch
from torch import nn

from .config import BertConfig
from .embeddings import BertEmbeddings
from .layers import BertEncoder
from .outputs import BertModelOutput
from .packing import PackedSequences
from .pretrained import BertPreTrainedModel


class BertPooler(nn.Module):
    """dense + tanh on the [CLS] (first) position: the sentence vector NSP and sequence classification read.
    `rows` = S: the first S rows, one [CLS] per packed sequence, (B, S, H)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        return torch.tanh(self.dense(hidden_states[:, 0] if rows is None else hidden_states[:, :rows]))


def attention_mask_to_sdpa(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) 1 = token, 0 = padding -> boolean (B, 1, 1, T) for SDPA (True = may attend), or None.

    Only keys are masked: a padding query still attends to the real tokens (as HF does), so its output is defined
    and never NaN, and it never influences a real token. On CPU an all-ones mask becomes None, which lets SDPA take
    its mask-free kernel; on accelerators we skip that check because it would synchronise with the host each step.
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be (batch, seq_len) with 1 for tokens and 0 for padding, "
                         f"got shape {tuple(attention_mask.shape)}")
    mask = attention_mask.bool() if attention_mask.dtype != torch.bool else attention_mask
    if mask.device.type == "cpu" and not torch.compiler.is_compiling() and bool(mask.all()):
        return None
    return mask[:, None, None, :]


class BertModel(BertPreTrainedModel):
    has_base_prefix = False

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        if not add_pooling_layer:
            self.ignore_unexpected = ("pooler.",)
        self.init_weights()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                output_positions: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                sequence_lengths: torch.Tensor | None = None) -> BertModelOutput:
        """`output_positions` (B, K), optional: return last_hidden_state only at these positions, (B, K, H),
        computing the last layer only there. The pooler reads row 0, so put position 0 ([CLS]) first.

        `sequence_lengths` (B, S), optional: packed rows (it replaces `attention_mask`; positions restart per
        sequence unless `position_ids` are given). The pooler then reads each sequence's [CLS], (B, S, H): with
        `output_positions`, put the S starts (`PackedSequences.starts`) first."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}")
        packed = None
        if sequence_lengths is not None:
            packed = PackedSequences.from_lengths(sequence_lengths, input_ids.shape[1])
            position_ids = packed.position_ids if position_ids is None else position_ids
        mask = attention_mask_to_sdpa(attention_mask) if packed is None else packed.segments()
        hidden = self.encoder(self.embeddings(input_ids, token_type_ids, position_ids), mask, output_positions)
        pooled = None
        if self.pooler is not None and packed is None:
            pooled = self.pooler(hidden)
        elif self.pooler is not None:
            cls_rows = hidden
            if output_positions is None:  # every position's output: gather each sequence's [CLS]
                cls_rows = torch.gather(hidden, 1, packed.starts.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
            pooled = self.pooler(cls_rows, rows=packed.starts.shape[1])
        return BertModelOutput(last_hidden_state=hidden, pooler_output=pooled)
