"""Positional encodings added to ``[B, T, D]`` inputs."""
from __future__ import annotations

import math

import torch
from torch import nn

from .._checks import BadValue, check_choice

POSITIONS = ("sinusoidal", "learned", "none")


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """Vaswani et al.: ``PE[t, 2i] = sin(t / 10000^(2i/D))``, ``PE[t, 2i+1] = cos(...)``."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]  # T, 1
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))  # D/2
    table = torch.zeros(max_len, d_model)  # T, D
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : d_model // 2]
    return table


class PositionalEncoding(nn.Module):
    """``x + PE[:T]`` with a sinusoidal table, a learned table, or nothing."""

    def __init__(self, kind: str, d_model: int, max_len: int = 4096):
        super().__init__()
        check_choice(kind, POSITIONS, "positional encoding")
        self.kind, self.max_len = kind, max_len
        if kind == "sinusoidal":
            self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)
        elif kind == "learned":
            self.table = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        else:
            self.table = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.table is None:
            return x
        t = x.shape[1]
        if t > self.max_len:
            raise BadValue(f"sequence length {t} exceeds max_len {self.max_len}")
        return x + self.table[:t].to(x.dtype)  # B, T, D
