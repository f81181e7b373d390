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

from .attention import MultiHeadSelfAttention
from .feedforward import FeedForward
from .placement import Residual, apply_norm, slots
from .positional import PositionalEncoding
from .registry import make_norm


class ConvModule(nn.Module):
    """pointwise(2D) -> GLU -> depthwise(k) -> norm -> Swish -> pointwise -> dropout."""

    def __init__(self, d_model: int, kernel_size: int = 15, dropout: float = 0.0, norm: str = "batchnorm"):
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd (same-length output), got {kernel_size}")
        self.pointwise_in = nn.Linear(d_model, 2 * d_model)
        self.depthwise = nn.Conv1d(d_model, d_model, kernel_size, padding=kernel_size // 2, groups=d_model)
        self.conv_norm = make_norm(norm, d_model)
        self.pointwise_out = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = TF.glu(self.pointwise_in(x), dim=-1)  # B, T, D
        if key_padding_mask is not None:
            h = h.masked_fill(key_padding_mask[..., None], 0.0)  # padded frames contribute nothing
        h = self.depthwise(h.transpose(1, 2)).transpose(1, 2)  # B, T, D
        h = TF.silu(apply_norm(self.conv_norm, h, key_padding_mask))  # B, T, D
        return self.drop(self.pointwise_out(h))  # B, T, D


class ConformerBlock(nn.Module):
    """One Conformer block; ``norm`` fills every pre-norm slot and the final norm.

    Args:
        d_model, n_heads: sizes. d_ff: FFN hidden size (default ``4 * d_model``).
        kernel_size: depthwise convolution width (odd). dropout: on every branch.
        norm: the residual units' norm (``layernorm`` in the paper).
        conv_norm: the norm inside the convolution module (``batchnorm`` in the paper).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, *, kernel_size: int = 15,
                 dropout: float = 0.0, norm: str = "layernorm", conv_norm: str = "batchnorm"):
        super().__init__()
        pre = slots("pre")
        d_ff = d_ff or 4 * d_model
        self.ffn1 = Residual(FeedForward(d_model, d_ff, "swish", dropout), d_model, norm, pre, scale=0.5)
        self.attn = Residual(MultiHeadSelfAttention(d_model, n_heads, dropout), d_model, norm, pre)
        self.conv = Residual(ConvModule(d_model, kernel_size, dropout, conv_norm), d_model, norm, pre)
        self.ffn2 = Residual(FeedForward(d_model, d_ff, "swish", dropout), d_model, norm, pre, scale=0.5)
        self.final_norm = make_norm(norm, d_model)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        for unit in (self.ffn1, self.attn, self.conv, self.ffn2):
            x = unit(x, key_padding_mask)  # B, T, D
        return apply_norm(self.final_norm, x, key_padding_mask)  # B, T, D


class ConformerEncoder(nn.Module):
    """Input projection, sinusoidal positions, ``n_layers`` Conformer blocks.

    Shape: ``x`` ``(B, T, input_dim)``, mask bool ``(B, T)`` (True = padding) -> ``(B, T, D)``.
    """

    def __init__(self, input_dim: int, d_model: int, n_heads: int, n_layers: int, **block_kw):
        super().__init__()
        self.input_proj = nn.Linear(input_dim, d_model)
        self.pos = PositionalEncoding("sinusoidal", d_model)
        self.layers = nn.ModuleList(ConformerBlock(d_model, n_heads, **block_kw) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.pos(self.input_proj(x))  # B, T, D
        for layer in self.layers:
            x = layer(x, key_padding_mask)
        return x
