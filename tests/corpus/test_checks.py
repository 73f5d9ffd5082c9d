"""corpus.checks at its thresholds: [UNK] shares around 1% and --max-unk-fraction, a vocabulary's shortfall
around 90%, the masking cap of --max-predictions-per-seq (hand-computed cases)."""
from __future__ import annotations

import pytest

from corpus.checks import CheckConfig, settings_warnings, unk_check, vocab_size_warning
from corpus.create_instances import InstanceConfig

FILES = {"a.txt": (1, 1000), "b.txt": (30, 1000), "c.txt": (0, 1000)}


def test_unk_below_one_percent_is_silent_above_it_a_warning_above_the_maximum_an_error():
    assert unk_check(10, 1000, FILES, "--vocab v.txt") is None  # 1.0%: not above
    warning = unk_check(31, 3000, FILES, "--vocab v.txt")  # 1.03%
    assert warning.startswith("vocabulary: 1.0% of the corpus's tokens are [UNK] (31 of 3,000) with --vocab v.txt")
    assert "(highest per file: b.txt 3.0%, a.txt 0.1%)" in warning  # c.txt has none: not named
    assert unk_check(100, 1000, FILES, "v") is not None  # 10%: the maximum itself is allowed
    with pytest.raises(ValueError, match=r"10\.1% of the corpus's tokens are \[UNK\].*--max-unk-fraction \(now 0\.1\)"):
        unk_check(101, 1000, FILES, "v")
    assert "40.0%" in unk_check(400, 1000, FILES, "v", max_fraction=1.0)  # allowed: kept as a warning
    with pytest.raises(ValueError):  # nothing allowed
        unk_check(1, 1000, FILES, "v", max_fraction=0.0)
    assert unk_check(0, 0, {}, "v") is None  # no tokens at all is another check's business


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_max_unk_fraction_must_be_a_fraction(bad):
    with pytest.raises(ValueError, match=f"--max-unk-fraction {bad}: use a fraction in \\[0, 1\\]"):
        CheckConfig(max_unk_fraction=bad)


def test_a_trained_vocabulary_under_90_percent_of_the_asked_size_is_warned_with_the_figure():
    assert vocab_size_warning(30522, 27470, 135) is None  # 90.0%
    warning = vocab_size_warning(30522, 1613, 135)
    assert warning.startswith("vocabulary: trained 1,613 entries of the 30,522 asked (5%): the 135 documents")


def test_the_masking_cap_is_warned_where_it_binds():
    assert settings_warnings(InstanceConfig()) == []  # 128 x 0.15 = 19.2 -> 19 <= 20
    [w] = settings_warnings(InstanceConfig(max_seq_length=512))
    assert "gets 20 masks instead of 77" in w and "--max-predictions-per-seq 77" in w
    assert settings_warnings(InstanceConfig(max_seq_length=512, max_predictions_per_seq=80)) == []
