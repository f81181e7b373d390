"""Position-wise feed-forward: ``fc2(act(fc1(x)))``, or SwiGLU."""
from __future__ import annotations

import torch
import torch.nn.functional as TF
from torch import nn

from .._checks import check_choice

ACTIVATIONS = ("gelu", "relu", "swish", "swiglu")


class FeedForward(nn.Module):
    """Two linear maps around an activation; ``swiglu`` is ``fc2(silu(fc1 x) * gate x)``.

    Args:
        d_model: ``D``; d_ff: hidden size; activation: one of :data:`ACTIVATIONS`.
        dropout: after the activation. bias: biases on the linear maps.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", dropout: float = 0.0, bias: bool = True):
        super().__init__()
        check_choice(activation, ACTIVATIONS, "activation")
        self.activation = activation
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)
        self.gate = nn.Linear(d_model, d_ff, bias=bias) if activation == "swiglu" else None
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.fc1(x)  # B, T, F
        if self.activation == "gelu":
            h = TF.gelu(h)
        elif self.activation == "relu":
            h = TF.relu(h)
        elif self.activation == "swish":
            h = TF.silu(h)
        else:
            h = TF.silu(h) * self.gate(x)
        return self.fc2(self.drop(h))  # B, T, D

    def matrices(self) -> list[nn.Linear]:
        return [m for m in (self.fc1, self.gate, self.fc2) if m is not None]

    def init_groups(self) -> tuple[list[nn.Linear], list[nn.Linear]]:
        """DeepNorm scales the init of every FFN matrix."""
        return [], self.matrices()
