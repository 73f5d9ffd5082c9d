"""The fused kernels' safety net in the pre-training loop (issue 24), with Triton's interpreter standing in for the
GPU (the loop runs the kernels on CPU when `--fused-kernels on`, `RuntimeConfig.fused_kernels=True`):

- a LayerNorm kernel made to disagree (the real kernel, its output then shifted by 1.0) is caught by the
  start-of-run check: one WARNING line naming the kernel, the figure and `--fused-kernels off`; the run trains on
  the composition and finishes;
- a kernel that passes the check and then fails in a step (Triton's own OutOfResources error, raised by the
  launch) ends `fit` with a `KernelFault`: a one-line verdict naming `--fused-kernels off`, which the Ray wrapper
  returns instead of restarting the workers (`training.launch._raise_verdict` re-raises its class in the driver);
- so do faults in set-up (issue 33): a device fault (a CUDA error) inside the self-check, after which nothing can
  run on the device, and a kernel that fails while the compiled model is precompiled.
"""
from __future__ import annotations

import logging
import os

import pytest
import torch

if not torch.cuda.is_available():  # before anything imports triton (bert_core imports it lazily)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from test_fit_guard import config  # noqa: E402

from bert_core.kernels import dropout_layer_norm_triton as triton_kernels  # noqa: E402
from bert_core.kernels.self_check import FLAG  # noqa: E402
from pretraining.kernel_options import KernelFault, current_options  # noqa: E402
from pretraining.loop import fit  # noqa: E402
from training.launch import _raise_verdict  # noqa: E402
from training.worker import Verdict, Worker  # noqa: E402

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter stands in for a GPU on CPU")]


def fused_config(dataset: str, work, steps: int, **runtime):
    import dataclasses

    cfg = config(dataset, work, steps=steps, every=100)
    small = dataclasses.replace(cfg.data, micro_batch_size=2)  # 2 x 64 tokens: the interpreter runs a row each
    return dataclasses.replace(cfg, data=small, runtime=dataclasses.replace(cfg.runtime, fused_kernels=True,
                                                                            **runtime))


class Shifted:
    """The real forward kernel, its output then shifted by 1.0: a kernel that runs and is wrong."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.kernel[grid](*args, **kwargs)
            args[4].add_(1.0)  # Y, the output
        return launch


class FailsAfter:
    """The real forward kernel for its first `good` launches (the start-of-run check), then Triton's own error (or
    `error()`: a device fault, as CUDA reports an illegal memory access)."""

    def __init__(self, kernel, good: int, error=None):
        self.kernel, self.good, self.launches, self.error = kernel, good, 0, error

    def __getitem__(self, grid):
        self.launches += 1
        if self.launches > self.good:
            from triton.runtime.errors import OutOfResources

            raise self.error() if self.error else OutOfResources(232448, 101376, "shared memory")
        return self.kernel[grid]


def illegal_address():
    return torch.AcceleratorError("CUDA error: an illegal memory access was encountered")


def test_a_disagreeing_kernel_is_switched_off_and_the_run_continues(tiny_pretrain_data, tmp_path, monkeypatch,
                                                                      caplog):
    monkeypatch.setattr(triton_kernels, "forward_kernel", Shifted(triton_kernels.forward_kernel))
    models = []
    worker = Worker(wrap=lambda m: models.append(m) or m)
    with caplog.at_level(logging.INFO):
        result = fit(fused_config(tiny_pretrain_data["train"], tmp_path, steps=3), worker)
    assert result.step == 3 and torch.isfinite(torch.tensor(result.metrics["loss"]))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                and "fused kernel" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "dropout_layer_norm" in warnings[0] and FLAG in warnings[0] and "relative error" in warnings[0]
    assert "\n" not in warnings[0]
    options = current_options(models[0])
    assert options.fused is True and options.fused_layer_norm is False  # the composition at every site


def test_a_kernel_fault_in_a_step_is_a_one_line_verdict(tiny_pretrain_data, tmp_path, monkeypatch):
    failing = FailsAfter(triton_kernels.forward_kernel, good=1)
    monkeypatch.setattr(triton_kernels, "forward_kernel", failing)
    with pytest.raises(KernelFault) as failure:
        fit(fused_config(tiny_pretrain_data["train"], tmp_path, steps=3), Worker())
    message = str(failure.value)
    assert isinstance(failure.value, Verdict) and "\n" not in message
    assert message.endswith(f"rerun with {FLAG}") and "OutOfResources" in message, message
    assert failing.launches == 2  # the check's launch passed, the first step's failed: no retry
    # What the Ray wrapper returns for it, raised in the driver as the same class with the same line.
    with pytest.raises(KernelFault, match="rerun with --fused-kernels off"):
        _raise_verdict({"error": message, "kind": f"{KernelFault.__module__}:{KernelFault.__qualname__}"})


def test_a_device_fault_in_the_self_check_ends_the_run_naming_the_kernel(tiny_pretrain_data, tmp_path,
                                                                        monkeypatch):
    """Before, the check switched the kernel off and went on, into a device that no longer works (and its own
    synchronize raised outside any verdict): Ray Train restarted the group into the same fault."""
    failing = FailsAfter(triton_kernels.forward_kernel, good=0, error=illegal_address)
    monkeypatch.setattr(triton_kernels, "forward_kernel", failing)
    with pytest.raises(KernelFault) as failure:
        fit(fused_config(tiny_pretrain_data["train"], tmp_path, steps=3), Worker())
    message = str(failure.value)
    assert isinstance(failure.value, Verdict) and "\n" not in message
    assert message.startswith("fused kernel dropout_layer_norm faulted on the GPU in the start-of-run self-check")
    assert "AcceleratorError: CUDA error: an illegal memory access" in message
    assert message.endswith(f"rerun with {FLAG}")
    assert failing.launches == 1  # the check's launch; no step ran


def test_a_kernel_fault_while_precompiling_is_a_one_line_verdict(tiny_pretrain_data, tmp_path, monkeypatch):
    """A compiled run builds every bucket's graph before step 1 (`precompile`): the fused op's first launch inside
    the compiled graph fails there, not in a step. aot_eager: the same compiled path without code generation."""
    failing = FailsAfter(triton_kernels.forward_kernel, good=1)
    monkeypatch.setattr(triton_kernels, "forward_kernel", failing)
    with pytest.raises(KernelFault) as failure:
        fit(fused_config(tiny_pretrain_data["train"], tmp_path, steps=3, compile=True, compile_backend="aot_eager"),
            Worker())
    message = str(failure.value)
    assert "\n" not in message and message.endswith(f"rerun with {FLAG}"), message
    assert message.startswith("a GPU kernel failed while precompiling with bert_core's fused kernels on "
                              "(dropout_layer_norm)") and "OutOfResources" in message, message
    assert failing.launches == 2  # the check's, then the first compiled forward's


def test_other_errors_stay_what_they_are(tiny_pretrain_data, tmp_path, monkeypatch):
    """A bug of ours in a step (not a kernel's) is not relabelled as a kernel fault."""
    from pretraining import loop

    def broken(run):
        raise KeyError("masked_lm_positions")

    monkeypatch.setattr(loop, "_train_step", broken)
    with pytest.raises(KeyError):
        fit(fused_config(tiny_pretrain_data["train"], tmp_path, steps=2), Worker())
