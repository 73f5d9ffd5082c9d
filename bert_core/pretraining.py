"""`BertForPreTraining`: BertModel + the masked-LM head (tied to the word embeddings) + the next-sentence head.

Called with `masked_lm_positions` (B, P) / `masked_lm_labels` (B, P, -100 in padding slots), as our dataset stores
them, only what pre-training reads is computed:
- the last encoder layer runs its queries and feed-forward only at [CLS] and the P slots (keys and values still
  span the whole sequence), so those rows are exact and ~85% of that layer's work is skipped;
- the MLM transform and the vocabulary projection run only at the masked slots (never B x T x V).

Two choices, each made per call from the device (and overridable, so CPU tests can run either path):
- which slots (`static_mlm`): *static* keeps all B*P slots and lets cross-entropy skip label -100: every shape is
  fixed by (B, T, P), there is no host read, and `torch.compile` compiles once whatever the number of masked tokens
  (CUDA, or anything being compiled). *Valid-only* drops padding slots with boolean indexing (a data-dependent
  shape): on a CPU running eagerly it skips the head's work on padding (chosen by measuring, see
  benchmarks/model_throughput.py --mlm-slots).
- how the head computes the loss (`mlm_head`): *chunked* is the fused linear + cross-entropy of `fused_ce.py`, tuned
  for CPU (small logits buffers, gradients in the same pass); *gemm* is one GEMM over the slots in the activations'
  dtype (bf16 under autocast) plus `F.cross_entropy`, which GPUs and Inductor handle best. "auto" = chunked on a CPU
  running eagerly while gradients are needed, gemm otherwise.
Without positions it returns logits for every position (what HF returns; used for parity checks), and
`masked_lm_labels` may then be HF-style (B, T) labels.

Packed rows (`sequence_lengths` (B, S), see `bert_core.packing`): every row holds up to S sequences; masked
positions index into the row, NSP reads each sequence's [CLS] and `next_sentence_label` is (B, S) with -100 at
unused places; the losses are the means over all real masked tokens and sequences, as for the same sequences
unpacked.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import BertConfig
from .fused_ce import linear_cross_entropy
from .heads import BertPreTrainingHeads
from .losses import IGNORE_INDEX, accuracy_counts, mean_cross_entropy, valid_slots
from .model import BertModel
from .outputs import BertForPreTrainingOutput
from .packing import sequence_starts
from .pretrained import BertPreTrainedModel, _no_init

MLM_HEADS = ("auto", "chunked", "gemm")


def cpu_eager(device: torch.device) -> bool:
    """True where the CPU-tuned pieces win: a CPU tensor outside `torch.compile` tracing."""
    return device.type == "cpu" and not torch.compiler.is_compiling()


class BertForPreTraining(BertPreTrainedModel):
    # None = by device (static unless a CPU runs eagerly); True/False force it. See the module docstring.
    static_mlm: bool | None = None
    # "auto" | "chunked" | "gemm". Chunked never keeps the (N, V) logits: mlm_logits is then None.
    mlm_head: str = "auto"

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

    def uses_static_mlm(self, device: torch.device) -> bool:
        return self.static_mlm if self.static_mlm is not None else not cpu_eager(device)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        masked_lm_positions: torch.Tensor | None = None,
        masked_lm_labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        sequence_lengths: torch.Tensor | None = None,
    ) -> BertForPreTrainingOutput:
        if self.mlm_head not in MLM_HEADS:
            raise ValueError(f"mlm_head must be one of {MLM_HEADS}, got {self.mlm_head!r}")
        static = False
        if masked_lm_positions is None:
            # Every position (HF's behaviour): for parity checks and HF-style (B, T) labels.
            out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                            position_ids=position_ids, sequence_lengths=sequence_lengths)
            rows, labels, pooled = out.last_hidden_state, masked_lm_labels, out.pooler_output
        else:
            valid = valid_slots(masked_lm_positions, masked_lm_labels, input_ids.shape[0])
            slots = masked_lm_positions.clamp(min=0)
            if sequence_lengths is None:
                cls_positions = torch.zeros_like(slots[:, :1])
            else:
                cls_positions = sequence_starts(sequence_lengths, input_ids.shape[1])
            out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                            output_positions=torch.cat([cls_positions, slots], dim=1), position_ids=position_ids,
                            sequence_lengths=sequence_lengths)
            # The first rows are the [CLS]s (already pooled), then the P slots, batch-major.
            slot_rows, pooled = out.last_hidden_state[:, cls_positions.shape[1]:], out.pooler_output
            static = self.uses_static_mlm(input_ids.device)
            if static:  # all B*P slots; padding carries label -100, which cross-entropy and the counts skip
                rows = slot_rows.reshape(-1, slot_rows.shape[-1])
                labels = (torch.where(valid, masked_lm_labels, IGNORE_INDEX).reshape(-1)
                          if masked_lm_labels is not None else None)
            else:
                rows = slot_rows[valid]
                labels = masked_lm_labels[valid] if masked_lm_labels is not None else None
        nsp_logits = self.cls.seq_relationship(pooled)
        result = BertForPreTrainingOutput(nsp_logits=nsp_logits)

        head = self.cls.predictions
        hidden = head.transform(rows)
        chunked = self.mlm_head == "chunked" or (self.mlm_head == "auto" and cpu_eager(hidden.device))
        if (labels is not None and masked_lm_positions is not None and chunked
                and torch.is_grad_enabled() and hidden.requires_grad):
            # Training on CPU: loss and gradients chunk by chunk, no (N, V) logits kept (see fused_ce.py).
            loss_sum, correct, count = linear_cross_entropy(hidden, head.decoder.weight, head.bias, labels)
            result.mlm_loss = loss_sum / count.clamp(min=1)
            result.mlm_correct, result.mlm_count = correct, count
        else:
            # One GEMM over the slots in the activations' dtype (bf16 under autocast, no fp32 matmul);
            # cross-entropy upcasts the logits itself.
            logits = F.linear(hidden, head.decoder.weight, head.bias)
            if labels is not None:
                result.mlm_loss = mean_cross_entropy(logits, labels)
                result.mlm_correct, result.mlm_count = accuracy_counts(logits, labels)
            result.mlm_logits = logits.view(*masked_lm_positions.shape, -1) if static else logits
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
