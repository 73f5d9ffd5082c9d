"""The Triton kernels compile for sm_90 (H100/H200) with the real compiler of the pinned Triton (3.6, the GPU
machines' version), no GPU needed, and the PTX does what the kernels are for: one Philox4x32-10 call (20 32-bit
high multiplies) per thread, i.e. per 8 elements, in every bf16 dropout variant, and only vectorised row loads and
stores. The interpreter tests cannot see any of this: a construct the compiler refuses (a non-constexpr global, a
type mismatch) passes under the interpreter.

Runs tests/bert_core/_kernel_aot.py in a subprocess without TRITON_INTERPRET (set in this process)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def variants() -> dict[str, dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(HERE / "_kernel_aot.py")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {v["name"]: v for v in map(json.loads, done.stdout.splitlines())}


def test_every_variant_compiles_to_a_cubin(variants):
    assert len(variants) == 21  # 12 + 4 LayerNorm variants with the copy / both gradients, keep mask, 4 GELU
    assert {"ln_fwd x=bf16 r=fp32 dropout=True copy", "ln_bwd x=bf16 r=fp32 dropout=True copy"} <= set(variants)
    assert all(v["cubin"] for v in variants.values())


def test_one_philox_call_per_eight_elements(variants):
    with_dropout = {n: v for n, v in variants.items() if "dropout=True" in n and "x=bf16" in n}
    assert len(with_dropout) == 6
    for name, v in with_dropout.items():
        assert v["ops"].get("mul.hi.u32") == 20, (name, v["ops"])  # 10 rounds x 2 multiplies, once per thread
    assert variants["keep_mask"]["ops"].get("mul.hi.u32") == 20
    assert all("mul.hi.u32" not in v["ops"] for n, v in variants.items() if "dropout=False" in n)


def test_row_loads_and_stores_are_vectorised(variants):
    for name, v in variants.items():
        scalar = {op: n for op, n in v["ops"].items() if ".v" not in op and op != "mul.hi.u32"}
        # Allowed scalars: the seed (b64), a row's mean and 1/std (b32: stored by the forward, read by the backward).
        assert set(scalar) <= {"ld.global.b64", "ld.global.b32", "st.global.b32"}, (name, scalar)
        assert scalar.get("ld.global.b32", 0) <= 2 and scalar.get("st.global.b32", 0) <= 2, (name, scalar)
