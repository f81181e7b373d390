"""TransformerBlock and TransformerEncoder: attention and feed-forward units with one placement."""
from __future__ import annotations

import torch
from torch import nn

from .._checks import BadValue
from ..nn.attention import MultiHeadSelfAttention
from ..nn.feedforward import FeedForward
from ..nn.positional import PositionalEncoding
from ..nn.residual import Carry, ResidualUnit
from .placement import check_init, final_norm, init_block, layer_placement, slots
from .stack import Block, Stack


class TransformerBlock(Block):
    """One encoder layer: ``attn`` unit then ``ffn`` unit, norms placed by ``placement``.

    Args:
        d_model: ``D``. n_heads: attention heads. d_ff: FFN hidden size (default ``4 * D``).
        norm: a name in :data:`normlab.registry.NORMS`. placement: a name in
            :data:`normlab.registry.PLACEMENTS`.
        dropout: on attention probabilities, FFN hidden and each branch output.
        attn_dropout: on attention probabilities only, if given (default: ``dropout``);
            0 keeps the fused attention kernel and skips a ``(B, H, T, T)`` random mask.
        activation: FFN activation (``gelu``, ``relu``, ``swish``, ``swiglu``).
        causal: mask future positions. bias: biases in the linear maps.
        layer_index, n_layers: where this block sits (mixln, deepnorm and admin need them).
        init: ``"torch"`` (torch's defaults) or ``"xavier"`` (Xavier-normal, zero biases).
        norm_kw: extra arguments for the norms (e.g. ``{"eps": 1e-12}``).

    Shape:
        ``x``: ``(B, T, D)``; ``key_padding_mask``: bool ``(B, T)``, True = padding.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        *,
        norm: str = "layernorm",
        placement: str = "pre",
        dropout: float = 0.0,
        attn_dropout: float | None = None,
        activation: str = "gelu",
        causal: bool = False,
        bias: bool = True,
        layer_index: int = 0,
        n_layers: int = 1,
        init: str = "torch",
        norm_kw: dict | None = None,
    ) -> None:
        super().__init__()
        check_init(init)
        self.placement = layer_placement(placement, layer_index, n_layers)
        s = slots(placement, layer_index, n_layers)
        attn = MultiHeadSelfAttention(d_model, n_heads, dropout if attn_dropout is None else attn_dropout, bias=bias,
                                      causal=causal)
        ffn = FeedForward(d_model, d_ff or 4 * d_model, activation, dropout, bias=bias)
        self.attn = ResidualUnit(attn, d_model, norm, s, dropout=dropout, norm_kw=norm_kw)
        self.ffn = ResidualUnit(ffn, d_model, norm, s, dropout=dropout, norm_kw=norm_kw)
        init_block(self, placement, n_layers, init)

    def step(self, hidden: torch.Tensor | None, residual: torch.Tensor, mask: torch.Tensor | None = None) -> Carry:
        return self.ffn.step(*self.attn.step(hidden, residual, mask), mask)


class TransformerEncoder(Stack):
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
        if n_layers < 1:
            raise BadValue(f"n_layers must be >= 1, got {n_layers}")
        layer_placement(placement, 0, n_layers)  # a clear error before anything is built
        self.norm_name, self.placement_name = norm, placement
        self.input_proj = nn.Linear(input_dim, d_model) if input_dim else None
        self.pos = PositionalEncoding(pos, d_model, max_len)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, n_heads, d_ff, norm=norm, placement=placement, dropout=dropout,
                             layer_index=i, n_layers=n_layers, **block_kw)
            for i in range(n_layers)
        )
        self.final_norm = final_norm(norm, d_model, placement, n_layers, block_kw.get("norm_kw"))

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.input_proj is not None:
            x = self.input_proj(x)  # B, T, D
        x = self.drop(self.pos(x))  # B, T, D
        return self.run_layers(x, key_padding_mask)  # B, T, D
