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
    """``x + PE[:T]`` with a sinusoidal table, a learned table (``table``, a parameter), or nothing.

    The sinusoidal table is no parameter and no buffer: it is made at the first call for each device and dtype
    and kept (a non-persistent buffer was left unset by ``to_empty()`` after a meta-device build, and
    ``load_state_dict`` does not restore one).
    """

    def __init__(self, kind: str, d_model: int, max_len: int = 4096):
        super().__init__()
        check_choice(kind, POSITIONS, "positional encoding")
        self.kind, self.d_model, self.max_len = kind, d_model, max_len
        self.table = nn.Parameter(torch.randn(max_len, d_model) * 0.02) if kind == "learned" else None
        self._sinusoids: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "none":
            return x
        t = x.shape[1]
        if t > self.max_len:
            raise BadValue(f"sequence length {t} exceeds max_len {self.max_len}")
        table = self.table if self.table is not None else self._sinusoid(x)
        return x + table[:t].to(x.dtype)  # B, T, D

    def _sinusoid(self, x: torch.Tensor) -> torch.Tensor:
        key = (x.device, x.dtype)
        table = self._sinusoids.get(key)
        if table is None:
            # made in float32, then cast (the values a float32 buffer cast at each call gave)
            table = sinusoidal_table(self.max_len, self.d_model).to(device=x.device, dtype=x.dtype)  # T, D
            if not (torch.jit.is_tracing() or torch.compiler.is_compiling()):  # tracers record it as ops
                self._sinusoids[key] = table
        return table
