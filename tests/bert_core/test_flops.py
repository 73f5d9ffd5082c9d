"""The two FLOP counts of bert_core.flops against hand-computed cases: model FLOPs (the MFU convention) and the
FLOPs bert_core executes (the last layer at [CLS] + the MLM slots only, the head at every slot run, padding)."""
import pytest

from bert_core import BertConfig, bert_base, executed_flops, executed_flops_per_batch, flops_per_sequence

# L=2, H=4, I=8, V=10: small enough to count by hand.
TOY = BertConfig(vocab_size=10, hidden_size=4, num_hidden_layers=2, num_attention_heads=1, intermediate_size=8)


def test_model_flops_by_hand():
    # per token and layer: QKV 3*16 + out 16 + FFN 2*32 = 128 params; attention 2 * 2 * H per (query, key) pair
    t, m = 6, 2
    forward = 2 * 128 * 2 * t + 2 * 2 * 4 * 2 * t * t + 2 * m * (16 + 40) + 2 * (16 + 8)
    assert flops_per_sequence(TOY, t, num_masked=m) == 3 * forward


def test_executed_flops_by_hand():
    # one row of width 6 with 2 MLM slots: layer 1 in full; layer 2: K, V at 6 rows, Q + out + FFN at 3 rows
    # ([CLS] + 2 slots), 3 queries x 6 keys; head at 2 slots; one pooled [CLS]
    forward = (2 * 128 * 6 + 2 * 32 * 6 + 2 * 96 * 3) + (2 * 2 * 4 * 36 + 2 * 2 * 4 * 18) + 2 * 2 * 56 + 2 * 24
    assert executed_flops_per_batch(TOY, 1, 6, 2) == 3 * forward
    assert executed_flops(TOY, positions=6, attention_pairs=36, query_rows=3, query_pairs=18, head_slots=2,
                          sequences=1) == 3 * forward


def test_bert_base_seq128_skips_the_last_layers_rows():
    """The issue's figure: with all 20 slots real, ~5.6% of the model FLOPs at seq 128 are never executed."""
    cfg = bert_base()
    model = flops_per_sequence(cfg, 128, num_masked=20)
    assert model / 1e9 == pytest.approx(69.93, abs=0.01)
    assert 1 - executed_flops_per_batch(cfg, 1, 128, 20) / model == pytest.approx(0.056, abs=0.001)


def test_padding_and_empty_slots_are_executed_not_useful():
    cfg = bert_base()
    # 100 real tokens padded to 128, 15 of 20 slots real: executed grows with the padding and the empty slots
    assert executed_flops_per_batch(cfg, 1, 128, 20) > flops_per_sequence(cfg, 100, num_masked=15)
    assert executed_flops_per_batch(cfg, 8, 128, 20) == pytest.approx(8 * executed_flops_per_batch(cfg, 1, 128, 20))
