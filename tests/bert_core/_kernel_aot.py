"""Compile every Triton kernel variant bert_core.kernels launches for sm_90 (H100/H200) with the real Triton
compiler, no GPU needed, and print what the PTX does per thread as JSON (one line per variant). Run in a process
without TRITON_INTERPRET (tests/bert_core/test_kernel_compile.py does).

Pointers and the row length get the 16-byte divisibility the JIT specialises on at run time for aligned tensors
and N % 16 == 0 (BERT's 768 and 3072), so the PTX is what an H100 runs for those shapes."""
import json
import os
import re
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from bert_core.kernels import bias_gelu_triton, dropout_layer_norm_triton

assert os.environ.get("TRITON_INTERPRET") != "1", "run without TRITON_INTERPRET: this compiles the real kernels"
TARGET = GPUTarget("cuda", 90, 32)
T = {"fp32": "*fp32", "bf16": "*bf16"}


def compile_variant(name, fn, signature, constexprs, num_warps=4):
    aligned = [a for a, t in signature.items() if t.startswith("*")] + ["N"]
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    signature = {**signature, **{c: "constexpr" for c in constexprs}}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=TARGET, options={"num_warps": num_warps})
    ptx = compiled.asm["ptx"]
    ops = Counter(re.findall(r"(?:ld|st)\.global(?:\.v\d)?\.b\d+|mul\.hi\.u32", ptx))
    print(json.dumps({"name": name, "cubin": "cubin" in compiled.asm, "ops": ops}))


def layer_norm_variants():
    """Each (x, residual) dtype pair with and without dropout; the autocast pair (bf16 x, fp32 residual) also with
    the boundary of issue 24: the bf16 copy for the next GEMM (forward), both incoming gradients (backward)."""
    for x, r in (("bf16", "fp32"), ("bf16", "bf16"), ("fp32", "fp32")):
        out = r  # the default output dtype: promote(x, residual)
        for dropout in (True, False):
            seed = {"seed_ptr": "*i64"} if dropout else {}
            consts = {"HAS_DROPOUT": dropout, "BLOCK_G": 128}  # H = 768: 96 groups of 8, padded to 128
            if not dropout:
                consts["seed_ptr"] = None
            for copy in ((False, True) if (x, r) == ("bf16", "fp32") else (False,)):
                fwd = dict(X=T[x], R=T[r], W="*fp32", B="*fp32", Y=T[out], Ycopy="*bf16", Mean="*fp32",
                           Rstd="*fp32", **seed, offset="i32", threshold="i32", scale="fp32", eps="fp32", N="i32")
                fwd_consts = {**consts, "HAS_COPY": copy}
                if not copy:
                    del fwd["Ycopy"]
                    fwd_consts["Ycopy"] = None
                tag = " copy" if copy else ""
                compile_variant(f"ln_fwd x={x} r={r} dropout={dropout}{tag}",
                                dropout_layer_norm_triton.forward_kernel, fwd, fwd_consts)
                bwd = dict(DY=T[out], DCOPY="*bf16", X=T[x], R=T[r], W="*fp32", Mean="*fp32", Rstd="*fp32",
                           DX=T[x], DR=T[r], DW_partial="*fp32", DB_partial="*fp32", **seed, offset="i32",
                           threshold="i32", scale="fp32", M="i32", N="i32")
                bwd_consts = {**consts, "HAS_DY": True, "HAS_DCOPY": copy, "ROWS_PER_PROGRAM": 32}
                if not copy:
                    del bwd["DCOPY"]
                    bwd_consts["DCOPY"] = None
                compile_variant(f"ln_bwd x={x} r={r} dropout={dropout}{tag}",
                                dropout_layer_norm_triton.backward_kernel, bwd, bwd_consts)
    compile_variant("keep_mask", dropout_layer_norm_triton.keep_mask_kernel,
                    dict(Keep="*i8", seed_ptr="*i64", offset="i32", threshold="i32", N="i32"), {"BLOCK_G": 128})


def bias_gelu_variants():
    for tanh in (False, True):
        consts = {"TANH": tanh, "BLOCK_M": 16, "BLOCK_N": 256}
        compile_variant(f"gelu_fwd tanh={tanh}", bias_gelu_triton.forward_kernel,
                        dict(H="*bf16", Bias="*fp32", Y="*bf16", M="i32", N="i32"), consts)
        compile_variant(f"gelu_bwd tanh={tanh}", bias_gelu_triton.backward_kernel,
                        dict(DY="*bf16", H="*bf16", Bias="*fp32", DH="*bf16", DB_partial="*fp32", M="i32",
                             N="i32"), {**consts, "ITERS": 8})


if __name__ == "__main__":
    layer_norm_variants()
    bias_gelu_variants()
