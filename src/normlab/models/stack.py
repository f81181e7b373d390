"""A stack of blocks that carries ``(hidden, residual)`` and closes with the final-norm rule.

Every encoder in :mod:`normlab.models` runs its blocks through :class:`Stack`,
so the junction between two blocks, and the final norm, are one fused
add+norm wherever the placement allows (see :mod:`normlab.nn.residual`).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..nn.residual import Carry, add_norm, materialize


class Block(nn.Module):
    """A block of residual units; subclasses define ``step(hidden, residual, mask) -> (hidden, residual)``.

    ``forward(x, mask)`` is the standalone form: the stream in, the stream out.
    """

    def step(self, hidden: torch.Tensor | None, residual: torch.Tensor, mask: torch.Tensor | None = None) -> Carry:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return materialize(*self.step(None, x, key_padding_mask))


class Stack(nn.Module):
    """Owns ``layers`` (blocks) and ``final_norm`` (None where the stack ends normalized).

    ``observer``, when set (diagnostics), is called as ``observer(i, x)`` with the
    stack's input (``i = -1``) and each layer's output stream; it observes only.
    """

    layers: nn.ModuleList
    final_norm: nn.Module | None
    observer: Callable[[int, torch.Tensor], None] | None = None

    def run_layers(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, mask_final_norm: bool = True
                   ) -> torch.Tensor:
        """The blocks, then the final norm (given ``mask`` unless ``mask_final_norm`` is False)."""
        hidden, residual = None, x
        if self.observer is not None:
            self.observer(-1, x)
        for i, layer in enumerate(self.layers):
            hidden, residual = layer.step(hidden, residual, mask)
            if self.observer is not None:
                self.observer(i, materialize(hidden, residual))
        if self.final_norm is None:
            return materialize(hidden, residual)
        return add_norm(hidden, residual, self.final_norm, mask if mask_final_norm else None)[0]
