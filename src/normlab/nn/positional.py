"""Positional encodings added to ``[B, T, D]`` inputs."""
from __future__ import annotations

import functools
import math

import torch
from torch import nn

from .._checks import BadValue, check_choice, check_length
from .constants import DeviceConstant

POSITIONS = ("sinusoidal", "learned", "none")


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """Vaswani et al.: ``PE[t, 2i] = sin(t / 10000^(2i/D))``, ``PE[t, 2i+1] = cos(...)``."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]  # T, 1
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))  # D/2
    table = torch.zeros(max_len, d_model)  # T, D
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : d_model // 2]
    return table


class Sinusoids:
    """The sinusoidal table's first rows, made at the first call for each device and dtype and kept
    (:class:`~normlab.nn.constants.DeviceConstant`); no module: nothing to hook."""

    def __init__(self, d_model: int, max_len: int, name: str = "max_len"):
        self.d_model, self.max_len, self.name = d_model, max_len, name  # name: the option that set max_len
        # made in float32, then cast (the values a float32 buffer cast at each call gave)
        self._table = DeviceConstant(functools.partial(sinusoidal_table, max_len, d_model))  # T, D

    def __call__(self, t: int, like: torch.Tensor) -> torch.Tensor:
        """``PE[:t]`` ``(t, D)`` on ``like``'s device, in its dtype."""
        check_length(t, self.max_len, self.name)
        return self._table(like.device, like.dtype)[:t]  # T, D


class PositionalEncoding(nn.Module):
    """``x + PE[:T]`` with a sinusoidal table (:class:`Sinusoids`), a learned table (``table``, a parameter), or
    nothing."""

    def __init__(self, kind: str, d_model: int, max_len: int = 4096):
        super().__init__()
        check_choice(kind, POSITIONS, "positional encoding")
        self.kind, self.d_model, self.max_len = kind, d_model, max_len
        self.table = nn.Parameter(torch.randn(max_len, d_model) * 0.02) if kind == "learned" else None
        self.sinusoids = Sinusoids(d_model, max_len) if kind == "sinusoidal" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "none":
            return x
        t = x.shape[1]
        if self.table is None:
            return x + self.sinusoids(t, x)  # B, T, D
        if t > self.max_len:
            raise BadValue(f"sequence length {t} exceeds max_len {self.max_len}")
        return x + self.table[:t].to(x.dtype)  # B, T, D
