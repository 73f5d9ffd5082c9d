"""--fused-kernels / --low-precision-residual reach every one of bert_core's kernel sites."""
from bert_core import BertForPreTraining, bert_tiny
from bert_core.kernels import DEFAULT, KernelOptions
from pretraining import kernel_options


def sites(model):
    return [m.kernels for m in model.modules() if isinstance(getattr(m, "kernels", None), KernelOptions)]


def test_kernel_options_reach_every_site():
    model = BertForPreTraining(bert_tiny(vocab_size=100))
    kernel_options.apply(model, None)  # bert_core's default: nothing set
    assert sites(model) and all(o == DEFAULT for o in sites(model))
    kernel_options.apply(model, False, low_precision_residual=True)
    assert all(o == KernelOptions(fused=False, low_precision_residual=True) for o in sites(model))
