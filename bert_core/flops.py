"""Model FLOPs of one training step, for MFU (model FLOPs utilisation, as in the PaLM paper's appendix B).

Per sequence of T tokens, training = 3 x forward (backward costs twice the forward):
- dense matmuls in the encoder: 6 * N_enc * T, N_enc = L * (4 H^2 + 2 H I)  (QKV + output + the two FFN matrices);
- attention scores and the weighted sum: 6 * 2 * L * T^2 * H  (QK^T and AV, 2 FLOPs per multiply-add);
- the MLM head at the masked positions only: 6 * M * (H^2 + H V)  (transform dense + tied decoder);
- pooler + NSP: 6 * (H^2 + 2 H).
Embedding look-ups, LayerNorm, softmax and activations are not counted (as usual for MFU). BERT-base at T=128
with 20 masked positions: ~70 GFLOP per sequence.
"""
from __future__ import annotations

from .config import BertConfig


def flops_per_sequence(config: BertConfig, seq_len: int, num_masked: float | None = None,
                       masked_fraction: float = 0.15) -> float:
    """Training FLOPs for one sequence; `num_masked` defaults to round(seq_len * masked_fraction)."""
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
