"""`BertForPreTraining`: BertModel + the masked-LM head (tied to the word embeddings) + the next-sentence head.

Called with `masked_lm_positions` (B, P) / `masked_lm_labels` (B, P, -100 in padding slots), as our dataset stores
them, only what pre-training reads is computed:
- the last encoder layer runs its queries and feed-forward only at [CLS] and the masked slots (keys and values
  still span the whole sequence), so those rows are exact and ~85% of that layer's work is skipped;
- the MLM transform and the vocabulary projection run only at the valid masked positions (never B x T x V);
- while training, the MLM loss uses the chunked fused linear + cross-entropy of `fused_ce.py`.
Without positions it returns logits for every position (what HF returns; used for parity checks), and
`masked_lm_labels` may then be HF-style (B, T) labels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import BertConfig
from .heads import BertPreTrainingHeads
from .fused_ce import linear_cross_entropy
from .losses import accuracy_counts, mean_cross_entropy, valid_slots
from .model import BertModel
from .outputs import BertForPreTrainingOutput
from .pretrained import BertPreTrainedModel, _no_init


class BertForPreTraining(BertPreTrainedModel):
    # With masked positions and gradients on, compute the MLM loss with the chunked fused linear+CE (mlm_logits is
    # then None: the (N, V) logits are never kept). Set False to get mlm_logits while training.
    fused_mlm_loss: bool = True

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        with _no_init():  # initialised once, below, with the head
            self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.tie_weights()  # before init: the decoder's own V x H matrix is dropped, never initialised
        self.init_weights()

    def tie_weights(self) -> None:
        """The MLM decoder shares the word-embedding matrix (same Parameter, same storage), as in the paper."""
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        masked_lm_positions: torch.Tensor | None = None,
        masked_lm_labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
    ) -> BertForPreTrainingOutput:
        if masked_lm_positions is None:
            # Every position (HF's behaviour): for parity checks and HF-style (B, T) labels.
            out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            rows, labels, pooled = out.last_hidden_state, masked_lm_labels, out.pooler_output
        else:
            valid = valid_slots(masked_lm_positions, masked_lm_labels, input_ids.shape[0])
            slots = masked_lm_positions.clamp(min=0)
            cls_position = torch.zeros_like(slots[:, :1])
            out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                            output_positions=torch.cat([cls_position, slots], dim=1))
            # Row 0 is [CLS] (already pooled), rows 1.. the P slots; keep the valid ones, batch-major.
            rows = out.last_hidden_state[:, 1:][valid]
            labels = masked_lm_labels[valid] if masked_lm_labels is not None else None
            pooled = out.pooler_output
        nsp_logits = self.cls.seq_relationship(pooled)
        result = BertForPreTrainingOutput(nsp_logits=nsp_logits)

        head = self.cls.predictions
        hidden = head.transform(rows)
        if (labels is not None and masked_lm_positions is not None and self.fused_mlm_loss
                and torch.is_grad_enabled() and hidden.requires_grad):
            # Training: loss and gradients chunk by chunk, no (N, V) logits kept (see fused_ce.py).
            loss_sum, correct = linear_cross_entropy(hidden, head.decoder.weight, head.bias, labels)
            count = labels.new_tensor(labels.numel())
            result.mlm_loss = loss_sum / count.clamp(min=1)
            result.mlm_correct, result.mlm_count = correct, count
        else:
            result.mlm_logits = F.linear(hidden, head.decoder.weight, head.bias)
            if labels is not None:
                result.mlm_loss = mean_cross_entropy(result.mlm_logits, labels)
                result.mlm_correct, result.mlm_count = accuracy_counts(result.mlm_logits, labels)
        losses = []
        if result.mlm_loss is not None:
            result.mlm_accuracy = result.mlm_correct / result.mlm_count.clamp(min=1)
            losses.append(result.mlm_loss)
        if next_sentence_label is not None:
            result.nsp_loss = mean_cross_entropy(nsp_logits, next_sentence_label)
            result.nsp_correct, result.nsp_count = accuracy_counts(nsp_logits, next_sentence_label)
            result.nsp_accuracy = result.nsp_correct / result.nsp_count.clamp(min=1)
            losses.append(result.nsp_loss)
        if losses:
            result.loss = losses[0] if len(losses) == 1 else losses[0] + losses[1]
        return result
