"""BatchNorm over the feature dim of sequences, ignoring padded frames.

The lessons' foil: statistics over batch x time per feature, so one frame's
output depends on every other valid frame in the batch (in training mode).
"""
from __future__ import annotations

import torch
from torch import nn

from ._checks import BadValue, acc_dtype, check_count, check_eps, check_input, check_padding_mask
from .kernels.dispatch import values_known


class MaskedBatchNorm(nn.Module):
    r"""BatchNorm for ``[..., D]`` features with an optional padding mask.

    Training: ``mean``/``var`` per feature over every valid frame of the batch
    (biased variance for normalizing, unbiased for the running estimate, as
    ``torch.nn.BatchNorm1d``). Evaluation: the running statistics, so each
    frame is then normalized alone. Parameter and buffer names match torch's
    BatchNorm.

    Args:
        num_features: ``D``.
        eps: added to the variance. momentum: running-statistics update rate; None: a cumulative average
            of every batch seen (torch's convention).
    """

    needs_mask = True

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, device=None, dtype=None):
        super().__init__()
        check_count(num_features, "num_features")
        check_eps(eps)
        if momentum is not None and (isinstance(momentum, bool)
                                     or not (isinstance(momentum, (int, float)) and 0 <= momentum <= 1)):
            raise BadValue(f"momentum must be a number in [0, 1] or None (a cumulative average), got {momentum!r}")
        fk = {"device": device, "dtype": dtype}
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = nn.Parameter(torch.ones(num_features, **fk))
        self.bias = nn.Parameter(torch.zeros(num_features, **fk))
        self.register_buffer("running_mean", torch.zeros(num_features, **fk))
        self.register_buffer("running_var", torch.ones(num_features, **fk))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long, device=device))

    def reset_running_stats(self) -> None:
        """Running mean 0, running variance 1, no batch tracked (as ``torch.nn.BatchNorm1d``)."""
        self.running_mean.zero_()
        self.running_var.fill_(1)
        self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        """The running statistics reset, weight 1, bias 0: what a module built on the meta device, then
        ``to_empty()``, needs before use (as ``torch.nn.BatchNorm1d``)."""
        self.reset_running_stats()
        with torch.no_grad():
            self.weight.fill_(1)
            self.bias.zero_()

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x``: ``(..., D)``; ``padding_mask``: bool ``x.shape[:-1]`` or a prefix of it, True = padding."""
        check_input(x, (self.num_features,))  # before the running statistics move
        check_padding_mask(padding_mask, x, prefix=True)  # in eval too: a model must not fail at its first step
        if not self.training:
            mean, var = self.running_mean, self.running_var
        else:
            xa = x.to(acc_dtype(x.dtype)).reshape(-1, self.num_features)  # M, D  every frame
            valid = torch.ones(xa.shape[0], 1, dtype=torch.bool, device=x.device)  # M, 1
            if padding_mask is not None:
                m = padding_mask.reshape(*padding_mask.shape, *([1] * (x.dim() - 1 - padding_mask.dim())))
                valid = (~m).expand(x.shape[:-1]).reshape(-1, 1)  # M, 1
            count = valid.sum().to(xa.dtype)
            # the check reads the count's value, which a trace cannot (torch.compile, export, make_fx refused the model)
            if values_known(count) and count < 2:
                raise BadValue("MaskedBatchNorm in training needs at least 2 valid frames per batch")
            # padded frames are replaced by 0 before anything reads them, not multiplied by 0: a NaN or inf there
            # (attention over a fully padded row gives NaN) would survive a product, forward or backward, and
            # reach every feature's statistics and the weights' gradients. Their outputs are then finite values
            # of no meaning, which nothing downstream reads
            xa = torch.where(valid, xa, xa.new_zeros(()))  # M, D
            mean = xa.sum(0) / count  # D
            var = torch.where(valid, (xa - mean) ** 2, xa.new_zeros(())).sum(0) / count  # D   biased
            x = xa.reshape(x.shape).to(x.dtype)
            with torch.no_grad():
                self.num_batches_tracked += 1
                rate = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), rate)
                unbiased = var * count / (count - 1)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), rate)
        y = (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"
