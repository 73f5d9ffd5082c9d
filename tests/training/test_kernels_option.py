"""--fused-kernels / --low-precision-residual reach bert_core's kernel sites, or fail with the fix where this tree
or this machine cannot honour them."""
import pytest

from bert_core import BertForPreTraining, bert_tiny
from training import kernels


def test_kernel_options_reach_every_site_or_fail_clearly():
    model = BertForPreTraining(bert_tiny(vocab_size=100))
    kernels.apply(model, None)  # bert_core's default: nothing to set
    if not kernels.available():
        with pytest.raises(ValueError, match="no fused kernels"):
            kernels.apply(model, True)
        kernels.apply(model, False)  # never fused: nothing to do either
        return
    from bert_core.kernels import KernelOptions

    kernels.apply(model, False, low_precision_residual=True)
    sites = [m.kernels for m in model.modules() if isinstance(getattr(m, "kernels", None), KernelOptions)]
    assert sites and all(o == KernelOptions(fused=False, low_precision_residual=True) for o in sites)
