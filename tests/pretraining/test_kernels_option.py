"""--fused-kernels / --low-precision-residual reach every one of bert_core's kernel sites; the bf16 residual stream is
a setting of the fused op, so asking for it without the op fails with the fix."""
import pytest

from bert_core import BertForPreTraining, bert_tiny
from bert_core.kernels import DEFAULT, KernelOptions
from pretraining import kernel_options
from pretraining.config import RuntimeConfig


def sites(model):
    return [m.kernels for m in model.modules() if isinstance(getattr(m, "kernels", None), KernelOptions)]


def test_kernel_options_reach_every_site():
    model = BertForPreTraining(bert_tiny(vocab_size=100))
    kernel_options.apply(model, None)  # bert_core's default: nothing set
    assert sites(model) and all(o == DEFAULT for o in sites(model))
    kernel_options.apply(model, True, low_precision_residual=True)
    assert all(o == KernelOptions(fused=True, low_precision_residual=True) for o in sites(model))
    kernel_options.apply(model, False)
    assert all(o == KernelOptions(fused=False) for o in sites(model))


@pytest.mark.parametrize("fused", [None, False])
def test_a_bf16_residual_needs_the_fused_op(fused):
    with pytest.raises(ValueError, match="--low-precision-residual is a setting of the fused LayerNorm op: add "
                                         "--fused-kernels on"):
        RuntimeConfig(fused_kernels=fused, low_precision_residual=True)
    with pytest.raises(ValueError, match="add --fused-kernels on"):
        kernel_options.apply(BertForPreTraining(bert_tiny(vocab_size=100)), fused, low_precision_residual=True)
    assert RuntimeConfig(fused_kernels=True, low_precision_residual=True).low_precision_residual
