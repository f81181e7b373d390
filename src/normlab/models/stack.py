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


def compile_blocks(model: nn.Module, **compile_kw) -> nn.Module:
    """Opt-in: compile every block of every :class:`Stack` in ``model`` with ``torch.compile``; returns ``model``.

    Each block's ``step`` (the whole block: its norms, fused add+norms,
    attention and feed-forward) becomes one compiled graph, so inductor fuses
    the element-wise work between the GEMMs; the norms inside run normlab's
    fused math (see :mod:`normlab.kernels.dispatch`). Weights, ``state_dict``
    and outputs are unchanged (within float rounding). The first call of each
    shape compiles (seconds to minutes); a compiled model cannot be pickled
    or deep-copied. ``compile_kw`` goes to ``torch.compile`` (e.g. ``dynamic=False``).
    """
    for stack in [m for m in model.modules() if isinstance(m, Stack)]:
        for layer in stack.layers:
            if not getattr(layer, "_normlab_compiled", False):
                layer.step = torch.compile(layer.step, **compile_kw)  # an instance attribute shadows the method
                layer._normlab_compiled = True
    return model
