"""Position-wise feed-forward: ``fc2(act(fc1(x)))``, or SwiGLU."""
from __future__ import annotations

import torch
import torch.nn.functional as TF
from torch import nn

from .._checks import check_choice, check_flag
from ..kernels.dispatch import exporting, transformed
from .hooks import idle_dropout, plain

ACTIVATIONS = ("gelu", "relu", "swish", "swiglu")


def _fast_inference(x: torch.Tensor, lin: nn.Module) -> bool:
    """True when ``lin(x)`` may skip its module call: ``lin`` is a plain ``nn.Linear`` (``hooks.plain``: no
    subclass, no replaced forward, no hook), autograd records nothing (inference), and no tracer, exporter,
    compiler, ``torch.func`` transform or forward-mode AD is recording (they get the plain ops)."""
    if not plain(lin, nn.Linear):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or lin.weight.requires_grad
                                    or (lin.bias is not None and lin.bias.requires_grad)):
        return False
    return not (exporting() or transformed() or torch.compiler.is_compiling())


def _linear_activation(x: torch.Tensor, lin: nn.Linear, gelu: bool) -> torch.Tensor:
    """``act(lin(x))`` as one GEMM with the bias and relu/gelu (exact, erf) in its epilogue, as torch's fast path does.

    Autograd has no formula for this op: callers use it only where no gradient is recorded. On CPU its gelu is
    the exact one; torch's CUDA epilogue computes the tanh approximation, so gelu runs unfused there.
    """
    if lin.bias is None or not hasattr(torch, "_addmm_activation") or (gelu and x.device.type != "cpu"):
        h = lin(x)
        return TF.gelu(h) if gelu else TF.relu_(h)
    rows = torch._addmm_activation(lin.bias, x.reshape(-1, x.shape[-1]), lin.weight.t(), use_gelu=gelu)  # N, F
    return rows.view(*x.shape[:-1], rows.shape[-1])  # ..., F


class FeedForward(nn.Module):
    """Two linear maps around an activation; ``swiglu`` is ``fc2(silu(fc1 x) * gate x)``.

    Args:
        d_model: ``D``; d_ff: hidden size; activation: one of :data:`ACTIVATIONS`.
        dropout: after the activation. bias: biases on the linear maps.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", dropout: float = 0.0, bias: bool = True):
        super().__init__()
        check_choice(activation, ACTIVATIONS, "activation")
        check_flag(bias, "bias")
        self.activation = activation
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)
        self.gate = nn.Linear(d_model, d_ff, bias=bias) if activation == "swiglu" else None
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.activation in ("relu", "gelu") and _fast_inference(x, self.fc1):
            h = _linear_activation(x, self.fc1, self.activation == "gelu")  # B, T, F   bias+activation fused
        elif self.activation == "relu" and plain(self.fc1, nn.Linear):
            # a plain Linear on rows returns a fresh tensor (not a view), so relu can run in place: no second
            # F-wide tensor, and relu's backward needs only its output (another module in fc1's place may return
            # its input, or a tensor its own backward needs)
            h = self.fc1(x.reshape(-1, x.shape[-1])).relu_().view(*x.shape[:-1], self.fc1.out_features)  # B, T, F
        else:
            h = self.fc1(x)  # B, T, F   (a hook on fc1 keeps its output: no in-place relu on it)
            if self.activation == "relu":
                h = TF.relu(h)
            elif self.activation == "gelu":
                h = TF.gelu(h)
            elif self.activation == "swish":
                h = TF.silu(h)
            else:
                h = TF.silu(h) * self.gate(x)
        if not idle_dropout(self.drop):  # a no-op call skipped
            h = self.drop(h)
        return self.fc2(h)  # B, T, D

    def matrices(self) -> list[nn.Linear]:
        return [m for m in (self.fc1, self.gate, self.fc2) if m is not None]

    def init_groups(self) -> tuple[list[nn.Linear], list[nn.Linear]]:
        """DeepNorm scales the init of every FFN matrix."""
        return [], self.matrices()
