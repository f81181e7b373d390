"""Video token encoder for ``[B, T, N, D]``: joint or divided space-time attention.

* ``joint``: all ``T * N`` tokens attend to each other (one sequence per clip).
* ``divided`` (TimeSformer): per layer, each patch attends over time
  (``[B*N, T, D]``), then each frame's patches attend over space
  (``[B*T, N, D]``), then the feed-forward.

LayerNorm stays per token: it normalizes each token's ``D`` features, whatever
the attention pattern.
"""
from __future__ import annotations

import torch
from torch import nn

from .._checks import BadType, BadValue, check_choice, check_count, check_padding_mask, has_shape
from ..nn.attention import MultiHeadSelfAttention
from ..nn.feedforward import FeedForward
from ..nn.positional import Sinusoids
from ..nn.residual import Carry
from .placement import LayerSpec
from .stack import Block, Stack, check_input_dtype, check_sizes
from .transformer import TransformerBlock

ATTENTIONS = ("joint", "divided")


class FrameAttention(MultiHeadSelfAttention):
    """Self-attention among one frame's patches. A frame is padded whole or not at all, so no key is masked
    here: the frame mask reaches the unit's norms only (a batchnorm leaves padded frames out of its
    statistics). Masking every key of a padded frame would give its patches NaN, and the next time attention
    would carry that NaN into the valid frames (a weight of 0 times NaN)."""

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x)


class DividedBlock(Block):
    """Time attention, space attention and FFN units on ``[B, T, N, D]``; built by :class:`VideoEncoder`."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, *, dropout: float = 0.0,
                 spec: LayerSpec):
        check_sizes(d_model, n_heads, d_ff, dropout)
        super().__init__(spec)
        # dropout on the attention weights, after the FFN's activation and on each branch's output, as the joint
        # mode's TransformerBlock
        self.time = spec.unit(MultiHeadSelfAttention(d_model, n_heads, dropout), dropout=dropout)
        self.space = spec.unit(FrameAttention(d_model, n_heads, dropout), dropout=dropout)
        self.ffn = spec.unit(FeedForward(d_model, d_ff or 4 * d_model, "gelu", dropout), dropout=dropout)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> Carry:
        b, t, n, d = hidden.shape

        def per_patch(v):  # B, T, N, D -> B*N, T, D   one sequence per patch
            return None if v is None else v.transpose(1, 2).reshape(b * n, t, d)

        def per_frame(v):  # B*N, T, D -> B*T, N, D   one sequence per frame
            return None if v is None else v.view(b, n, t, d).transpose(1, 2).reshape(b * t, n, d)

        mt = None if mask is None else mask.repeat_interleave(n, dim=0)  # B*N, T
        mf = None if mask is None else mask.reshape(b * t)  # B*T: a whole frame (its N patches) padded or not
        hidden, residual = self.time(per_patch(hidden), per_patch(residual), mt)
        hidden, residual = self.space(per_frame(hidden), per_frame(residual), mf)
        hidden, residual = self.ffn(hidden, residual, mf)
        return hidden.reshape(b, t, n, d), (None if residual is None else residual.reshape(b, t, n, d))  # B, T, N, D


class VideoEncoder(Stack):
    """Encoder over video tokens ``[B, T, N, D]`` with learned patch and sinusoidal frame positions.

    Args:
        d_model, n_heads, n_layers, d_ff: sizes, as :class:`normlab.TransformerEncoder`.
        n_patches: tokens per frame ``N``. attention: ``"joint"`` or ``"divided"``.
        norm, placement, init, norm_kw: as :class:`normlab.TransformerEncoder`.
        dropout: inside the blocks. max_frames: longest clip.

    Shape:
        ``x``: ``(B, T, N, D)``; ``frame_mask``: bool ``(B, T)``, True = padded frame.
    """

    def __init__(self, d_model: int, n_heads: int, n_layers: int, d_ff: int | None = None, *, n_patches: int,
                 attention: str = "divided", norm: str = "layernorm", placement: str = "pre",
                 dropout: float = 0.0, init: str = "torch", norm_kw: dict | None = None, max_frames: int = 1024):
        check_choice(attention, ATTENTIONS, "attention")
        check_count(n_patches, "n_patches")
        check_count(max_frames, "max_frames")  # (0 built, and every clip was refused at its first forward)
        block = DividedBlock if attention == "divided" else TransformerBlock
        super().__init__(n_layers, lambda spec: block(d_model, n_heads, d_ff, dropout=dropout, spec=spec),
                         dim=d_model, norm=norm, placement=placement, init=init, norm_kw=norm_kw,
                         inputs={"patch_pos": nn.Parameter(torch.randn(n_patches, d_model) * 0.02)})  # N, D
        self.attention, self.n_patches = attention, n_patches
        self.frame_pos = Sinusoids(d_model, max_frames, "max_frames")  # T, D at first use (no buffer, no module)

    def forward(self, x: torch.Tensor, frame_mask: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
            what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise BadType(f"expected a floating-point tensor (B, T, N, D), got {what}")
        d_model = self.patch_pos.shape[1]
        if not has_shape(x, 4, (self.n_patches, d_model)):
            raise BadValue(f"expected input of shape (B, T, {self.n_patches}, {d_model}) (N = {self.n_patches} "
                           f"patches per frame), got {list(x.shape)}")
        check_padding_mask(frame_mask, x)  # (B, T), before any layer reads it
        check_input_dtype(x, self)
        b, t, n, d = x.shape
        x = x + self.patch_pos + self.frame_pos(t, x)[:, None, :]  # B, T, N, D
        if self.attention == "divided":
            return self.run_layers(x, frame_mask)  # B, T, N, D
        mask = None if frame_mask is None else frame_mask.repeat_interleave(n, dim=1)  # B, T*N
        return self.run_layers(x.reshape(b, t * n, d), mask).view(b, t, n, d)  # B, T, N, D
