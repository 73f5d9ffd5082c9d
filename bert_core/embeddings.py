"""`BertEmbeddings`: word + segment (token type) + learned absolute position embeddings, summed, then LayerNorm and
dropout (BERT paper, section 3, figure 2). Parameter names follow Hugging Face so checkpoints map one to one.
Positions count from each row's start, or from `position_ids` when given (packed rows restart them per sequence)."""
from __future__ import annotations

import torch
from torch import nn

from .config import BertConfig
from .dropout import Dropout


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        # No padding_idx: the reference (TF) BERT trains every row, and the attention mask, not a frozen zero
        # vector, is what keeps padding out of the real tokens' representations.
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.max_positions = config.max_position_embeddings

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        if seq_len > self.max_positions and position_ids is None:
            raise ValueError(f"sequence length {seq_len} exceeds max_position_embeddings={self.max_positions}; "
                             "truncate the input or use a config with more positions")
        x = self.word_embeddings(input_ids)
        if position_ids is None:
            # Position rows are a contiguous slice, broadcast over the batch: no index tensor, no gather.
            x = x + self.position_embeddings.weight[:seq_len]
        else:
            x = x + self.position_embeddings(position_ids)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))
