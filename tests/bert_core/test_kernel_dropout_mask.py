"""The fused kernels' dropout mask (bert_core.kernels.keep_mask): exactly the documented Philox function, its keep
rate, and independence across seeds, offsets, rows and neighbouring elements. Fixed seeds throughout.

"cpu" cases run Triton's interpreter, "cuda" cases the compiled kernels (tests/bert_core/_kernel_checks.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from _kernel_checks import DEVICES

from bert_core.kernels import keep_mask

M32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 (Salmon et al. 2011) in NumPy: an independent reference for the kernels' generator."""
    c0, c1, c2, c3, k0, k1 = (np.asarray(v, dtype=np.uint64) for v in (c0, c1, c2, c3, k0, k1))
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & M32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & M32
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & M32, (k1 + np.uint64(0xBB67AE85)) & M32
    return c0, c1, c2, c3


def reference_keep(seed: int, rows: int, cols: int, p: float, offset: int) -> np.ndarray:
    """The mask as bert_core/kernels/dropout_layer_norm_triton.py documents it."""
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    words = philox4x32_10(c // 8, r, offset, 0, seed & 0xFFFFFFFF, seed >> 32)
    lane = c % 8
    word = np.choose(lane // 2, words)
    bits = (word >> (16 * (lane % 2)).astype(np.uint64)) & np.uint64(0xFFFF)
    return bits >= round(p * 65536)


def seed_tensor(value: int, device: str) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.int64, device=device)


def test_reference_philox_matches_random123_known_answers():
    # kat_vectors of Random123 1.09 for philox4x32_10: zeros, all ones, and the digits of pi.
    cases = [((0, 0, 0, 0, 0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((0xFFFFFFFF,) * 6, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for args, expected in cases:
        assert tuple(int(w) for w in philox4x32_10(*args)) == expected


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows,cols,seed,offset,p", [(5, 44, 3, 0, 0.1), (3, 64, 2**40 + 12345, 7, 0.5),
                                                     (2, 9, 2**62 - 1, 2**31 - 1, 0.3)])
def test_keep_mask_is_the_documented_philox_function(device, rows, cols, seed, offset, p):
    keep = keep_mask(seed_tensor(seed, device), rows, cols, p, offset)
    assert keep.dtype == torch.bool and keep.shape == (rows, cols)
    np.testing.assert_array_equal(keep.cpu().numpy(), reference_keep(seed, rows, cols, p, offset))


@pytest.mark.parametrize("device", DEVICES)
def test_keep_rate_and_no_structure_across_the_eight_slices(device):
    rows, cols = 32, 8000  # the interpreter's cost is per row (one program each): few long rows
    keep = keep_mask(seed_tensor(20261124, device), rows, cols, 0.1).float().cpu()
    expected = 1 - 6554 / 65536  # p quantised to 1/65536, as bert_core.dropout on CPU
    n = rows * cols
    sigma = (expected * (1 - expected) / n) ** 0.5
    assert abs(keep.mean().item() - expected) < 4 * sigma
    # Each of the 8 slices of a Philox call (low/high halves of its 4 words) keeps at the same rate.
    per_lane = keep.view(rows, cols // 8, 8).mean((0, 1))
    lane_sigma = (expected * (1 - expected) / (n / 8)) ** 0.5
    assert (per_lane - expected).abs().max().item() < 4 * lane_sigma
    assert keep_mask(seed_tensor(1, device), 4, 100, 0.0).all()  # p = 0 keeps everything


def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return (((a - a.mean()) * (b - b.mean())).mean() / (a.std() * b.std())).item()


@pytest.mark.parametrize("device", DEVICES)
def test_masks_are_independent_across_seeds_offsets_rows_and_neighbours(device):
    rows, cols, p = 32, 2048, 0.5
    n = rows * cols
    bound = 4 / n**0.5  # four standard errors of a correlation of independent bits
    base = keep_mask(seed_tensor(11, device), rows, cols, p).cpu()
    others = {
        "another seed": keep_mask(seed_tensor(12, device), rows, cols, p).cpu(),
        "another offset": keep_mask(seed_tensor(11, device), rows, cols, p, offset=1).cpu(),
        "seed + 2**32 (high key word)": keep_mask(seed_tensor(11 + 2**32, device), rows, cols, p).cpu(),
    }
    for name, other in others.items():
        assert not torch.equal(base, other), name
        assert abs(correlation(base, other)) < bound, name
    shifted_rows = keep_mask(seed_tensor(11, device), rows + 1, cols, p).cpu()
    assert torch.equal(shifted_rows[:rows], base)  # a row's mask does not depend on how many rows follow
    assert abs(correlation(base[1:], base[:-1])) < 2 * bound  # next row
    half = base.view(rows, cols // 2, 2)
    assert abs(correlation(half[..., 0], half[..., 1])) < 2 * bound  # two halves of one 32-bit word
    for step in (1, 2, 8):  # next slice, next word, next Philox call
        assert abs(correlation(base[:, step:], base[:, :-step])) < 2 * bound, step


@pytest.mark.parametrize("device", DEVICES)
def test_same_seed_and_offset_give_the_same_mask(device):
    a = keep_mask(seed_tensor(5, device), 16, 96, 0.1, offset=3)
    b = keep_mask(seed_tensor(5, device), 16, 96, 0.1, offset=3)
    assert torch.equal(a, b)
