"""FLOPs of one training step, for MFU (model FLOPs utilisation, as in the PaLM paper's appendix B), in two counts.

Training = 3 x forward (backward costs twice the forward); a matmul of an (n x k) by a (k x m) matrix is 2nkm FLOPs.
Embedding look-ups, LayerNorm, softmax, dropout and activations are not counted (as usual for MFU).

**Model FLOPs** (`flops_per_sequence`, the MFU convention of every figure we publish): what BERT needs per real
sequence of T tokens, whatever the implementation skips or wastes:
- dense matmuls in the encoder: 6 * N_enc * T, N_enc = L * (4 H^2 + 2 H I)  (QKV + output + the two FFN matrices),
  every layer counted in full;
- attention scores and the weighted sum: 6 * 2 * L * T^2 * H  (QK^T and AV);
- the MLM head at the masked positions only: 6 * M * (H^2 + H V)  (transform dense + tied decoder);
- pooler + NSP: 6 * (H^2 + 2 H).
BERT-base at T=128 with 20 masked positions: ~70 GFLOP per sequence.

**Executed FLOPs** (`executed_flops`, `executed_flops_per_batch`): the same matmuls as `bert_core` actually runs them
on a batch: padded positions included, the last encoder layer's queries, output projection and feed-forward only at
[CLS] and the MLM slots (its keys and values at every position), the MLM head at every slot it runs (the static path
runs all P slots, padding slots too), attention only inside each packed sequence. At seq 128 with 20 of 20 slots
used, ~5.6% of the model FLOPs are never executed (the last layer's skipped rows); padding adds executed FLOPs.
Utilisation of executed FLOPs says how busy the GPU is; MFU says how much of it is useful BERT work.
"""
from __future__ import annotations

from .config import BertConfig


def flops_per_sequence(config: BertConfig, seq_len: int, num_masked: float | None = None,
                       masked_fraction: float = 0.15) -> float:
    """Model FLOPs for one sequence of `seq_len` real tokens; `num_masked` defaults to round(seq_len * 0.15)."""
    h, i, n_layers, v = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    m = round(seq_len * masked_fraction) if num_masked is None else num_masked
    encoder = 6 * n_layers * (4 * h * h + 2 * h * i) * seq_len
    attention = 6 * 2 * n_layers * seq_len * seq_len * h
    mlm = 6 * m * (h * h + h * v)
    nsp = 6 * (h * h + 2 * h)
    return float(encoder + attention + mlm + nsp)


def mfu(config: BertConfig, seq_len: int, sequences_per_second: float, peak_flops: float,
        num_masked: float | None = None) -> float:
    """Fraction of `peak_flops` (e.g. 989e12 for H100 SXM dense bf16) the measured throughput represents."""
    return flops_per_sequence(config, seq_len, num_masked) * sequences_per_second / peak_flops


def executed_flops(config: BertConfig, *, positions: float, attention_pairs: float, query_rows: float,
                   query_pairs: float, head_slots: float, sequences: float) -> float:
    """Training FLOPs `bert_core` runs, from what a batch (or a sum of batches) touches:

    positions        tokens through the encoder, padding included (batch x width)
    attention_pairs  (query, key) pairs scored per layer below the last: width^2 per row, or the sum of the packed
                     sequences' squared lengths with variable-length attention
    query_rows       rows the last layer computes outputs for ([CLS] + MLM slots of every sequence)
    query_pairs      (query, key) pairs the last layer scores
    head_slots       rows the MLM head transforms and projects onto the vocabulary
    sequences        [CLS] rows pooled for NSP
    """
    h, i, n_layers, v = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    layer = 4 * h * h + 2 * h * i
    encoder = (n_layers - 1) * layer * positions + 2 * h * h * positions + (layer - 2 * h * h) * query_rows
    attention = 2 * h * ((n_layers - 1) * attention_pairs + query_pairs)
    head = (h * h + h * v) * head_slots
    nsp = (h * h + 2 * h) * sequences
    return 6.0 * (encoder + attention + head + nsp)


def executed_flops_per_batch(config: BertConfig, batch_size: int, width: int, mlm_slots: int) -> float:
    """Executed training FLOPs of one padded (unpacked) batch of `batch_size` rows x `width` positions whose MLM
    head runs `mlm_slots` slots per row (the static path: every slot, padding slots included)."""
    rows = batch_size * (1 + mlm_slots)
    return executed_flops(config, positions=batch_size * width, attention_pairs=batch_size * width * width,
                          query_rows=rows, query_pairs=rows * width, head_slots=batch_size * mlm_slots,
                          sequences=batch_size)
