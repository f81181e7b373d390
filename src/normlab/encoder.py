"""TransformerEncoder: input projection, positions, a stack of blocks, final norm."""
from __future__ import annotations

import torch
from torch import nn

from .block import TransformerBlock
from .placement import apply_norm, has_final_norm
from .positional import PositionalEncoding
from .registry import check_placement, make_norm


class TransformerEncoder(nn.Module):
    """A stack of :class:`TransformerBlock` with one norm type and one placement.

    Args:
        d_model, n_heads, n_layers, d_ff: sizes (``d_ff`` defaults to ``4 * d_model``).
        norm, placement: names from :mod:`normlab.registry`; a final norm follows
            the stack where the last block is pre-style (``pre``, ``sandwich``, ``mixln``).
        dropout: inside the blocks and after the positional encoding.
        input_dim: if given, a linear map from ``input_dim`` features to ``d_model``
            (e.g. 80 filterbank channels).
        pos: ``"sinusoidal"``, ``"learned"`` or ``"none"``; max_len: longest sequence.
        **block_kw: forwarded to every block (activation, attn_dropout, causal, init, norm_kw, bias).

    Shape:
        ``x``: ``(B, T, input_dim or D)``; ``key_padding_mask``: bool ``(B, T)``,
        True = padding. Output ``(B, T, D)``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_layers: int,
        d_ff: int | None = None,
        *,
        norm: str = "layernorm",
        placement: str = "pre",
        dropout: float = 0.0,
        input_dim: int | None = None,
        pos: str = "sinusoidal",
        max_len: int = 4096,
        **block_kw,
    ) -> None:
        super().__init__()
        check_placement(placement)
        if n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {n_layers}")
        self.norm_name, self.placement_name = norm, placement
        self.input_proj = nn.Linear(input_dim, d_model) if input_dim else None
        self.pos = PositionalEncoding(pos, d_model, max_len)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, n_heads, d_ff, norm=norm, placement=placement, dropout=dropout,
                             layer_index=i, n_layers=n_layers, **block_kw)
            for i in range(n_layers)
        )
        kw = block_kw.get("norm_kw") or {}
        self.final_norm = make_norm(norm, d_model, **kw) if has_final_norm(placement, n_layers) else None

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.input_proj is not None:
            x = self.input_proj(x)  # B, T, D
        x = self.drop(self.pos(x))  # B, T, D
        for layer in self.layers:
            x = layer(x, key_padding_mask)  # B, T, D
        return apply_norm(self.final_norm, x, key_padding_mask)  # B, T, D
