"""Conformer block (Gulati et al. 2020) built from pre-norm residual units.

``x + 1/2 FFN(LN x)``, ``+ MHSA(LN x)``, ``+ Conv(LN x)``, ``+ 1/2 FFN(LN x)``,
then a final LayerNorm. The convolution module is pointwise conv + GLU,
depthwise conv, a norm (BatchNorm in the paper, over valid frames only),
Swish and a pointwise conv; padded frames are zeroed before the depthwise
conv so they never leak into valid ones.
"""
from __future__ import annotations

import torch
import torch.nn.functional as TF
from torch import nn

from .._checks import BadValue
from ..nn.attention import MultiHeadSelfAttention
from ..nn.feedforward import FeedForward
from ..nn.residual import Carry, add_norm, apply_norm
from ..registry import make_norm
from .placement import LayerSpec, init_block, layer_spec
from .stack import Block, SequenceEncoder, check_sizes


class ConvModule(nn.Module):
    """pointwise(2D) -> GLU -> depthwise(k) -> norm -> Swish -> pointwise -> dropout."""

    def __init__(self, d_model: int, kernel_size: int = 15, dropout: float = 0.0, norm: str = "batchnorm"):
        super().__init__()
        if isinstance(kernel_size, bool) or not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
            raise BadValue(f"kernel_size must be an odd whole number >= 1 (same-length output), got {kernel_size!r}")
        self.pointwise_in = nn.Linear(d_model, 2 * d_model)
        self.depthwise = nn.Conv1d(d_model, d_model, kernel_size, padding=kernel_size // 2, groups=d_model)
        self.conv_norm = make_norm(norm, d_model)
        self.pointwise_out = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[1] == 0:  # no frames: nothing to convolve (a convolution refuses an input shorter than its kernel)
            return self.drop(self.pointwise_out(x))  # B, 0, D
        h = TF.glu(self.pointwise_in(x), dim=-1)  # B, T, D
        if key_padding_mask is not None:
            h = h.masked_fill(key_padding_mask[..., None], 0.0)  # padded frames contribute nothing
        h = self.depthwise(h.transpose(1, 2)).transpose(1, 2)  # B, T, D
        h = TF.silu(apply_norm(self.conv_norm, h, key_padding_mask))  # B, T, D
        return self.drop(self.pointwise_out(h))  # B, T, D

    def init_groups(self) -> tuple[list[nn.Linear], list[nn.Linear]]:
        """Like the FFN: DeepNorm scales both pointwise maps (the depthwise filter keeps torch's init)."""
        return [], [self.pointwise_in, self.pointwise_out]


class ConformerBlock(Block):
    """One Conformer block: ``ffn1``, ``attn``, ``conv``, ``ffn2`` units and the block's final norm.

    With ``placement="pre"`` (the paper) every unit is ``x + F(LN x)`` (the FFNs
    half-step) and the block ends with a LayerNorm. Other placements fill the
    units' slots by the same rules as :class:`normlab.TransformerBlock`; the
    block ends with a norm only where its units are pre-style.

    Args:
        d_model, n_heads: sizes. d_ff: FFN hidden size (default ``4 * d_model``).
        kernel_size: depthwise convolution width (odd). dropout: on every branch.
        attn_dropout: on attention probabilities only, if given (default: ``dropout``).
        norm: the residual units' norm (``layernorm`` in the paper).
        placement: a name in :data:`normlab.registry.PLACEMENTS` (``pre`` in the paper).
        conv_norm: the norm inside the convolution module (``batchnorm`` in the paper).
        layer_index, n_layers: where this block sits (mixln, deepnorm and admin need them).
        init: ``"torch"`` or ``"xavier"``. norm_kw: extra arguments for the units' norms.
        spec: set by a :class:`~normlab.models.stack.Stack`, as for :class:`~normlab.TransformerBlock`.

    ``forward(hidden, residual=None, mask=None) -> (hidden, residual)``, the carry of :mod:`normlab.nn.residual`.
    """

    self_closing = True

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, *, kernel_size: int = 15,
                 dropout: float = 0.0, attn_dropout: float | None = None, norm: str = "layernorm",
                 placement: str = "pre", conv_norm: str = "batchnorm", layer_index: int = 0, n_layers: int = 1,
                 init: str = "torch", norm_kw: dict | None = None, spec: LayerSpec | None = None):
        check_sizes(d_model, n_heads, d_ff, dropout, attn_dropout)
        alone = spec is None
        super().__init__(spec or layer_spec(placement, layer_index, n_layers, dim=d_model, norm=norm,
                                            norm_kw=norm_kw, init=init))
        s, d_ff = self.spec, d_ff or 4 * d_model
        # dropout after the FFNs' activation and on the FFN and attention branches' outputs (the paper's; the
        # convolution module ends with its own)
        self.ffn1 = s.unit(FeedForward(d_model, d_ff, "swish", dropout), scale=0.5, dropout=dropout)
        self.attn = s.unit(MultiHeadSelfAttention(d_model, n_heads, dropout if attn_dropout is None else attn_dropout),
                           dropout=dropout)
        self.conv = s.unit(ConvModule(d_model, kernel_size, dropout, conv_norm))
        self.ffn2 = s.unit(FeedForward(d_model, d_ff, "swish", dropout), scale=0.5, dropout=dropout)
        self.final_norm = s.make_norm() if s.slots.pre else None
        if alone:
            init_block(self, self.spec)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> Carry:
        self.check_carry(hidden, residual, self.attn.fn.d_model)
        for unit in (self.ffn1, self.attn, self.conv, self.ffn2):
            hidden, residual = unit(hidden, residual, mask)  # B, T, D
        if self.final_norm is None:
            return hidden, residual
        return add_norm(hidden, residual, self.final_norm, mask)[0], None


class ConformerEncoder(SequenceEncoder):
    """Optional input projection, sinusoidal positions, ``n_layers`` Conformer blocks.

    The signature is :class:`normlab.TransformerEncoder`'s (``input_dim`` is a
    keyword); ``**block_kw`` goes to every :class:`ConformerBlock`
    (``kernel_size``, ``conv_norm``, ``attn_dropout``). Every block closes
    itself, so the stack needs no final norm.

    Shape: ``x`` ``(B, T, input_dim or D)``, mask bool ``(B, T)`` (True = padding) -> ``(B, T, D)``.
    """

    block = ConformerBlock
