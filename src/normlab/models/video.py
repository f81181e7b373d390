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

from .._checks import BadValue, check_choice
from ..nn.attention import MultiHeadSelfAttention
from ..nn.feedforward import FeedForward
from ..nn.positional import Sinusoids
from ..nn.residual import Carry
from .placement import LayerSpec
from .stack import Block, Stack
from .transformer import TransformerBlock

ATTENTIONS = ("joint", "divided")


class DividedBlock(Block):
    """Time attention, space attention and FFN units on ``[B, T, N, D]``; built by :class:`VideoEncoder`."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, *, dropout: float = 0.0,
                 spec: LayerSpec):
        super().__init__(spec)
        self.time = spec.unit(MultiHeadSelfAttention(d_model, n_heads, dropout))
        self.space = spec.unit(MultiHeadSelfAttention(d_model, n_heads, dropout))
        self.ffn = spec.unit(FeedForward(d_model, d_ff or 4 * d_model, "gelu", dropout))

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> Carry:
        b, t, n, d = hidden.shape

        def per_patch(v):  # B, T, N, D -> B*N, T, D   one sequence per patch
            return None if v is None else v.transpose(1, 2).reshape(b * n, t, d)

        def per_frame(v):  # B*N, T, D -> B*T, N, D   one sequence per frame
            return None if v is None else v.view(b, n, t, d).transpose(1, 2).reshape(b * t, n, d)

        mt = None if mask is None else mask.repeat_interleave(n, dim=0)  # B*N, T
        hidden, residual = self.time(per_patch(hidden), per_patch(residual), mt)
        hidden, residual = self.space(per_frame(hidden), per_frame(residual))
        hidden, residual = self.ffn(hidden, residual)
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
        block = DividedBlock if attention == "divided" else TransformerBlock
        super().__init__(n_layers, lambda spec: block(d_model, n_heads, d_ff, dropout=dropout, spec=spec),
                         dim=d_model, norm=norm, placement=placement, init=init, norm_kw=norm_kw,
                         inputs={"patch_pos": nn.Parameter(torch.randn(n_patches, d_model) * 0.02)})  # N, D
        self.attention, self.n_patches = attention, n_patches
        self.frame_pos = Sinusoids(d_model, max_frames, "max_frames")  # T, D at first use (no buffer, no module)

    def forward(self, x: torch.Tensor, frame_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, n, d = x.shape
        if n != self.n_patches:
            raise BadValue(f"expected {self.n_patches} patches per frame, got input of shape {list(x.shape)}")
        x = x + self.patch_pos + self.frame_pos(t, x)[:, None, :]  # B, T, N, D
        if self.attention == "divided":
            return self.run_layers(x, frame_mask, mask_final_norm=False)  # B, T, N, D
        mask = None if frame_mask is None else frame_mask.repeat_interleave(n, dim=1)  # B, T*N
        return self.run_layers(x.reshape(b, t * n, d), mask, mask_final_norm=False).view(b, t, n, d)  # B, T, N, D
