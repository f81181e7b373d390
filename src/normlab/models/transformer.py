"""TransformerBlock and TransformerEncoder: attention and feed-forward units with one placement."""
from __future__ import annotations

import torch

from ..nn.attention import MultiHeadSelfAttention
from ..nn.feedforward import FeedForward
from ..nn.residual import Carry
from .placement import LayerSpec, init_block, layer_spec
from .stack import Block, SequenceEncoder, check_sizes


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
        spec: set by a :class:`~normlab.models.stack.Stack` (it then initialises
            the block); replaces norm, placement, layer_index, n_layers, init and norm_kw.

    ``forward(hidden, residual=None, mask=None) -> (hidden, residual)``: the
    carry of :mod:`normlab.nn.residual`; ``materialize(*block(x, mask=mask))``
    is the output stream. ``x``: ``(B, T, D)``; ``mask``: bool ``(B, T)``, True = padding.
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
        spec: LayerSpec | None = None,
    ) -> None:
        check_sizes(d_model, n_heads, d_ff, dropout, attn_dropout)
        alone = spec is None
        super().__init__(spec or layer_spec(placement, layer_index, n_layers, dim=d_model, norm=norm,
                                            norm_kw=norm_kw, init=init))
        attn = MultiHeadSelfAttention(d_model, n_heads, dropout if attn_dropout is None else attn_dropout, bias=bias,
                                      causal=causal)
        ffn = FeedForward(d_model, d_ff or 4 * d_model, activation, dropout, bias=bias)
        self.attn = self.spec.unit(attn, dropout=dropout)
        self.ffn = self.spec.unit(ffn, dropout=dropout)
        if alone:
            init_block(self, self.spec)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> Carry:
        self.check_carry(hidden, residual, self.attn.fn.d_model)
        return self.ffn(*self.attn(hidden, residual, mask), mask)


class TransformerEncoder(SequenceEncoder):
    """A stack of :class:`TransformerBlock` with one norm type and one placement.

    Args:
        d_model, n_heads, n_layers, d_ff: sizes (``d_ff`` defaults to ``4 * d_model``).
        norm, placement: names from :mod:`normlab.registry`; a final norm follows
            the stack where the last block is pre-style (``pre``, ``sandwich``, ``mixln``).
        dropout: inside the blocks and after the positional encoding.
        init: ``"torch"`` or ``"xavier"``. norm_kw: extra arguments for the norms.
        input_dim: if given, a linear map from ``input_dim`` features to ``d_model``
            (e.g. 80 filterbank channels).
        pos: ``"sinusoidal"``, ``"learned"`` or ``"none"``; max_len: longest sequence.
        **block_kw: forwarded to every block (activation, attn_dropout, causal, bias).

    Shape:
        ``x``: ``(B, T, input_dim or D)``; ``key_padding_mask``: bool ``(B, T)``,
        True = padding. Output ``(B, T, D)``.
    """

    block = TransformerBlock
