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

from .attention import MultiHeadSelfAttention
from .block import TransformerBlock
from .feedforward import FeedForward
from .placement import Residual, apply_norm, has_final_norm, slots
from .positional import sinusoidal_table
from .registry import check_placement, make_norm


class DividedBlock(nn.Module):
    """Time attention, space attention and FFN units on ``[B, T, N, D]``."""

    def __init__(self, d_model, n_heads, d_ff=None, *, norm="layernorm", placement="pre", dropout=0.0,
                 layer_index=0, n_layers=1):
        super().__init__()
        s = slots(placement, layer_index, n_layers)
        self.time = Residual(MultiHeadSelfAttention(d_model, n_heads, dropout), d_model, norm, s)
        self.space = Residual(MultiHeadSelfAttention(d_model, n_heads, dropout), d_model, norm, s)
        self.ffn = Residual(FeedForward(d_model, d_ff or 4 * d_model, "gelu", dropout), d_model, norm, s)

    def forward(self, x: torch.Tensor, frame_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, n, d = x.shape
        xt = x.transpose(1, 2).reshape(b * n, t, d)  # B*N, T, D   one sequence per patch
        mt = None if frame_mask is None else frame_mask.repeat_interleave(n, dim=0)  # B*N, T
        x = self.time(xt, mt).view(b, n, t, d).transpose(1, 2)  # B, T, N, D
        x = self.space(x.reshape(b * t, n, d)).view(b, t, n, d)  # B, T, N, D
        return self.ffn(x)  # B, T, N, D


class VideoEncoder(nn.Module):
    """Encoder over video tokens ``[B, T, N, D]`` with learned patch and sinusoidal frame positions.

    Args:
        d_model, n_heads, n_layers, d_ff: sizes. n_patches: tokens per frame ``N``.
        attention: ``"joint"`` or ``"divided"``. norm, placement: registry names.
        max_frames: longest clip.

    Shape:
        ``x``: ``(B, T, N, D)``; ``frame_mask``: bool ``(B, T)``, True = padded frame.
    """

    def __init__(self, d_model: int, n_heads: int, n_layers: int, n_patches: int, d_ff: int | None = None, *,
                 attention: str = "divided", norm: str = "layernorm", placement: str = "pre",
                 dropout: float = 0.0, max_frames: int = 1024):
        super().__init__()
        check_placement(placement)
        if attention not in ("joint", "divided"):
            raise ValueError(f"unknown attention {attention!r}; valid: joint, divided")
        self.attention, self.n_patches = attention, n_patches
        self.patch_pos = nn.Parameter(torch.randn(n_patches, d_model) * 0.02)  # N, D
        self.register_buffer("frame_pos", sinusoidal_table(max_frames, d_model), persistent=False)  # T, D
        block = DividedBlock if attention == "divided" else TransformerBlock
        self.layers = nn.ModuleList(
            block(d_model, n_heads, d_ff, norm=norm, placement=placement, dropout=dropout, layer_index=i,
                  n_layers=n_layers)
            for i in range(n_layers)
        )
        self.final_norm = make_norm(norm, d_model) if has_final_norm(placement, n_layers) else None

    def forward(self, x: torch.Tensor, frame_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, n, d = x.shape
        if n != self.n_patches:
            raise ValueError(f"expected {self.n_patches} patches per frame, got input of shape {list(x.shape)}")
        x = x + self.patch_pos + self.frame_pos[:t, None, :].to(x.dtype)  # B, T, N, D
        if self.attention == "joint":
            mask = None if frame_mask is None else frame_mask.repeat_interleave(n, dim=1)  # B, T*N
            h = x.reshape(b, t * n, d)  # B, T*N, D
            for layer in self.layers:
                h = layer(h, mask)
            x = h.view(b, t, n, d)
        else:
            for layer in self.layers:
                x = layer(x, frame_mask)
        return apply_norm(self.final_norm, x, None)  # B, T, N, D
