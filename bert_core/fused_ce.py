"""Linear + cross-entropy for the MLM decoder without materialising all N x V logits (CPU/GPU memory traffic).

`linear_cross_entropy(h, weight, bias, labels)` equals
`F.cross_entropy(F.linear(h, weight, bias), labels, ignore_index=-100, reduction="sum")` and also returns how many
rows the model gets right and how many rows count (label != -100), for accuracy. Rows are processed in chunks whose
logits stay small (cache- and allocator-friendly: a large fresh buffer costs page faults on every step on CPU); the
gradients w.r.t. h, weight and bias are computed in the same pass (softmax - one_hot is available right there) and
only scaled in backward. This is the approach of Liger-Kernel's fused linear cross-entropy, in plain torch ops. It
runs only when gradients are needed, and only on a CPU running eagerly (`BertForPreTraining.mlm_head`): it reads
one flag on the host and loops in Python, which GPUs and `torch.compile` pay for (one GEMM + cross-entropy there).
"""
from __future__ import annotations

import torch

from .losses import IGNORE_INDEX


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, labels: torch.Tensor,
                chunk_rows: int):
        n, cd = h.shape[0], h.dtype  # compute in the activations' dtype (bf16 under autocast), reduce in fp32
        w, b = weight.to(cd), bias.to(cd)
        if cd != torch.float32:
            chunk_rows = max(n, 1)  # one chunk: accumulating the weight gradient across chunks in bf16 loses bits
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(w.shape, dtype=cd, device=w.device)
        grad_b = torch.zeros(b.shape, dtype=torch.float32, device=b.device)
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        correct = torch.zeros((), dtype=torch.long, device=h.device)
        keep = labels != IGNORE_INDEX
        # The one host read: CPU-only code (the GPU and compiled paths use a plain GEMM + cross-entropy instead).
        any_ignored = not bool(keep.all())
        labels = labels.clamp(min=0)
        buf = None  # one logits buffer reused by every chunk (a fresh large buffer costs page faults on CPU)
        for start in range(0, n, chunk_rows):
            hc, yc = h[start:start + chunk_rows], labels[start:start + chunk_rows]
            rows = torch.arange(hc.shape[0], device=h.device)
            if buf is None or buf.shape[0] != hc.shape[0]:
                buf = torch.empty((hc.shape[0], w.shape[0]), dtype=cd, device=h.device)
            logits = torch.addmm(b, hc, w.t(), out=buf).float()  # no copy in fp32
            target = logits[rows, yc]
            top = logits.amax(dim=1)
            # softmax in place: one exp per logit (no separate logsumexp pass), then d(CE)/d logits = p - one_hot.
            probs = logits.sub_(top.unsqueeze(1)).exp_()
            total = probs.sum(dim=1)
            row_loss = top + total.log() - target
            hit = target >= top  # the label's logit is the maximum: argmax == label (up to exact ties)
            grad = probs.div_(total.unsqueeze(1))
            grad[rows, yc] -= 1.0
            if any_ignored:  # padding slots (static shapes): no loss, no gradient, not counted
                kc = keep[start:start + chunk_rows]
                row_loss, hit = row_loss * kc, hit & kc
                grad.mul_(kc.unsqueeze(1))
            loss += row_loss.sum()
            correct += hit.sum()
            grad_b += grad.sum(dim=0)
            g = grad.to(cd)
            grad_h[start:start + chunk_rows] = g @ w
            grad_w.addmm_(g.t(), hc)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = (weight.dtype, bias.dtype)
        count = keep.sum()
        ctx.mark_non_differentiable(correct, count)
        return loss, correct, count

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_correct: torch.Tensor | None, _grad_count=None):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        w_dtype, b_dtype = ctx.dtypes
        return ((grad_h * grad_loss).to(grad_h.dtype), (grad_w.float() * grad_loss).to(w_dtype),
                (grad_b * grad_loss).to(b_dtype), None, None)


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, labels: torch.Tensor,
                         chunk_rows: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sum of CE over rows, number of rows whose label has the highest logit, number of rows with a label).
    Rows labelled -100 are skipped. `correct` is the accuracy numerator without an argmax pass; it differs from
    `(logits.argmax(1) == labels).sum()` only when another class ties the label's logit exactly."""
    return _LinearCrossEntropy.apply(h, weight, bias, labels, chunk_rows)
